//! Templates in the core: their replies, the fork orders they owe, their
//! deadlines and pings, and their end. The shell forks and execs them and
//! carries the messages; the core decides.

use std::time::{Duration, Instant};

use tracing::{debug, info, warn};

use super::child::HasChild;
use super::child::{own_life, LeaveCause, Life, LifeEvent};
use super::effect::{Effect, TemplateFailure};
use super::template::Template;
use super::Core;
use crate::policy::backoff;
use crate::policy::liveness::{self, Deadlines, TemplateCheck as Check};
use crate::protocol::{TemplateReply, TemplateRequest};
use crate::sys::process::ExitStatus;

/// Processes reaped without a slot that are remembered, in case a
/// template's `W` names one of them afterwards (a worker that died at
/// once). More than any burst of such deaths between two loop turns.
const ORPHANS_KEPT: usize = 64;

/// The least time between two template starts: how soon a template that
/// had said `R` and then ended is replaced (the first back-off delay, not
/// doubled).
pub(crate) const TEMPLATE_RESTART_INTERVAL: Duration = crate::policy::backoff::FIRST_DELAY;

impl<L: HasChild> Core<L> {
    /// The template of `generation`, if there is one.
    pub fn template(&self, generation: u32) -> Option<&Template> {
        self.templates
            .iter()
            .find(|t| t.role.generation == generation)
    }

    fn template_mut(&mut self, generation: u32) -> Option<&mut Template> {
        self.templates
            .iter_mut()
            .find(|t| t.role.generation == generation)
    }

    /// Whether the template of `generation` is ready for fork orders.
    pub fn has_ready_template(&self, generation: u32) -> bool {
        self.template(generation)
            .is_some_and(Template::takes_orders)
    }

    /// A template of `generation` was started as `pid` (forked, or slot
    /// 0's worker became one): it must say `R` next.
    pub fn template_started(&mut self, generation: u32, pid: i32, now: Instant) {
        self.templates.push(Template::started(generation, pid, now));
    }

    /// Keeps one template for the generation being started, and the
    /// serving one's while a rollout runs: quits the others, and returns
    /// the generation a template must be started for, when it has none
    /// and its restart back-off does not hold.
    pub fn maintain_templates(&mut self, now: Instant) -> Option<u32> {
        if self.shutdown.is_some() {
            return None;
        }
        let current = self.generation;
        let serving = self.serving_generation();
        let rolling = self.rolling();
        let preload = self.config.preload;
        let unneeded: Vec<u32> = self
            .templates
            .iter()
            .filter(|t| {
                let needed = (t.role.generation == current && preload)
                    || (t.role.generation == serving && rolling);
                !needed && !matches!(t.life, Life::Leaving { .. })
            })
            .map(|t| t.role.generation)
            .collect();
        for generation in unneeded {
            self.quit_template(generation, now);
        }
        (preload && self.template(current).is_none() && self.may_start_template(now))
            .then_some(current)
    }

    /// Whether a template may be started at `now` (its restart back-off).
    pub fn may_start_template(&self, now: Instant) -> bool {
        self.templates_blocked_until.is_none_or(|t| now >= t)
    }

    /// Holds template starts back after a template ended unasked, or
    /// could not be started. One that had said `R` had started, whenever
    /// it died (an operator's `kill -9` a moment after): it is replaced
    /// after the first delay, rate-limited, never backed off. One that
    /// never said `R` doubles the delay. Returns the delay.
    pub(super) fn hold_templates(&mut self, was_ready: bool, now: Instant) -> Duration {
        let delay = if was_ready {
            self.template_backoff.reset();
            TEMPLATE_RESTART_INTERVAL
        } else {
            self.template_backoff.failed(now)
        };
        self.templates_blocked_until = Some(now + delay);
        delay
    }

    /// A template could not be started (`why`): starts wait, doubling.
    pub fn template_start_failed(&mut self, now: Instant, why: &str) -> Duration {
        let delay = self.hold_templates(false, now);
        tracing::error!("{why}; trying again in {delay:?}");
        delay
    }

    /// Whether a fork order may go to the template of `generation`: it is
    /// ready, and it has not too many workers unverified already.
    pub fn may_order(&self, generation: u32) -> bool {
        self.has_ready_template(generation)
            && self.unverified_of(generation) < super::vouch::UNVERIFIED_PER_TEMPLATE
    }

