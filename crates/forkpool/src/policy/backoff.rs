//! When spawns wait: a back-off for workers that cannot start, and a rate
//! limit on replacing workers that had started.
//!
//! Two kinds of death look alike in `waitpid` and must not be confused:
//!
//! - **A worker that never started.** It died, or was killed, before it
//!   said `Ready`, or it missed its start deadline. A missing program, a
//!   bad configuration or a crash on import do that every time, so
//!   replacing it at once would fork as fast as the machine allows, for
//!   nothing. Each such failure doubles a delay that holds back every
//!   spawn (100 ms, 200 ms, … up to 30 s). A fork that fails for lack of
//!   resources (`EAGAIN`, `ENOMEM`, no descriptors) counts as one too.
//! - **A worker that had started.** It said `Ready`, so the command, the
//!   code and the configuration work; whatever ended it (a crash on a
//!   request, the OOM killer, an operator's `kill -9`, the supervisor
//!   killing it for misbehaving) says nothing about the next start. It is
//!   replaced at once and never feeds the back-off. Only the rate of such
//!   replacements is bounded ([`ReplacementRate`]): a burst of
//!   `max_spawn_rate` replacements is forked at once, then at most
//!   `max_spawn_rate` a second. That is what bounds a worker that says
//!   `Ready` and then dies every time (on its first request, say): over
//!   any span of `L` seconds the pool forks at most
//!   `max_spawn_rate × (L + 1) + max_children` workers (the property test
//!   `a_crash_loop_of_ready_workers_is_bounded_by_the_rate`). Forks that
//!   replace no such death (the pool growing with the load, recycled or
//!   retired workers) are not counted.
//!
//! A kill storm is the second kind: before this rule, a worker killed
//! within a second of its fork counted as a start-up failure, and under a
//! SIGKILL every 200 ms the doubling delay held the pool at 0 children.
//!
//! A run of failures ends when a worker *starts after the last failure*
//! (its `Ready` came later): starts work again, so the hold is lifted at
//! once and the next failure starts from the first delay. Siblings that
//! were up before the failures began prove nothing about new starts (the
//! code on disk may have changed since they started). So the back-off
//! never holds the pool while the last start succeeded.
//!
//! Workers that never say `Ready` (`none` dispatch) have no other proof:
//! for them, having lived through [`START_WINDOW`] is the start.
//!
//! A `--preload` program that never once became a template is not backed
//! off forever: after [`TEMPLATE_TRIES`] ends without `R`, and no
//! template ever ready, the pool stops with an error that says so
//! ([`gives_up_on_templates`]). Such a program cannot be a template at
//! all (it does not speak protocol version 2), and a pool left listening
//! with no worker would accept connections it never serves.
//!
//! The same rule holds for workers forked from a template (`--preload`):
//! they say `Ready` like any other. The template's own restarts follow the
//! same rule (`core/templates.rs`): backed off until one says `R`,
//! rate-limited once one has.
//!
//! Accepts back off too: an accept that fails for want of descriptors or
//! memory (`EMFILE`, `ENFILE`, `ENOBUFS`, `ENOMEM`) would fail again at
//! once on a listener that stays readable, so the pool's listeners and
//! the status endpoints stop accepting for [`ACCEPT_PAUSE`].

use std::time::{Duration, Instant};

/// How long the supervisor stops accepting (on the pool's listeners, or
/// on its status endpoints) after an accept failed for want of
/// descriptors or memory: long enough not to spin, short enough that a
/// freed descriptor serves the queued clients soon.
pub(crate) const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// How long a worker that never says `Ready` (`none` dispatch) must live
/// before it counts as started; templates use it the same way. A worker
/// that says `Ready` has started when it says so. It is also how young a
/// worker of a reload's new generation may not die, even after `Ready`,
/// without failing the reload (see [`fails_a_reload`]).
pub(crate) const START_WINDOW: Duration = Duration::from_secs(1);
/// The delay after the first failure in a row.
pub(crate) const FIRST_DELAY: Duration = Duration::from_millis(100);
/// The longest delay.
const MAX_DELAY: Duration = Duration::from_secs(30);
/// The span whose worth of deaths [`ReplacementRate`] replaces at once.
const BURST: Duration = Duration::from_secs(1);

/// How far a worker had got in starting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    /// It has not said `Ready`.
    Awaited,
    /// It said `Ready` at this instant: it has started.
    Ready(Instant),
    /// It never says `Ready` (`none` dispatch); it was forked at this
    /// instant and has started once it has lived through [`START_WINDOW`].
    Unannounced(Instant),
}

