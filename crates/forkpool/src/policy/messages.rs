//! Which reports a child of each dispatch mode can honestly send, as a
//! pure rule. A report its mode never produces is a lie (a made-up `B`
//! would count a connection that never existed and grow the pool; a
//! stream of `M` would count futile wake-ups that never happened), so it
//! is a protocol violation like a malformed message.

use crate::config::DispatchMode;
use crate::protocol::ChildMessage;

/// Whether a child in `mode` can send `msg`; if not, why not, for the log.
pub(crate) fn mode_allows(mode: DispatchMode, msg: &ChildMessage) -> Result<(), String> {
    // Kernel dispatch children report nothing per connection (the
    // scoreboard says it); `I` is only the wake-up the supervisor asks for.
    let child_accepts = !matches!(mode, DispatchMode::Handoff | DispatchMode::Kernel);
    let (letter, allowed) = match msg {
        ChildMessage::Busy => ("B", child_accepts),
        ChildMessage::Missed => ("M", child_accepts),
        // Only a handoff child that holds the listeners takes the next
        // connection itself.
        ChildMessage::Next => ("N", matches!(mode, DispatchMode::Handoff)),
        _ => ("", true),
    };
    if allowed {
        Ok(())
    } else {
        Err(format!(
            "sent {letter}, which a child in {} dispatch never sends",
            mode.name()
        ))
    }
}

/// A Pong must answer a ping not answered before: sequence numbers only
/// grow, so a `seq` at or below the last one answered is a repeat.
pub(crate) fn pong_is_new(seq: u32, answered_up_to: u32) -> Result<(), String> {
    if seq > answered_up_to {
        Ok(())
    } else {
        Err(format!(
            "sent pong {seq} again (pings up to {answered_up_to} were already answered)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handoff_children_never_accept_and_others_never_take_next() {
        let h = DispatchMode::Handoff;
        assert!(mode_allows(h, &ChildMessage::Busy).is_err());
        assert!(mode_allows(h, &ChildMessage::Missed).is_err());
        assert!(mode_allows(h, &ChildMessage::Next).is_ok());
        assert!(mode_allows(h, &ChildMessage::Idle).is_ok());
        for mode in [DispatchMode::Order, DispatchMode::Shared] {
            assert!(mode_allows(mode, &ChildMessage::Busy).is_ok());
            assert!(mode_allows(mode, &ChildMessage::Missed).is_ok());
            assert!(mode_allows(mode, &ChildMessage::Next).is_err());
        }
        let k = DispatchMode::Kernel;
        for msg in [ChildMessage::Busy, ChildMessage::Missed, ChildMessage::Next] {
            assert!(mode_allows(k, &msg).is_err(), "{msg:?}");
        }
        assert!(mode_allows(k, &ChildMessage::Idle).is_ok());
        let why = mode_allows(h, &ChildMessage::Missed).unwrap_err();
        assert!(why.contains("M") && why.contains("handoff"), "{why}");
    }

    #[test]
    fn each_ping_is_answered_once() {
        assert!(pong_is_new(1, 0).is_ok());
        assert!(pong_is_new(1, 1).is_err());
        assert!(pong_is_new(7, 9).is_err());
        assert!(pong_is_new(10, 9).is_ok());
    }
}