    /// A fork order for `slot` went to the template of `generation`.
    pub fn ordered(&mut self, generation: u32, slot: usize, now: Instant) {
        if let Some(t) = self.template_mut(generation) {
            t.role.pending.insert(slot, now);
        }
    }

    /// A reply from the template of `generation`; one that breaks the
    /// protocol gets the template killed.
    pub fn template_reply(&mut self, generation: u32, reply: TemplateReply, now: Instant) {
        let Some(t) = self.template_mut(generation) else {
            return;
        };
        t.role.last_heard = now;
        if let Err(why) = self.apply_template_reply(generation, reply, now) {
            self.kill_template(generation, format!("broke the protocol: {why}"));
        }
    }

    fn apply_template_reply(
        &mut self,
        generation: u32,
        reply: TemplateReply,
        now: Instant,
    ) -> Result<(), String> {
        let t = self.template_mut(generation).expect("caller found it");
        match reply {
            TemplateReply::Ready { pid } => {
                t.said_ready(pid, now)?;
                info!(
                    pid,
                    generation,
                    took = ?now.duration_since(t.born),
                    "template ready: forking workers from it"
                );
                self.template_ever_ready = true;
                self.templates_ended_unready = 0;
                Ok(())
            }
            TemplateReply::Forked { slot, pid } => {
                t.fork_answered(slot as usize)?;
                t.role.forks += 1;
                let claimed = self.worker_forked(slot as usize, pid, now);
                if claimed.is_err() {
                    // Its order is answered, badly: no worker will come
                    // for this slot that the supervisor could trust.
                    self.abandon_unverified(slot as usize);
                    self.count_failed_start(now);
                }
                claimed
            }
            TemplateReply::ForkFailed { slot, errno } => {
                t.fork_answered(slot as usize)?;
                let err = std::io::Error::from_raw_os_error(errno as i32);
                self.abandon_unverified(slot as usize);
                if self.rolling_in_unproven(generation) {
                    // The new generation's first worker cannot be had: the
                    // reload fails and the old generation keeps serving,
                    // rather than a rollout that waits for ever.
                    let how = format!("(the template) could not fork its first worker: {err}");
                    if let Some(failed) = self.rollout_start_failed(generation, how, now) {
                        self.effects.push(Effect::ReloadFailed(failed));
                    }
                    return Ok(());
                }
                let delay = self.fork_failed(now, super::RESOURCE_BACKOFF);
                warn!(
                    "the template could not fork the worker for slot {slot}: {err}; \
                     trying again in {delay:?}"
                );
                Ok(())
            }
            TemplateReply::Pong { seq } => t.pong(seq),
        }
    }

    /// The template said the worker for `slot` is `pid`: a claim, kept
    /// until the worker's first message proves it (`vouch.rs`). Refused
    /// outright when it names no process, a template, or a pid a slot
    /// already holds or claims.
    fn worker_forked(&mut self, slot: usize, pid: u32, now: Instant) -> Result<(), String> {
        let pid = crate::policy::verification::claimable(pid, |p| self.pid_taken(p, None))
            .map_err(|why| format!("said slot {slot} is pid {why}"))?;
        let Some(link) = self.board.link_mut(slot) else {
            return Err(format!(
                "said slot {slot} is pid {pid}, but the slot is gone"
            ));
        };
        link.child_mut().role.claimed = Some(pid);
        if let Some(status) = self.take_orphan(pid) {
            // It died before its template's answer was read: a start that
            // failed, reaped by the supervisor, so the claim holds.
            self.reaped(slot, pid, status, now);
            return Ok(());
        }
        debug!(
            slot,
            pid, "the template forked a worker; its pid is trusted once the kernel confirms it"
        );
        Ok(())
    }

    /// Remembers a reaped process that held no slot.
    pub fn remember_orphan(&mut self, pid: i32, status: ExitStatus) {
        if self.orphans.len() == ORPHANS_KEPT {
            self.orphans.pop_front();
        }
        self.orphans.push_back((pid, status));
    }