impl Start {
    /// When it started (or will have, if it lives): `None` while it has
    /// not said `Ready`.
    pub fn started_at(self) -> Option<Instant> {
        match self {
            Start::Awaited => None,
            Start::Ready(at) => Some(at),
            Start::Unannounced(forked) => Some(forked + START_WINDOW),
        }
    }

    /// Whether it had started by `now`.
    pub fn started_by(self, now: Instant) -> bool {
        self.started_at().is_some_and(|at| at <= now)
    }
}

/// What a worker's end means for spawning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The supervisor asked it to go, it said it was leaving, or the pool
    /// is stopping: nothing to hold back.
    Expected,
    /// It had started and died unasked: replaced at once, within the
    /// rate limit on replacements ([`ReplacementRate`]). Never a delay.
    Replaced,
    /// It never started: a start-up failure, and spawns wait `delay`.
    FailedStart {
        /// How long spawns wait.
        delay: Duration,
    },
}

/// The doubling delay of a run of start-up failures.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StartBackoff {
    /// The delay after the last failure; `None` when the last start worked.
    delay: Option<Duration>,
    /// When the last failure happened.
    last_failure: Option<Instant>,
}

impl StartBackoff {
    /// One more failure at `now`: returns how long to hold spawns back.
    pub fn failed(&mut self, now: Instant) -> Duration {
        let delay = self
            .delay
            .map_or(FIRST_DELAY, |d| d.saturating_mul(2).min(MAX_DELAY));
        self.delay = Some(delay);
        self.last_failure = Some(now);
        delay
    }

    /// A worker started at `at`: that ends the run of failures only if it
    /// started after the last one. Returns whether it did.
    pub fn started(&mut self, at: Instant) -> bool {
        let ends = self.delay.is_some() && self.last_failure.is_none_or(|t| at > t);
        if ends {
            self.reset();
        }
        ends
    }

    /// Forget the run: the next failure starts from the first delay.
    pub fn reset(&mut self) {
        *self = StartBackoff::default();
    }
}

/// The rate limit on replacing workers that had started: a burst of
/// `rate` replacements is forked at once, and after that `rate` a second.
/// It is a leaky bucket kept as one instant, the time at which the
/// bucket will have drained, and it counts forks, not deaths: a pool whose
/// every worker died at once gets `rate` of them back at once, not a hold
/// for every death beyond the burst.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplacementRate {
    /// Deaths of started workers not replaced yet. A fork while any are
    /// owed is a replacement and counts against the rate; the others
    /// (the pool growing, recycled workers) do not. A death the pool did
    /// not replace (it had children to spare) stays owed until a later
    /// fork, which then counts: forgetting it after a quiet spell would
    /// let a worker that lives about that long fork past the bound. It
    /// costs little: such deaths are at most the pool's surplus, and a
    /// fork they count against still goes at once within the burst.
    owed: u32,
    /// When the replacements forked so far will have been paid for at
    /// `rate` a second.
    drained_at: Option<Instant>,
}

impl ReplacementRate {
    /// A started worker died: the next fork replaces it.
    pub fn died(&mut self) {
        self.owed = self.owed.saturating_add(1);
    }

    /// A worker was forked at `now`: a replacement, if one was owed.
    pub fn forked(&mut self, now: Instant, rate: u32) {
        if self.owed == 0 {
            return;
        }
        self.owed -= 1;
        self.drained_at = Some(self.drained_at.map_or(now, |t| t.max(now)) + interval(rate));
    }

    /// Until when the next fork waits at `rate` a second, if it does at
    /// `now` (only while a replacement is owed).
    pub fn held_until(&self, now: Instant, rate: u32) -> Option<Instant> {
        if self.owed == 0 {
            return None;
        }
        self.drained_at
            .and_then(|t| (t + interval(rate)).checked_sub(BURST))
            .filter(|t| *t > now)
    }
}

/// The time one replacement takes out of the rate: a second over `rate`,
/// rounded up so that the rate is never exceeded.
fn interval(rate: u32) -> Duration {
    let nanos = 1_000_000_000u64.div_ceil(u64::from(rate.max(1)));
    Duration::from_nanos(nanos)
}

/// Everything that holds spawns back: the back-off of a run of start-up
/// failures and the rate limit on replacements.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SpawnGate {
    run: StartBackoff,
    /// Until when the run holds spawns.
    run_hold: Option<Instant>,
    replacements: ReplacementRate,
}

