//! Which reports a child of each dispatch mode can honestly send, as a
//! pure rule. A report its mode never produces is a lie (a made-up `B`
//! would count a connection that never existed and grow the pool; a
//! stream of `M` would count futile wake-ups that never happened), so it
//! is a protocol violation like a malformed message.

use crate::config::DispatchMode;
use crate::protocol::ChildMessage;

/// Whether a child in `mode` can send `msg`; if not, why not, for the log.
/// `on_board`: a `kernel` child that keeps its record on the scoreboard
/// (it said `K`); `by_messages`: one that accepts on the sockets it holds
/// by itself, as many at once as its runtime does, and says busy and idle
/// in messages (it said `G`: `kernel`, `order` or `shared`); one that said
/// `R` is served, and reports, as in `handoff`.
pub(crate) fn mode_allows(
    mode: DispatchMode,
    on_board: bool,
    by_messages: bool,
    msg: &ChildMessage,
) -> Result<(), String> {
    // Kernel dispatch children on the board report nothing per connection
    // (the scoreboard says it); `I` is only the wake-up the supervisor
    // asks for. A `G` child accepts by itself and says so, and is never
    // told to accept, so it never misses.
    let kernel = mode == DispatchMode::Kernel;
    let child_accepts = !matches!(mode, DispatchMode::Handoff | DispatchMode::Kernel);
    let takes_next = mode == DispatchMode::Handoff || (kernel && !on_board) || by_messages;
    let (letter, allowed) = match msg {
        ChildMessage::Busy => ("B", child_accepts || by_messages),
        ChildMessage::Missed => ("M", child_accepts && !by_messages),
        // Only a handoff child that holds the listeners takes the next
        // connection itself (and a `G` child, as it holds several).
        ChildMessage::Next => ("N", takes_next),
        ChildMessage::ReadyOnBoard { .. } => ("K", kernel),
        ChildMessage::ReadyByMessages { .. } => ("G", kernel || child_accepts),
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
        assert!(mode_allows(h, false, false, &ChildMessage::Busy).is_err());
        assert!(mode_allows(h, false, false, &ChildMessage::Missed).is_err());
        assert!(mode_allows(h, false, false, &ChildMessage::Next).is_ok());
        assert!(mode_allows(h, false, false, &ChildMessage::Idle).is_ok());
        for mode in [DispatchMode::Order, DispatchMode::Shared] {
            assert!(mode_allows(mode, false, false, &ChildMessage::Busy).is_ok());
            assert!(mode_allows(mode, false, false, &ChildMessage::Missed).is_ok());
            assert!(mode_allows(mode, false, false, &ChildMessage::Next).is_err());
        }
        let k = DispatchMode::Kernel;
        for msg in [ChildMessage::Busy, ChildMessage::Missed, ChildMessage::Next] {
            assert!(mode_allows(k, true, false, &msg).is_err(), "{msg:?}");
        }
        assert!(mode_allows(k, true, false, &ChildMessage::Idle).is_ok());
        let why = mode_allows(h, false, false, &ChildMessage::Missed).unwrap_err();
        assert!(why.contains("M") && why.contains("handoff"), "{why}");
    }

    #[test]
    fn only_kernel_children_keep_the_board_and_the_others_report_as_in_handoff() {
        let on_board = ChildMessage::ReadyOnBoard { pid: 7 };
        assert!(mode_allows(DispatchMode::Kernel, false, false, &on_board).is_ok());
        for mode in [
            DispatchMode::Handoff,
            DispatchMode::Order,
            DispatchMode::Shared,
        ] {
            let why = mode_allows(mode, false, false, &on_board).unwrap_err();
            assert!(why.contains('K'), "{why}");
        }
        // A kernel child that said R takes the next connection as in handoff.
        let k = DispatchMode::Kernel;
        assert!(mode_allows(k, false, false, &ChildMessage::Next).is_ok());
        assert!(mode_allows(k, false, false, &ChildMessage::Busy).is_err());
    }

    #[test]
    fn a_kernel_child_by_messages_says_busy_next_and_idle_but_never_missed() {
        let k = DispatchMode::Kernel;
        for msg in [ChildMessage::Busy, ChildMessage::Next, ChildMessage::Idle] {
            assert!(mode_allows(k, false, true, &msg).is_ok(), "{msg:?}");
        }
        assert!(mode_allows(k, false, true, &ChildMessage::Missed).is_err());
        let g = ChildMessage::ReadyByMessages { pid: 7 };
        for mode in [
            DispatchMode::Kernel,
            DispatchMode::Order,
            DispatchMode::Shared,
        ] {
            assert!(mode_allows(mode, false, false, &g).is_ok(), "{mode:?}");
            // It accepts by itself, several at once: `B`, `N`, `I`.
            for msg in [ChildMessage::Busy, ChildMessage::Next, ChildMessage::Idle] {
                assert!(
                    mode_allows(mode, false, true, &msg).is_ok(),
                    "{mode:?} {msg:?}"
                );
            }
            assert!(mode_allows(mode, false, true, &ChildMessage::Missed).is_err());
        }
        let why = mode_allows(DispatchMode::Handoff, false, false, &g).unwrap_err();
        assert!(why.contains('G'), "{why}");
    }

    #[test]
    fn each_ping_is_answered_once() {
        assert!(pong_is_new(1, 0).is_ok());
        assert!(pong_is_new(1, 1).is_err());
        assert!(pong_is_new(7, 9).is_err());
        assert!(pong_is_new(10, 9).is_ok());
    }
}