    fn take_orphan(&mut self, pid: i32) -> Option<ExitStatus> {
        let i = self.orphans.iter().position(|(p, _)| *p == pid)?;
        self.orphans.remove(i).map(|(_, status)| status)
    }

    /// The template of `generation` closed its channel: it is exiting.
    pub fn template_closed(&mut self, generation: u32, now: Instant) {
        let deadline = liveness::exit_deadline(
            now,
            self.config.exit_timeout,
            self.shutdown.map(|s| s.deadline),
        );
        if let Some(t) = self.template_mut(generation) {
            t.channel_closed = true;
            own_life(t.live(LifeEvent::Closed { by: deadline }));
        }
    }

    /// SIGKILLs the template of `generation` (its process group: the
    /// workers it forked that the kernel has not vouched for die with it;
    /// verified workers have a group of their own and keep serving).
    pub fn kill_template(&mut self, generation: u32, why: String) {
        let stopping = self.shutdown.is_some();
        let Some(t) = self.template_mut(generation) else {
            return;
        };
        let pid = t.role.pid;
        if t.live(LifeEvent::Killed { why: why.clone() }).is_err() {
            // Killed already: it only waits to be reaped.
            return;
        }
        warn!(pid, generation, "killing the template: {why}");
        if !stopping {
            self.totals.templates_killed += 1;
        }
        self.effects.push(Effect::KillTemplate { generation });
    }

    /// Tells the template of `generation` to exit.
    pub fn quit_template(&mut self, generation: u32, now: Instant) {
        let deadline = liveness::exit_deadline(
            now,
            self.config.exit_timeout,
            self.shutdown.map(|s| s.deadline),
        );
        let Some(t) = self.template_mut(generation) else {
            return;
        };
        let asked = LifeEvent::Asked {
            why: "no longer needed".into(),
            by: deadline,
        };
        if t.live(asked).is_err() {
            // Told to go already, or killed.
            return;
        }
        info!(
            pid = t.role.pid,
            generation, "template no longer needed: told to quit"
        );
        self.effects.push(Effect::SendTemplate {
            generation,
            request: TemplateRequest::Quit,
        });
    }

    /// Every template is told to quit (a graceful stop).
    pub fn quit_templates(&mut self, now: Instant) {
        let all: Vec<u32> = self.templates.iter().map(|t| t.role.generation).collect();
        for generation in all {
            self.quit_template(generation, now);
        }
    }

    /// Every template is killed (an immediate stop).
    pub fn kill_templates(&mut self) {
        let all: Vec<u32> = self.templates.iter().map(|t| t.role.generation).collect();
        for generation in all {
            self.kill_template(generation, "immediate stop".into());
        }
    }

    /// Pings quiet templates and kills those that missed a deadline.
    pub fn check_templates(&mut self, now: Instant) {
        let limits = Deadlines::of(&self.config);
        let due: Vec<(u32, Check)> = self
            .templates
            .iter()
            .filter_map(|t| {
                let (at, check) = t.next_check(&limits)?;
                (now >= at).then_some((t.role.generation, check))
            })
            .collect();
        for (generation, check) in due {
            let why = match check {
                Check::PingDue => {
                    self.ping_template(generation, now);
                    continue;
                }
                Check::Exit => format!(
                    "did not exit in time after being told to quit or closing its channel \
                     (exit_timeout {:?}, or the stop's deadline if sooner)",
                    self.config.exit_timeout
                ),
                Check::Start => format!(
                    "did not say Ready within {:?} of starting",
                    limits.start_timeout
                ),
                Check::Fork => {
                    // The order it sat on is a worker that did not start.
                    self.count_failed_start(now);
                    format!(
                        "did not answer a fork order within {:?}",
                        limits.start_timeout
                    )
                }
                Check::PingAnswer => format!(
                    "did not answer a ping within {:?}",
                    self.config.ping_timeout
                ),
            };
            self.kill_template(generation, why);
        }
    }

    fn ping_template(&mut self, generation: u32, now: Instant) {
        self.ping_seq = self.ping_seq.wrapping_add(1);
        let seq = self.ping_seq;
        if let Some(t) = self.template_mut(generation) {
            t.ping = Some((seq, now));
            self.effects.push(Effect::SendTemplate {
                generation,
                request: TemplateRequest::Ping { seq },
            });
        }
    }