impl SpawnGate {
    /// A worker that had got as far as `start` ended at `now`; `asked`
    /// when the supervisor asked it to go, it said it was leaving, or the
    /// pool is stopping. See the module docs.
    pub fn child_exited(&mut self, start: Start, asked: bool, now: Instant) -> Verdict {
        if let Some(at) = start.started_at().filter(|at| *at <= now) {
            self.started(at);
            if asked {
                return Verdict::Expected;
            }
            self.replacements.died();
            return Verdict::Replaced;
        }
        if asked {
            return Verdict::Expected;
        }
        Verdict::FailedStart {
            delay: self.failed(now, Duration::ZERO),
        }
    }

    /// A start-up failure at `now`, or a spawn that failed for lack of
    /// resources: holds spawns at least `floor`, or the run's next delay.
    pub fn failed(&mut self, now: Instant, floor: Duration) -> Duration {
        let delay = self.run.failed(now).max(floor);
        let until = now + delay;
        self.run_hold = Some(self.run_hold.map_or(until, |t| t.max(until)));
        delay
    }

    /// A worker started at `at`: if after the last failure, the run is
    /// over and its hold is lifted.
    pub fn started(&mut self, at: Instant) {
        if self.run.started(at) {
            self.run_hold = None;
        }
    }

    /// Whether a run of failures holds spawns at `now`: the supervisor
    /// then looks for a worker that has started since, to lift it.
    pub fn failures_hold(&self, now: Instant) -> bool {
        self.run_hold.is_some_and(|t| t > now)
    }

    /// A worker was forked at `now`; `rate` is `max_spawn_rate`.
    pub fn forked(&mut self, now: Instant, rate: u32) {
        self.replacements.forked(now, rate);
    }

    /// Until when spawns wait, if they do at `now`; `rate` is
    /// `max_spawn_rate`.
    pub fn held_until(&self, now: Instant, rate: u32) -> Option<Instant> {
        let run = self.run_hold.filter(|t| *t > now);
        run.max(self.replacements.held_until(now, rate))
    }

    /// Forgets the run of failures (a reload brings new code, which the
    /// old failures say nothing about); the replacement rate stays.
    pub fn forget_failures(&mut self) {
        self.run.reset();
        self.run_hold = None;
    }
}

/// Whether a worker's end (`verdict`, forked at `forked`, ended at `now`)
/// fails a reload when the worker is of the generation rolling in: a
/// start-up failure does, and so does dying unasked within
/// [`START_WINDOW`] of its fork, even after `Ready`: new code that
/// crashes at once is not rolled in. That judges the reload only; such a
/// death still feeds no back-off.
pub(crate) fn fails_a_reload(verdict: Verdict, forked: Instant, now: Instant) -> bool {
    match verdict {
        Verdict::Expected => false,
        Verdict::FailedStart { .. } => true,
        Verdict::Replaced => now.saturating_duration_since(forked) < START_WINDOW,
    }
}

/// How many times in a row a `--preload` template may end before it
/// ever said `R`, while no template of the pool ever did, before the pool
/// gives up ([`gives_up_on_templates`]).
pub const TEMPLATE_TRIES: u32 = 3;

