//! Which process a worker forked by a template is, by the kernel's word
//! and not the template's: the rules `supervisor/verify.rs` applies.
//!
//! A template says which pid it forked (`W`); that is a claim. The
//! worker's first message brings what the kernel knows: the pid of the
//! process that sent it (`SCM_CREDENTIALS`). The supervisor also knows
//! whether a pid is its own child and whether a slot or template holds it.
//! From those facts alone these functions say whether the claim holds,
//! and what a worker that never proved itself was.

/// What the supervisor knows when an unverified worker's first message
/// arrives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FirstMessage {
    /// The pid the template claimed in `W`, if its `W` has come.
    pub claimed: Option<i32>,
    /// The sender's pid as the kernel attached it, if it did.
    pub sender: Option<i32>,
    /// Whether the sender is the supervisor's child.
    pub sender_is_child: bool,
    /// Whether another slot or a template holds (or claims) the sender.
    pub sender_taken: bool,
    /// Whether the sender comes from its template, as the kernel's
    /// records say: it started after its fork order was sent, and it is in
    /// the template's process group (where a worker stays until it is
    /// verified). A sender with `CAP_SYS_ADMIN` (a template run as root)
    /// can put any pid in its credentials; a process the template did not
    /// fork (a sidecar, an adopted orphan, however young) is still refused.
    pub sender_from_template: bool,
}

/// Why a claim does not hold: the template lied, or failed its worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lie {
    /// The worker spoke and no `W` named it.
    Unclaimed,
    /// The message came without credentials (they were not asked for).
    NoCredentials,
    /// The kernel names another process than the template did.
    OtherProcess { claimed: i32, sender: i32 },
    /// The process is not the supervisor's child.
    NotOurChild { pid: i32 },
    /// Another slot or a template holds the process.
    Taken { pid: i32 },
    /// The process started before its fork order was sent, or outside its
    /// template's process group: not the worker.
    NotFromTemplate { pid: i32 },
}

impl Lie {
    /// The lie in words, for the log line that kills the template.
    pub fn describe(self, slot: usize) -> String {
        match self {
            Lie::Unclaimed => {
                "its worker spoke before the template said which process it is".to_string()
            }
            Lie::NoCredentials => {
                "its worker's message came without the kernel's credentials".to_string()
            }
            Lie::OtherProcess { claimed, sender } => format!(
                "said slot {slot} is pid {claimed}, but the kernel says the worker is pid {sender}"
            ),
            Lie::NotOurChild { pid } => {
                format!("said slot {slot} is pid {pid}, which is not a child of the supervisor")
            }
            Lie::Taken { pid } => {
                format!("said slot {slot} is pid {pid}, which another slot or a template holds")
            }
            Lie::NotFromTemplate { pid } => format!(
                "said slot {slot} is pid {pid}, which started before its fork order was sent \
                 or is not in the template's process group"
            ),
        }
    }
}

/// The pid the slot gets, or the lie. Every condition must hold; the
/// first that fails is the one named.
pub(crate) fn verify(m: FirstMessage) -> Result<i32, Lie> {
    let claimed = m.claimed.ok_or(Lie::Unclaimed)?;
    let sender = m.sender.ok_or(Lie::NoCredentials)?;
    if sender != claimed {
        return Err(Lie::OtherProcess { claimed, sender });
    }
    if !m.sender_is_child {
        return Err(Lie::NotOurChild { pid: sender });
    }
    if m.sender_taken {
        return Err(Lie::Taken { pid: sender });
    }
    if !m.sender_from_template {
        return Err(Lie::NotFromTemplate { pid: sender });
    }
    Ok(sender)
}

/// What an unverified worker that missed a deadline (or closed its
/// channel) was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum GaveUp {
    /// Its claimed process is not the supervisor's child (any more):
    /// reaped by someone else, or never its own. Counted `lost`; nothing
    /// to signal.
    Lost,
    /// The template is at fault (no answer, or a worker that never spoke):
    /// its group is killed.
    TemplateAtFault,
}