    /// The earliest template deadline, and the end of the restart
    /// back-off when a template is missing, for the loop's timer.
    pub fn templates_deadline(&self) -> Option<Instant> {
        let limits = Deadlines::of(&self.config);
        let next_check = self
            .templates
            .iter()
            .filter_map(|t| t.next_check(&limits).map(|(at, _)| at))
            .min();
        let start = self.templates_blocked_until.filter(|_| {
            self.config.preload
                && self.shutdown.is_none()
                && self.template(self.generation).is_none()
        });
        next_check.into_iter().chain(start).min()
    }

    /// `--preload` cannot work: the program never became a template. The
    /// pool stops now (nothing was ever served) and the supervisor exits
    /// with the error, so connections are refused, not left waiting.
    fn give_up_on_templates(&mut self, how: &str, now: Instant) {
        self.gave_up = Some(format!(
            "the --preload program never became a template: {} templates in a row ended \
             before saying they were ready on the template channel (the last one {how}). \
             A program preloaded must speak protocol version 2 (FORKPOOL_PROTOCOL=2, \
             FORKPOOL_TEMPLATE_FD; see docs/protocol.md, \"Templates\"): this one does not, \
             or fails before it can. Run it without --preload",
            self.templates_ended_unready
        ));
        self.stop_now(now);
    }

    /// The template `pid` has been reaped with `status`: the slots of the
    /// workers it forked that were never verified are freed (they died in
    /// its group, or will never come), and one that ended unasked is
    /// replaced with back-off, or fails the reload it was for.
    pub(super) fn template_exited(&mut self, pid: i32, status: ExitStatus, now: Instant) -> bool {
        let Some(i) = self.templates.iter().position(|t| t.role.pid == pid) else {
            return false;
        };
        let t = self.templates.remove(i);
        let generation = t.role.generation;
        let unverified: Vec<usize> = self
            .board
            .iter()
            .filter(|(slot, s)| s.generation == generation && self.unverified(*slot))
            .map(|(slot, _)| slot)
            .collect();
        for slot in unverified {
            self.abandon_unverified(slot);
        }
        if t.asked_to_leave() || self.shutdown.is_some() {
            info!(pid, generation, %status, forks = t.role.forks, "template exited");
            self.effects.push(Effect::TemplateGone {
                generation,
                pid,
                failure: None,
            });
            return true;
        }
        let how = match t.leave_cause() {
            Some(LeaveCause::Killed(why)) => format!("was killed ({why})"),
            _ => format!("exited unexpectedly ({status})"),
        };
        let was_ready = t.is_ready();
        let reload_failed = if !was_ready || self.rolling_in_unproven(generation) {
            // The reload's new code does not start: keep the old one.
            self.rollout_start_failed(generation, format!("(the template) {how}"), now)
        } else {
            None
        };
        if !was_ready && reload_failed.is_none() {
            self.templates_ended_unready += 1;
            if backoff::gives_up_on_templates(
                self.templates_ended_unready,
                self.template_ever_ready,
            ) {
                self.give_up_on_templates(&how, now);
            }
        }
        let retry_in = (reload_failed.is_none() && self.gave_up.is_none()).then(|| {
            self.totals.template_restarts += 1;
            self.hold_templates(was_ready, now)
        });
        self.effects.push(Effect::TemplateGone {
            generation,
            pid,
            failure: Some(TemplateFailure {
                how,
                was_ready,
                reload_failed,
                retry_in,
            }),
        });
        true
    }

