//! What the core knows of one template (`--preload`): the worker program
//! loaded once and ordered to fork each worker. A template is a
//! [`Child`] like a worker, with its life, pings and channel; its role
//! adds its generation, its pid and the fork orders it owes. Its channel,
//! stderr and pidfd are the shell's (`supervisor/template.rs`).

use std::collections::BTreeMap;
use std::time::Instant;

use super::child::{Child, IllegalLife, Life, LifeEvent};
use crate::policy::liveness::{
    template_check, Deadlines, TemplateCheck, TemplateFacts, TemplatePhase,
};

/// A template: a child whose role is forking workers.
pub(crate) type Template = Child<TemplateRole>;

/// What only a template has.
#[derive(Debug, Clone)]
pub(crate) struct TemplateRole {
    /// The generation whose workers it forks.
    pub generation: u32,
    /// Its pid (the supervisor forked it, or it was slot 0's worker).
    pub pid: i32,
    /// When it last sent anything.
    pub last_heard: Instant,
    /// Fork orders sent and not answered yet, by slot, with when.
    pub pending: BTreeMap<usize, Instant>,
    /// Workers it has forked.
    pub forks: u64,
}

impl Template {
    /// A template of `generation`, `pid`, just started at `now`.
    pub fn started(generation: u32, pid: i32, now: Instant) -> Template {
        Child::with_role(
            now,
            true,
            TemplateRole {
                generation,
                pid,
                last_heard: now,
                pending: BTreeMap::new(),
                forks: 0,
            },
        )
    }

    /// The name `forkpool status` shows for where it is.
    pub fn state_name(&self) -> &'static str {
        match &self.life {
            Life::Starting => "starting",
            Life::Up { .. } => "ready",
            Life::Leaving { .. } if self.killed() => "killed",
            Life::Leaving { .. } if self.asked_to_leave() => "quitting",
            Life::Leaving { .. } => "exiting",
        }
    }

    /// Whether it takes fork orders.
    pub fn takes_orders(&self) -> bool {
        matches!(self.life, Life::Up { .. })
    }

    /// `R`: the template is loaded and takes fork orders.
    pub fn said_ready(&mut self, pid: u32, now: Instant) -> Result<(), String> {
        if i64::from(pid) != i64::from(self.role.pid) {
            return Err(format!(
                "said it is pid {pid}, but it is pid {}",
                self.role.pid
            ));
        }
        let after = now.saturating_duration_since(self.born);
        self.live(LifeEvent::Ready { after })
            .map_err(|e: IllegalLife| e.to_string())
    }

    /// The fork order for `slot` is answered; an error if none was
    /// outstanding.
    pub fn fork_answered(&mut self, slot: usize) -> Result<(), String> {
        if self.role.pending.remove(&slot).is_none() {
            return Err(format!(
                "answered a fork order for slot {slot} that was not outstanding"
            ));
        }
        Ok(())
    }

    /// `P`: the answer to a ping; an error unless it answers the one sent.
    pub fn pong(&mut self, seq: u32) -> Result<(), String> {
        match self.ping {
            Some((sent, _)) if sent == seq => {
                self.ping = None;
                Ok(())
            }
            _ => Err(format!("answered ping {seq}, which was never sent")),
        }
    }

    /// The one deadline that applies to it next, with what missing it
    /// means (`policy::liveness::template_check`).
    pub fn next_check(&self, limits: &Deadlines) -> Option<(Instant, TemplateCheck)> {
        let facts = TemplateFacts {
            phase: match self.life {
                Life::Starting => TemplatePhase::Starting,
                Life::Up { .. } => TemplatePhase::Ready,
                Life::Leaving { .. } => TemplatePhase::Leaving,
            },
            started_at: self.born,
            last_heard: self.role.last_heard,
            // A killed template only waits to be reaped (no deadline).
            exit_deadline: self.leave_deadline(),
            oldest_order: self.role.pending.values().min().copied(),
            ping_sent: self.ping.map(|(_, sent)| sent),
        };
        template_check(&facts, limits)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_template_lives_as_a_child() {
        let t0 = Instant::now();
        let mut t = Template::started(1, 42, t0);
        assert_eq!(t.state_name(), "starting");
        assert!(t.said_ready(41, t0).is_err());
        t.said_ready(42, t0 + Duration::from_millis(30)).unwrap();
        assert!(t.takes_orders());
        assert_eq!(t.ready_after(), Some(Duration::from_millis(30)));
        assert_eq!(t.said_ready(42, t0).unwrap_err(), "said Ready twice");
        t.live(LifeEvent::Closed {
            by: t0 + Duration::from_secs(1),
        })
        .unwrap();
        // A closed channel is not a quit: its end is a death.
        assert_eq!(t.state_name(), "exiting");
        assert!(!t.asked_to_leave());
        assert!(!t.takes_orders());
        t.live(LifeEvent::Killed { why: "slow".into() }).unwrap();
        assert_eq!(t.state_name(), "killed");
        assert_eq!(t.leave_deadline(), None);
    }
}