/// `claimed`: the pid of its `W`, if any; `claimed_is_child`: whether
/// that pid is the supervisor's child now.
pub(crate) fn gave_up(claimed: Option<i32>, claimed_is_child: bool) -> GaveUp {
    match claimed {
        Some(_) if !claimed_is_child => GaveUp::Lost,
        _ => GaveUp::TemplateAtFault,
    }
}

/// Whether a `W` for a slot may be taken as a claim at all: a positive
/// pid no template or other slot holds or claims.
pub(crate) fn claimable(pid: u32, taken: impl Fn(i32) -> bool) -> Result<i32, String> {
    let pid = i32::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{pid}, which is no process id"))?;
    if taken(pid) {
        return Err(format!("{pid}, which a template or another slot holds"));
    }
    Ok(pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HONEST: FirstMessage = FirstMessage {
        claimed: Some(100),
        sender: Some(100),
        sender_is_child: true,
        sender_taken: false,
        sender_from_template: true,
    };

    #[test]
    fn an_honest_worker_is_verified() {
        assert_eq!(verify(HONEST), Ok(100));
    }

    #[test]
    fn every_broken_condition_is_a_lie_and_named() {
        let cases = [
            (
                FirstMessage {
                    claimed: None,
                    ..HONEST
                },
                Lie::Unclaimed,
            ),
            (
                FirstMessage {
                    sender: None,
                    ..HONEST
                },
                Lie::NoCredentials,
            ),
            (
                FirstMessage {
                    sender: Some(7),
                    ..HONEST
                },
                Lie::OtherProcess {
                    claimed: 100,
                    sender: 7,
                },
            ),
            (
                FirstMessage {
                    sender_is_child: false,
                    ..HONEST
                },
                Lie::NotOurChild { pid: 100 },
            ),
            (
                FirstMessage {
                    sender_taken: true,
                    ..HONEST
                },
                Lie::Taken { pid: 100 },
            ),
            (
                FirstMessage {
                    sender_from_template: false,
                    ..HONEST
                },
                Lie::NotFromTemplate { pid: 100 },
            ),
        ];
        for (m, lie) in cases {
            assert_eq!(verify(m), Err(lie), "{m:?}");
            assert!(!lie.describe(3).is_empty());
        }
    }

    #[test]
    fn only_all_conditions_together_verify() {
        // Every combination of the five facts: exactly one passes.
        let mut passed = 0;
        for claimed in [None, Some(100), Some(101)] {
            for sender in [None, Some(100)] {
                for sender_is_child in [false, true] {
                    for sender_taken in [false, true] {
                        for sender_from_template in [false, true] {
                            let m = FirstMessage {
                                claimed,
                                sender,
                                sender_is_child,
                                sender_taken,
                                sender_from_template,
                            };
                            if let Ok(pid) = verify(m) {
                                assert_eq!(m, HONEST);
                                assert_eq!(pid, 100);
                                passed += 1;
                            }
                        }
                    }
                }
            }
        }
        assert_eq!(passed, 1);
    }

    #[test]
    fn a_vanished_claim_is_lost_and_anything_else_the_templates_fault() {
        assert_eq!(gave_up(Some(5), false), GaveUp::Lost);
        assert_eq!(gave_up(Some(5), true), GaveUp::TemplateAtFault);
        assert_eq!(gave_up(None, false), GaveUp::TemplateAtFault);
        assert_eq!(gave_up(None, true), GaveUp::TemplateAtFault);
    }

    #[test]
    fn a_claim_needs_a_free_positive_pid() {
        assert_eq!(claimable(42, |_| false), Ok(42));
        assert!(claimable(0, |_| false).is_err());
        assert!(claimable(u32::MAX, |_| false).is_err());
        assert!(claimable(42, |p| p == 42).is_err());
    }
}