    /// What the log says of the template `pid` of `generation` that ended
    /// unasked (`failure`; a reload it failed is logged as that), with its
    /// `command` and last stderr lines (`tail`) quoted. Nothing when the
    /// pool gave up on templates: the reason the supervisor exits with
    /// names them instead. Otherwise one line, saying when the next
    /// template starts.
    pub fn template_failure_words(
        &mut self,
        failure: &TemplateFailure,
        (generation, pid): (u32, i32),
        command: &str,
        tail: &[String],
    ) -> Option<String> {
        let said = match tail {
            [] => String::from("nothing on stderr"),
            lines => format!("stderr: {}", lines.join(" | ")),
        };
        if let Some(why) = self.gave_up.as_mut().filter(|_| failure.retry_in.is_none()) {
            *why = format!("`{command}`: {why} (the last one left {said})");
            return None;
        }
        let stage = match failure.was_ready {
            true => "; the workers it forked keep serving",
            false => " before it was ready",
        };
        Some(format!(
            "template `{command}` (pid {pid}, generation {generation}) {}{stage}; {said}; \
             a new template will be started in {:?}",
            failure.how,
            failure.retry_in.unwrap_or_default()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::PoolConfig;
    use crate::core::child::Child;
    use crate::core::Input;
    use nix::sys::signal::Signal;

    /// A template started at `at` (saying `R` at once if `ready`) and
    /// SIGKILLed from outside 100 ms later: how it failed.
    fn ended_soon_after(
        core: &mut Core<Child>,
        pid: i32,
        ready: bool,
        at: Instant,
    ) -> TemplateFailure {
        let generation = core.generation;
        core.template_started(generation, pid, at);
        if ready {
            let reply = TemplateReply::Ready { pid: pid as u32 };
            core.on(Input::TemplateReply { generation, reply }, at);
        }
        let status = ExitStatus::Signal(Signal::SIGKILL);
        core.on(
            Input::Reaped { pid, status },
            at + Duration::from_millis(100),
        );
        core.take_effects()
            .into_iter()
            .find_map(|e| match e {
                Effect::TemplateGone { failure, .. } => failure,
                _ => None,
            })
            .expect("an unasked end is a failure")
    }

    /// The same: how long until the next.
    fn killed_soon_after(core: &mut Core<Child>, pid: i32, ready: bool, at: Instant) -> Duration {
        let failure = ended_soon_after(core, pid, ready, at);
        failure.retry_in.expect("an unasked end is retried")
    }

    fn preloaded() -> Core<Child> {
        Core::new(PoolConfig {
            preload: true,
            ..PoolConfig::default()
        })
    }

    /// A template that said `R` had started, however soon it was killed
    /// after: each is replaced after the same short interval, never a
    /// doubling delay (issue 24: the back-off is for what never started).
    #[test]
    fn a_template_killed_soon_after_ready_is_rate_limited_not_backed_off() {
        let mut core = preloaded();
        let mut at = Instant::now();
        for pid in 100..105 {
            let wait = killed_soon_after(&mut core, pid, true, at);
            assert_eq!(wait, TEMPLATE_RESTART_INTERVAL, "template {pid}");
            at += Duration::from_secs(1);
        }
    }

    /// One that never said `R` is a start-up failure: the delay doubles.
    #[test]
    fn a_template_that_never_said_ready_backs_off() {
        let mut core = preloaded();
        let at = Instant::now();
        let first = killed_soon_after(&mut core, 100, false, at);
        let second = killed_soon_after(&mut core, 101, false, at + Duration::from_secs(1));
        assert_eq!(second, first * 2);
    }

    #[test]
    fn an_unasked_end_is_worded_or_named_in_the_reason_the_pool_gives_up() {
        let at = Instant::now();
        let mut core = preloaded();
        let tail = [String::from("ImportError: no module named x")];
        let ready = ended_soon_after(&mut core, 100, true, at);
        let line = core.template_failure_words(&ready, (1, 100), "app.py", &tail);
        let line = line.expect("a template that ends is logged");
        assert!(line.starts_with("template `app.py` (pid 100, generation 1) exited unexpectedly"));
        assert!(line.contains("the workers it forked keep serving; stderr: ImportError"));
        // Templates that never become one, until the pool gives up: the
        // reason it exits with names the command and what the last said.
        let mut core = preloaded();
        let mut gave_up = None;
        for pid in 200..220 {
            let failure = ended_soon_after(&mut core, pid, false, at);
            if failure.retry_in.is_none() {
                gave_up = core.template_failure_words(&failure, (1, pid), "app.py", &[]);
                assert_eq!(gave_up, None);
                gave_up = core.take_gave_up();
                break;
            }
        }
        let why = gave_up.expect("the pool gives up");
        assert!(why.starts_with("`app.py`: the --preload program never became a template"));
        assert!(why.ends_with("(the last one left nothing on stderr)"));
    }
}