/// Whether the pool gives up on `--preload`: `ends_unready` templates in a
/// row ended without saying `R`, and no template was ever ready. Once one
/// was, the program can be a template, and later failures are backed off
/// and retried like any start-up failure.
pub fn gives_up_on_templates(ends_unready: u32, ever_ready: bool) -> bool {
    !ever_ready && ends_unready >= TEMPLATE_TRIES
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const RATE: u32 = 32;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn preload_gives_up_only_on_a_program_that_was_never_a_template() {
        assert!(!gives_up_on_templates(TEMPLATE_TRIES - 1, false));
        assert!(gives_up_on_templates(TEMPLATE_TRIES, false));
        assert!(!gives_up_on_templates(TEMPLATE_TRIES * 10, true));
    }

    #[test]
    fn delay_doubles_up_to_the_cap_and_resets() {
        let mut b = StartBackoff::default();
        let now = Instant::now();
        let delays: Vec<Duration> = (0..12).map(|_| b.failed(now)).collect();
        assert_eq!(delays[0], Duration::from_millis(100));
        assert_eq!(delays[1], Duration::from_millis(200));
        assert_eq!(delays[4], Duration::from_millis(1600));
        assert_eq!(delays[11], MAX_DELAY);
        assert!(delays.windows(2).all(|w| w[0] <= w[1]));
        b.reset();
        assert_eq!(b.failed(now), FIRST_DELAY);
    }

    #[test]
    fn only_a_start_after_the_last_failure_ends_the_run() {
        let t0 = Instant::now();
        let mut b = StartBackoff::default();
        let healthy_sibling = t0;
        b.failed(t0 + Duration::from_secs(1));
        b.failed(t0 + Duration::from_secs(2));
        // A sibling started before the failures proves nothing.
        assert!(!b.started(healthy_sibling));
        assert_eq!(b.failed(t0 + Duration::from_secs(3)), FIRST_DELAY * 4);
        // A worker that started after the last failure does.
        assert!(b.started(t0 + Duration::from_secs(4)));
        assert_eq!(b.failed(t0 + Duration::from_secs(6)), FIRST_DELAY);
    }

    #[test]
    fn a_start_with_no_failures_changes_nothing() {
        let mut b = StartBackoff::default();
        assert!(!b.started(Instant::now()));
        assert_eq!(b, StartBackoff::default());
    }

    #[test]
    fn ready_is_the_start_and_unannounced_workers_start_by_time() {
        let t0 = Instant::now();
        assert!(Start::Ready(t0).started_by(t0));
        assert!(!Start::Awaited.started_by(t0 + START_WINDOW * 10));
        let none = Start::Unannounced(t0);
        assert!(!none.started_by(t0 + START_WINDOW / 2));
        assert!(none.started_by(t0 + START_WINDOW));
    }

    #[test]
    fn a_worker_killed_right_after_ready_is_replaced_at_once() {
        let t0 = Instant::now();
        let mut gate = SpawnGate::default();
        // Ready 5 ms after its fork, SIGKILLed 10 ms later.
        let verdict = gate.child_exited(Start::Ready(t0 + ms(5)), false, t0 + ms(15));
        assert_eq!(verdict, Verdict::Replaced);
        assert_eq!(gate.held_until(t0 + ms(15), RATE), None);
        gate.forked(t0 + ms(15), RATE);
        assert_eq!(gate.held_until(t0 + ms(15), RATE), None);
    }

    #[test]
    fn a_worker_that_never_said_ready_backs_off() {
        let t0 = Instant::now();
        let mut gate = SpawnGate::default();
        let first = gate.child_exited(Start::Awaited, false, t0);
        assert_eq!(first, Verdict::FailedStart { delay: FIRST_DELAY });
        assert_eq!(gate.held_until(t0, RATE), Some(t0 + FIRST_DELAY));
        let second = gate.child_exited(Start::Awaited, false, t0 + ms(150));
        assert_eq!(
            second,
            Verdict::FailedStart {
                delay: FIRST_DELAY * 2
            }
        );
        // Asked to go before it was ready (surplus, a stop): nothing.
        let asked = gate.child_exited(Start::Awaited, true, t0 + ms(200));
        assert_eq!(asked, Verdict::Expected);
        // In `none` mode, dying inside the window is a failure too.
        let none = gate.child_exited(Start::Unannounced(t0), false, t0 + ms(300));
        assert_eq!(
            none,
            Verdict::FailedStart {
                delay: FIRST_DELAY * 4
            }
        );
    }

    #[test]
    fn a_ready_worker_after_the_failure_lifts_the_hold() {
        let t0 = Instant::now();
        let mut gate = SpawnGate::default();
        for i in 0..5 {
            gate.child_exited(Start::Awaited, false, t0 + ms(i));
        }
        assert!(gate.failures_hold(t0 + ms(10)));
        // A sibling that was ready before the last failure proves nothing.
        gate.started(t0 + ms(2));
        assert!(gate.failures_hold(t0 + ms(10)));
        gate.started(t0 + ms(20));
        assert!(!gate.failures_hold(t0 + ms(20)));
        assert_eq!(gate.held_until(t0 + ms(20), RATE), None);
        // And the next failure starts the doubling afresh.
        let next = gate.child_exited(Start::Awaited, false, t0 + ms(30));
        assert_eq!(next, Verdict::FailedStart { delay: FIRST_DELAY });
    }

    #[test]
    fn the_death_of_a_started_worker_ends_a_run_it_started_after() {
        let t0 = Instant::now();
        let mut gate = SpawnGate::default();
        gate.child_exited(Start::Awaited, false, t0);
        gate.child_exited(Start::Awaited, false, t0 + ms(100));
        // Started after the failures, then killed: the run is over.
        let v = gate.child_exited(Start::Ready(t0 + ms(350)), false, t0 + ms(360));
        assert_eq!(v, Verdict::Replaced);
        assert_eq!(gate.held_until(t0 + ms(360), RATE), None);
    }

    #[test]
    fn a_resource_failure_holds_at_least_its_floor() {
        let t0 = Instant::now();
        let mut gate = SpawnGate::default();
        assert_eq!(gate.failed(t0, ms(250)), ms(250));
        assert_eq!(gate.held_until(t0, RATE), Some(t0 + ms(250)));
        gate.forget_failures();
        assert_eq!(gate.held_until(t0, RATE), None);
    }

    #[test]
    fn replacements_beyond_the_burst_wait_for_the_rate() {
        let t0 = Instant::now();
        let mut gate = SpawnGate::default();
        // Every worker of a large pool dies at once.
        for _ in 0..3 * RATE {
            let v = gate.child_exited(Start::Ready(t0), false, t0);
            assert_eq!(v, Verdict::Replaced);
        }
        // A burst of RATE is replaced at once...
        for _ in 0..RATE {
            assert_eq!(gate.held_until(t0, RATE), None);
            gate.forked(t0, RATE);
        }
        // ...then one each 1/RATE second.
        let until = gate.held_until(t0, RATE).expect("held past the burst");
        assert!(
            until > t0 && until <= t0 + interval(RATE),
            "{:?}",
            until - t0
        );
        gate.forked(until, RATE);
        let next = gate.held_until(until, RATE).expect("held again");
        assert_eq!(next - until, interval(RATE));
        // Forks that replace nothing (the pool growing) are not held.
        let mut growing = SpawnGate::default();
        for _ in 0..10 * RATE {
            assert_eq!(growing.held_until(t0, RATE), None);
            growing.forked(t0, RATE);
        }
        // The rate never grows the start-up back-off.
        let failure = gate.child_exited(Start::Awaited, false, t0 + ms(2));
        assert_eq!(failure, Verdict::FailedStart { delay: FIRST_DELAY });
    }

    #[test]
    fn a_reload_fails_on_a_start_failure_or_a_worker_that_dies_young() {
        let t0 = Instant::now();
        let fail = Verdict::FailedStart { delay: FIRST_DELAY };
        assert!(fails_a_reload(fail, t0, t0 + START_WINDOW * 5));
        assert!(fails_a_reload(Verdict::Replaced, t0, t0 + START_WINDOW / 2));
        assert!(!fails_a_reload(Verdict::Replaced, t0, t0 + START_WINDOW));
        assert!(!fails_a_reload(Verdict::Expected, t0, t0));
    }

    /// One worker's end in a drawn schedule.
    #[derive(Debug, Clone, Copy)]
    struct End {
        /// Milliseconds since the previous end.
        gap_ms: u64,
        /// Milliseconds from its fork to `Ready`, if it said it.
        ready_after_ms: Option<u64>,
        /// Milliseconds from its fork to its end.
        lived_ms: u64,
        asked: bool,
    }

    fn end() -> impl Strategy<Value = End> {
        (
            0u64..300,
            proptest::option::of(0u64..2_000),
            0u64..5_000,
            any::<bool>(),
        )
            .prop_map(|(gap_ms, ready_after_ms, lived_ms, asked)| End {
                gap_ms,
                ready_after_ms,
                lived_ms,
                asked,
            })
    }

    proptest! {
        /// A run of deaths of workers that had all said `Ready`, at any
        /// pace, never produces a delay; and replaced no faster than the
        /// rate, they are never held either.
        #[test]
        fn deaths_of_ready_workers_never_back_off(
            gaps in proptest::collection::vec(0u64..2_000, 1..200),
            ready_after_ms in proptest::collection::vec(0u64..2_000, 200),
            rate in 1u32..64,
        ) {
            let t0 = Instant::now();
            let mut gate = SpawnGate::default();
            let mut now = t0;
            for (gap, ready) in gaps.iter().zip(&ready_after_ms) {
                now += interval(rate) + ms(*gap);
                let forked = now.checked_sub(ms(*ready)).unwrap_or(now);
                let v = gate.child_exited(Start::Ready(forked), false, now);
                prop_assert_eq!(v, Verdict::Replaced);
                prop_assert_eq!(gate.held_until(now, rate), None);
                gate.forked(now, rate);
            }
        }

        /// The delay grows only with workers that never said `Ready`:
        /// each start-up failure doubles the delay before it unless a
        /// worker started after that failure, and the ends of workers
        /// that had started never hold spawns for the back-off.
        #[test]
        fn the_delay_grows_only_with_workers_that_never_started(
            ends in proptest::collection::vec(end(), 1..120),
        ) {
            let t0 = Instant::now() + Duration::from_secs(10);
            let mut gate = SpawnGate::default();
            let mut now = t0;
            // The last failure: when, and its delay.
            let mut last: Option<(Instant, Duration)> = None;
            let mut started_since = false;
            for e in &ends {
                now += ms(e.gap_ms);
                let forked = now.checked_sub(ms(e.lived_ms)).unwrap_or(t0);
                let start = match e.ready_after_ms {
                    Some(r) if r <= e.lived_ms => Start::Ready(forked + ms(r)),
                    _ => Start::Awaited,
                };
                if let (Some(at), Some((failed_at, _))) = (start.started_at(), last) {
                    started_since |= at > failed_at;
                }
                match gate.child_exited(start, e.asked, now) {
                    Verdict::FailedStart { delay } => {
                        prop_assert_eq!(start, Start::Awaited);
                        prop_assert!(!e.asked);
                        let expected = match last {
                            Some((_, d)) if !started_since => (d * 2).min(MAX_DELAY),
                            _ => FIRST_DELAY,
                        };
                        prop_assert_eq!(delay, expected);
                        last = Some((now, delay));
                        started_since = false;
                    }
                    Verdict::Replaced => {
                        prop_assert!(start.started_by(now) && !e.asked);
                    }
                    Verdict::Expected => prop_assert!(e.asked),
                }
                if started_since {
                    prop_assert!(!gate.failures_hold(now));
                }
            }
        }

        /// After a successful start, the pool is never held: once a
        /// worker has started after the last failure, nothing holds the
        /// next spawn (no replacement is owed here; the rate alone may
        /// space out replacements).
        #[test]
        fn after_a_successful_start_the_pool_is_never_held(
            failures in 1usize..40,
            ready_after_ms in 1u64..5_000,
        ) {
            let t0 = Instant::now();
            let mut gate = SpawnGate::default();
            for i in 0..failures {
                gate.child_exited(Start::Awaited, false, t0 + ms(i as u64));
            }
            let last = t0 + ms(failures as u64 - 1);
            let ready = last + ms(ready_after_ms);
            gate.started(ready);
            prop_assert_eq!(gate.held_until(ready, RATE), None);
            prop_assert!(!gate.failures_hold(ready));
        }

        /// A worker that says `Ready` and dies soon after, every time: the
        /// rate limit bounds the forks. Spawning whenever the gate allows
        /// (up to `max_children` at once), over any span of `L` seconds
        /// at most `rate × (L + 1) + max_children` workers are forked.
        #[test]
        fn a_crash_loop_of_ready_workers_is_bounded_by_the_rate(
            rate in 1u32..40,
            max_children in 1u32..40,
            life_ms in prop_oneof![0u64..50, 0u64..3_000],
        ) {
            let t0 = Instant::now();
            let mut gate = SpawnGate::default();
            let mut alive: Vec<Instant> = Vec::new(); // when each dies
            let mut forks: Vec<Instant> = Vec::new();
            let mut now = t0;
            while now < t0 + Duration::from_secs(8) {
                // Deaths first, then as many spawns as the gate allows.
                alive.retain(|dies| {
                    if *dies <= now {
                        let v = gate.child_exited(Start::Ready(*dies), false, now);
                        assert_eq!(v, Verdict::Replaced);
                        false
                    } else {
                        true
                    }
                });
                while gate.held_until(now, rate).is_none() && (alive.len() as u32) < max_children {
                    gate.forked(now, rate);
                    forks.push(now);
                    alive.push(now + ms(life_ms));
                }
                now += ms(1);
            }
            for (i, from) in forks.iter().enumerate() {
                for span_s in 1..=3u64 {
                    let to = *from + Duration::from_secs(span_s);
                    let n = forks[i..].iter().take_while(|t| **t < to).count() as u64;
                    let bound = u64::from(rate) * (span_s + 1) + u64::from(max_children);
                    prop_assert!(n <= bound, "{} forks in {}s, bound {}", n, span_s, bound);
                }
            }
            // And it does keep replacing them: the pool is not stuck (one
            // slot alone, replaced at once, or at the rate, would fork
            // about this many times in 8 s).
            let one_slot = 7_000 / (life_ms + 1);
            prop_assert!(forks.len() as u64 >= one_slot.min(7 * u64::from(rate)));
        }
    }
}
