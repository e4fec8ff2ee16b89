//! How long the busy children wait for the CPUs, as a rule with no I/O:
//! what the looks at the kernel's run-queue counters (taken by
//! `supervisor/cpu.rs`) say, remembered between looks, and when the next
//! look is due. The fact behind the scaling policy's hold
//! (`Decision::CpuBound`, see `policy/scaling.rs`).
//!
//! The kernel counts, for each process, the time it spent runnable but
//! waiting in a run queue (`/proc/PID/schedstat`, second field). Summed
//! over the busy children between two looks and divided by the time
//! between them, that is how many of them waited for a CPU on average:
//! near 0 while they wait on a database, a slow client or a lock (or the
//! machine has CPUs to spare), 1 or more once they take turns on the
//! CPUs. A rate over an interval, not a snapshot of who is running, so a
//! look that happens to catch the children between two requests does not
//! swing it.
//!
//! The kernel adds a wait to a process's total only when the wait ends,
//! as the process gets a CPU. A child that was runnable at two looks and
//! got no new turn on a CPU between them waited for whatever part of that
//! time it did not run, though its total may not have moved: with another
//! process holding the CPU (a database, a build, the clients themselves)
//! a short look would otherwise read no waiting at all and let the pool
//! grow. Such a child counts that part ([`Turns`]). Its CPU time tells a
//! child that ran all along on a CPU of its own apart (the kernel brings
//! it up to date at every scheduler tick: 4 ms at 250 Hz, 10 ms at
//! 100 Hz; the first look of a measurement comes 5 ms after the fresh
//! one).
//!
//! Waiting alone does not say the busy children compute. Children that
//! sleep through their requests (a database, a remote call, a timer) run
//! for a fraction of a millisecond as each request starts and ends, and
//! each of those moments may wait behind whatever holds the CPUs: the
//! workers the pool itself is starting (a fork, a preloaded template's
//! forks, an interpreter getting ready), or any other process. Such a
//! wait says the CPUs are busy with something else, not that a child more
//! would slow the busy ones: it would sleep beside them. So a look also
//! sums what the busy children used of the CPUs, or wanted, between the
//! two looks: a child asleep at both counts its CPU time alone (its waits
//! were wake-ups, and it went back to sleep); one runnable at either look
//! counts its waits too (it wanted a CPU there); one runnable at both
//! with no new turn counts the whole time (it ran or waited all along).
//! Only when that comes to [`COMPUTING`] (a quarter of the CPUs) or more
//! does their waiting count; below it the look reads no waiting at all.
//! Children that compute are runnable nearly all the time and fill the
//! CPUs they share (a CPU hog beside them takes a share, not all of it,
//! and what they wait for it still counts); children that sleep are
//! asleep at nearly every look and use next to no CPU, however long they
//! waited at their wake-ups. The same reading serves the dispatch width
//! (`policy/width.rs`), which the supervisor takes over every serving
//! child.
//!
//! Such a look, one that found the busy children asleep, also stands
//! when the pool starts a child ([`CpuWatch::changed`]): the new child
//! takes a connection of the same load and sleeps too, and the next look
//! ([`LOOK_INTERVAL`] later) checks it. Otherwise each spawn would start a
//! fresh measurement, the pool would hold for its 5 ms and grow again
//! from one child, and a burst of sleeping requests would get its
//! children one every 8-12 ms, 300 ms for 32 of them, where a pool
//! without the hold answered all 32 within 70 ms of each other
//! (docs/benchmarks/history.md, 2026-11-29). A look that found the
//! children computing, or the CPUs filling, still makes each spawn wait
//! for a fresh measurement.
//!
//! A look reads two small files per busy child (a few microseconds each),
//! at most once per [`LOOK_INTERVAL`] (the second of a fresh measurement
//! after [`FIRST_LOOK_AFTER`]), and only while at least as many children
//! are busy as there are CPUs (fewer cannot fill them). A look more than
//! [`LOOK_STALE`] after the one before starts measuring afresh: an average
//! over the quiet time before a burst would say nothing about the burst.
//! While a look holds the pool, the supervisor wakes for the next one.
//! The busy children's connection ends tell whether a hold is worth it
//! ([`HOLD_TURNOVER`]).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::observe::procfs::SchedStat;
use crate::scaling::{CpuUse, CPU_WAIT_CAREFUL, CPU_WAIT_HOLD, HOLD_TURNOVER};

/// The shortest time between two looks, and how long a result stands.
/// Under a steady load the answer does not change from one connection to
/// the next; 20 ms keeps the looks to 50 a second and still follows a
/// change of load within a few dozen connections.
pub(crate) const LOOK_INTERVAL: Duration = Duration::from_millis(20);

/// A look this long after the one before starts measuring afresh.
const LOOK_STALE: Duration = Duration::from_millis(100);

/// The second look of a fresh measurement comes this soon after the first:
/// the pool holds until it comes, and a load step should not wait the
/// whole [`LOOK_INTERVAL`] for its children. Children that take turns on
/// the CPUs wait several CPUs' worth of time in any 5 ms; children that
/// sleep wait next to none.
const FIRST_LOOK_AFTER: Duration = Duration::from_millis(5);

/// How long a look that found the CPUs taken stands against later looks
/// that did not: the pool holds until [`FREE_LOOKS`] looks in a row find
/// the CPUs free, and then grows one child at a time until this long has
/// passed. The children of a CPU-bound pool now and then all wait on
/// their clients at once, and one such look must not let it grow.
const FULL_MEMORY: Duration = Duration::from_secs(1);

/// Looks in a row (100 ms) that must find the CPUs free before a pool that
/// found them taken grows again.
const FREE_LOOKS: u32 = 5;

/// The share of the CPUs (thousandths) the busy children must use or
/// want between two looks for their waiting to count. Children that
/// compute fill the CPUs among them, and want them all the more beside a
/// process that takes its share. Children that sleep through their
/// requests use a few per cent however long they waited (a burst of 1 s
/// sleeps on 2 CPUs: their CPU time did not move between looks 5 ms
/// apart), where a CPU-bound Python pool under 16 clients on 2 CPUs
/// shared with builds read below a quarter at 1 look in about 500, and
/// then with next to no waiting.
pub(crate) const COMPUTING: u32 = 250;

/// One busy child's turns on the CPUs at a look, as the kernel reports
/// them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Turns {
    /// Its scheduler statistics (waits that ended only).
    pub sched: SchedStat,
    /// Whether it was runnable (running or waiting to) at the look.
    pub runnable: bool,
}

impl Turns {
    /// How long this child waited for a CPU between `before` and now,
    /// `elapsed_ns` apart: what its total says, or, when it was runnable
    /// at both looks and got no new turn on a CPU in between, all of that
    /// time it did not run (it was on a CPU at the first look, or waiting
    /// since before it, and has waited since).
    fn waited_since(&self, before: &Turns, elapsed_ns: u128) -> u128 {
        let ended = u128::from(self.sched.waited_ns.saturating_sub(before.sched.waited_ns));
        if self.runnable_through(before) {
            ended.max(elapsed_ns.saturating_sub(self.ran_since(before)))
        } else {
            ended
        }
    }

    /// How much of a CPU this child used or wanted between `before` and
    /// now, `elapsed_ns` apart: all of that time when it was runnable at
    /// both looks and got no new turn (it ran, or waited for a CPU, all
    /// along); its CPU time and its waits when it was runnable at either
    /// look (it wanted a CPU there); its CPU time alone when it was asleep
    /// at both (its waits were wake-ups, and it went back to sleep).
    fn wanted_since(&self, before: &Turns, elapsed_ns: u128) -> u128 {
        let wanted = if self.runnable_through(before) {
            elapsed_ns
        } else if self.runnable || before.runnable {
            self.ran_since(before) + self.waited_since(before, elapsed_ns)
        } else {
            self.ran_since(before)
        };
        wanted.min(elapsed_ns)
    }

    /// Its CPU time since `before`.
    fn ran_since(&self, before: &Turns) -> u128 {
        u128::from(self.sched.ran_ns.saturating_sub(before.sched.ran_ns))
    }

    /// Whether it was runnable at `before` and now, with no new turn on a
    /// CPU in between.
    fn runnable_through(&self, before: &Turns) -> bool {
        before.runnable && self.runnable && self.sched.timeslices == before.sched.timeslices
    }
}

/// The CPUs the pool may use and the busy children's run-queue waiting.
#[derive(Debug)]
pub(crate) struct CpuWatch {
    cpus: usize,
    /// When the last look was, and each busy child's waiting total then.
    last: Option<(Instant, HashMap<i32, Turns>)>,
    /// What the last look found.
    use_now: CpuUse,
    /// The last look that measured, as it found the CPUs: when, and the
    /// busy children waiting per CPU (thousandths), no memory applied.
    measured: Option<(Instant, u32)>,
    /// Whether the last look started a fresh measurement (the next one is
    /// due after [`FIRST_LOOK_AFTER`]).
    fresh: bool,
    /// When a look last found the CPUs taken.
    full_at: Option<Instant>,
    /// When a child last finished a connection.
    ended_at: Option<Instant>,
    /// When the last fresh measurement began: a burst's first requests
    /// get [`HOLD_TURNOVER`] to finish before the pool counts as stalled.
    burst_at: Option<Instant>,
    /// Looks in a row since then that found them free.
    free_looks: u32,
    /// Whether the last look that measured found the busy children using
    /// less than [`COMPUTING`] of the CPUs: they sleep, and a spawn does
    /// not call for a fresh measurement.
    asleep: bool,
}

impl Default for CpuWatch {
    /// The CPUs this process may run on: its affinity mask and, under
    /// cgroup v2, its CPU quota (what `std` reports).
    fn default() -> Self {
        CpuWatch {
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
            last: None,
            use_now: CpuUse::NotLooked,
            measured: None,
            fresh: false,
            full_at: None,
            ended_at: None,
            burst_at: None,
            free_looks: 0,
            asleep: false,
        }
    }
}

impl CpuWatch {
    /// When the next look must happen without an event, with `busy`
    /// children busy: while the last look holds the pool and they can
    /// fill the CPUs. A look that is due but was not taken (the pool's
    /// upkeep was busy with something else) is not a reason to spin.
    pub fn look_due(&self, busy: usize, now: Instant) -> Option<Instant> {
        if !self.use_now.holds() || !self.can_fill(busy) {
            return None;
        }
        self.next_look().filter(|t| *t > now)
    }

    /// Whether `busy` busy children can fill the CPUs (fewer are not
    /// looked at).
    pub fn can_fill(&self, busy: usize) -> bool {
        busy >= self.cpus
    }

    /// A child finished a connection at `now`.
    pub fn connection_ended(&mut self, now: Instant) {
        self.ended_at = Some(now);
    }

    /// Whether a child finished a connection less than [`LOOK_STALE`]
    /// before `now`: the pool is serving, and a look may find something.
    pub fn serving_at(&self, now: Instant) -> bool {
        self.ended_at
            .is_some_and(|at| now.saturating_duration_since(at) < LOOK_STALE)
    }

    /// What the last look says at `now`: a hold turns into careful growth
    /// once no child has finished a connection for [`HOLD_TURNOVER`].
    pub fn use_at(&self, now: Instant) -> CpuUse {
        let turning_over = self
            .ended_at
            .max(self.burst_at)
            .is_some_and(|at| now.saturating_duration_since(at) < HOLD_TURNOVER);
        match self.use_now {
            CpuUse::Waiting(per_cpu) if per_cpu >= CPU_WAIT_HOLD && !turning_over => {
                CpuUse::Stalled
            }
            other => other,
        }
    }

    /// When the next look is due, if there was one before.
    pub fn next_look(&self) -> Option<Instant> {
        let interval = if self.fresh {
            FIRST_LOOK_AFTER
        } else {
            LOOK_INTERVAL
        };
        self.last.as_ref().map(|(at, _)| *at + interval)
    }

    /// What a look that measured `per_cpu` says, once the looks before it
    /// are counted in (see [`FULL_MEMORY`]).
    fn remembered(&mut self, per_cpu: u32, now: Instant) -> u32 {
        if per_cpu >= CPU_WAIT_HOLD {
            self.full_at = Some(now);
            self.free_looks = 0;
            return per_cpu;
        }
        self.free_looks = self.free_looks.saturating_add(1);
        let recent = self
            .full_at
            .is_some_and(|at| now.saturating_duration_since(at) < FULL_MEMORY);
        match (recent, self.free_looks < FREE_LOOKS) {
            (true, true) => CPU_WAIT_HOLD,
            (true, false) => per_cpu.max(CPU_WAIT_CAREFUL),
            (false, _) => per_cpu,
        }
    }

    /// A look at `now` found the busy children's turns on the CPUs, by
    /// pid: how many of them waited for a CPU on average since the look
    /// before, per CPU, in thousandths, counted only when they used or
    /// wanted [`COMPUTING`] of the CPUs (see the module docs). A look long
    /// after the one before starts measuring afresh.
    pub fn look(&mut self, turns: HashMap<i32, Turns>, now: Instant) {
        let fresh = self
            .last
            .as_ref()
            .is_none_or(|(at, _)| now.saturating_duration_since(*at) >= LOOK_STALE);
        self.use_now = match &self.last {
            Some((at, before)) if !fresh => {
                let elapsed = now.saturating_duration_since(*at).as_nanos().max(1);
                let (measured, waited, wanted) = turns
                    .iter()
                    .filter_map(|(pid, t)| before.get(pid).map(|b| (t, b)))
                    .fold((0, 0u128, 0u128), |(n, waited, wanted), (t, b)| {
                        (
                            n + 1,
                            waited + t.waited_since(b, elapsed),
                            wanted + t.wanted_since(b, elapsed),
                        )
                    });
                let of_cpus = |ns: u128| {
                    u32::try_from(ns * 1000 / (elapsed * self.cpus as u128)).unwrap_or(u32::MAX)
                };
                // No child busy at both looks: nothing says they sleep.
                self.asleep = measured > 0 && of_cpus(wanted) < COMPUTING;
                let per_cpu = if self.asleep { 0 } else { of_cpus(waited) };
                self.measured = Some((now, per_cpu));
                CpuUse::Waiting(self.remembered(per_cpu, now))
            }
            _ => {
                self.asleep = false;
                CpuUse::Measuring
            }
        };
        if fresh {
            self.burst_at = Some(now);
        }
        self.fresh = fresh;
        self.last = Some((now, turns));
    }

    /// How much of the time since the last look the children `of` picks
    /// used or wanted a CPU, as a look at `now` with `turns` would count
    /// it (see [`Turns`]), in thousandths of their time together; `None`
    /// without a look before that was recent, or with none of them seen at
    /// both looks. Read before [`CpuWatch::look`] takes the same turns.
    pub fn wanted_share(
        &self,
        turns: &HashMap<i32, Turns>,
        of: impl Fn(i32) -> bool,
        now: Instant,
    ) -> Option<u32> {
        let (at, before) = self.last.as_ref()?;
        let elapsed = now.saturating_duration_since(*at);
        if elapsed >= LOOK_STALE {
            return None;
        }
        let elapsed = elapsed.as_nanos().max(1);
        let (children, wanted) = turns
            .iter()
            .filter(|(pid, _)| of(**pid))
            .filter_map(|(pid, t)| before.get(pid).map(|b| t.wanted_since(b, elapsed)))
            .fold((0u128, 0u128), |(n, wanted), w| (n + 1, wanted + w));
        (children > 0)
            .then(|| u32::try_from(wanted * 1000 / (children * elapsed)).unwrap_or(u32::MAX))
    }

    /// Whether the last look found the busy children asleep and lets the
    /// pool grow at its usual pace (not while it remembers the CPUs taken).
    fn found_asleep(&self) -> bool {
        self.asleep && matches!(self.use_now, CpuUse::Waiting(w) if w < CPU_WAIT_CAREFUL)
    }

    /// The last look that measured: when, and how many busy children
    /// waited for a CPU per CPU (thousandths), as that look alone found
    /// it (the dispatch width narrows on this, one step per look).
    pub fn last_measure(&self) -> Option<(Instant, u32)> {
        self.measured
    }

    /// The CPUs the pool may use.
    pub fn cpus(&self) -> usize {
        self.cpus
    }

    /// A child was started, or the dispatch width widened: a look from
    /// before it no longer says how the pool uses the CPUs. A fresh
    /// measurement decides (the pool holds for its 5 ms), so one low look
    /// cannot let several spawns through. Unless that look found the busy
    /// children asleep, with the CPUs free: the new child sleeps beside
    /// them, and the next look, due as before, checks it.
    pub fn changed(&mut self) {
        let stands = self.found_asleep();
        if matches!(self.use_now, CpuUse::Waiting(_) | CpuUse::Stalled) && !stands {
            self.use_now = CpuUse::Measuring;
            self.last = None;
        }
        self.measured = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn watch() -> CpuWatch {
        CpuWatch {
            cpus: 2,
            ..CpuWatch::default()
        }
    }

    fn turns(waited_ns: u64, timeslices: u64, runnable: bool) -> Turns {
        Turns {
            sched: SchedStat {
                ran_ns: 5_000_000 + 1_000 * timeslices,
                waited_ns,
                timeslices,
            },
            runnable,
        }
    }

    #[test]
    fn the_share_a_look_would_read_counts_only_the_children_asked_for() {
        let t0 = Instant::now();
        let mut w = watch();
        let none = HashMap::new();
        assert_eq!(w.wanted_share(&none, |_| true, t0), None, "no look before");
        // Runnable all along with no new turn, and asleep with no CPU time.
        let both = HashMap::from([(1, turns(100, 3, true)), (2, turns(100, 3, false))]);
        w.look(both.clone(), t0);
        let t1 = t0 + LOOK_INTERVAL;
        assert_eq!(w.wanted_share(&both, |_| true, t1), Some(500));
        assert_eq!(w.wanted_share(&both, |pid| pid == 1, t1), Some(1000));
        assert_eq!(w.wanted_share(&both, |pid| pid == 2, t1), Some(0));
        assert_eq!(
            w.wanted_share(&both, |pid| pid == 3, t1),
            None,
            "not seen before"
        );
        let later = t0 + LOOK_STALE;
        assert_eq!(w.wanted_share(&both, |_| true, later), None, "stale");
    }

    #[test]
    fn a_child_that_got_no_cpu_between_two_looks_waited_all_of_it() {
        let t0 = Instant::now();
        let t1 = t0 + FIRST_LOOK_AFTER;
        let looked = |before: [Turns; 2], after: [Turns; 2]| {
            let mut w = watch();
            w.look(HashMap::from([(1, before[0]), (2, before[1])]), t0);
            w.look(HashMap::from([(1, after[0]), (2, after[1])]), t1);
            w.use_now
        };
        // Two children runnable at both looks that never got the CPU (a
        // process outside the pool held it): their totals have not moved,
        // but both waited the whole 5 ms, one per CPU.
        let waiting = turns(100, 3, true);
        assert_eq!(looked([waiting; 2], [waiting; 2]), CpuUse::Waiting(1000));
        // One got the CPU in between: only what its total says counts.
        let ran = turns(100 + 1_000_000, 4, true);
        assert_eq!(looked([waiting; 2], [ran, waiting]), CpuUse::Waiting(600));
        // Running all along on a CPU of its own: same timeslice, but its
        // CPU time moved. Not waiting.
        let mut running = waiting;
        running.sched.ran_ns += FIRST_LOOK_AFTER.as_nanos() as u64;
        assert_eq!(looked([waiting; 2], [running; 2]), CpuUse::Waiting(0));
        // Asleep at either look (a database, a slow client): it may never
        // have wanted the CPU, and only its total counts.
        let asleep = turns(100, 3, false);
        assert_eq!(looked([asleep; 2], [waiting; 2]), CpuUse::Waiting(0));
        assert_eq!(looked([waiting; 2], [asleep; 2]), CpuUse::Waiting(0));
        // A total that says more than the time between wins.
        let long = turns(100 + 2 * FIRST_LOOK_AFTER.as_nanos() as u64, 3, true);
        assert_eq!(looked([waiting; 2], [long, waiting]), CpuUse::Waiting(1500));
    }

    /// A busy child's turns: CPU time and waits (ns), turns on a CPU, and
    /// whether it was runnable at the look.
    fn child(ran_ns: u64, waited_ns: u64, timeslices: u64, runnable: bool) -> Turns {
        Turns {
            sched: SchedStat {
                ran_ns,
                waited_ns,
                timeslices,
            },
            runnable,
        }
    }

    /// Two looks 5 ms apart at the same two busy children, on 2 CPUs.
    fn two_looks(w: &mut CpuWatch, before: Turns, after: Turns, t0: Instant) -> Instant {
        let t1 = t0 + FIRST_LOOK_AFTER;
        w.look(HashMap::from([(1, before), (2, before)]), t0);
        w.look(HashMap::from([(1, after), (2, after)]), t1);
        t1
    }

    #[test]
    fn children_asleep_at_both_looks_do_not_hold_the_pool_however_long_they_waited() {
        let t0 = Instant::now();
        let looked = |after: Turns| {
            let mut w = watch();
            two_looks(&mut w, child(1_000_000, 0, 10, false), after, t0);
            w.use_now
        };
        // Each woken once between the looks, kept waiting 6 ms for a CPU
        // behind the workers the pool is starting, 0.1 ms on it, and
        // asleep again: 1.2 waiting per CPU by their totals, but they
        // used 2% of the CPUs. A child more would sleep beside them.
        assert_eq!(
            looked(child(1_100_000, 6_000_000, 11, false)),
            CpuUse::Waiting(0)
        );
        // The same waits, but runnable at the look: they want the CPUs
        // (a CPU hog beside them takes its share), and the pool holds.
        assert_eq!(
            looked(child(1_100_000, 6_000_000, 11, true)),
            CpuUse::Waiting(1200)
        );
        // Asleep at both looks, but they ran a quarter of the CPUs in
        // between (2.5 ms of the 10 ms two CPUs have in 5 ms): they
        // compute, and their waits count. Just under it, they do not.
        assert_eq!(
            looked(child(2_250_000, 6_000_000, 14, false)),
            CpuUse::Waiting(1200)
        );
        assert_eq!(
            looked(child(2_249_000, 6_000_000, 14, false)),
            CpuUse::Waiting(0)
        );
    }

    #[test]
    fn a_look_that_found_the_children_asleep_stands_when_a_child_starts() {
        let t0 = Instant::now();
        let asleep = (
            child(1_000_000, 0, 10, false),
            child(1_050_000, 0, 11, false),
        );
        // The pool grows as the look let it, with no fresh measurement,
        // and looks again when it would have anyway.
        let mut w = watch();
        let t1 = two_looks(&mut w, asleep.0, asleep.1, t0);
        assert_eq!(w.use_now, CpuUse::Waiting(0));
        w.changed();
        assert_eq!(w.use_now, CpuUse::Waiting(0));
        assert_eq!(w.next_look(), Some(t1 + LOOK_INTERVAL));
        // Children that compute on CPUs of their own, waiting for none:
        // the next spawn waits for a fresh measurement, as before.
        let mut w = watch();
        let ran = FIRST_LOOK_AFTER.as_nanos() as u64;
        two_looks(
            &mut w,
            child(1_000_000, 0, 10, true),
            child(1_000_000 + ran, 0, 10, true),
            t0,
        );
        assert_eq!(w.use_now, CpuUse::Waiting(0));
        w.changed();
        assert_eq!(w.use_now, CpuUse::Measuring);
        // Asleep, but the pool found the CPUs taken a moment ago: it
        // holds until five free looks, and whatever then starts a child
        // is measured afresh.
        let mut w = watch();
        w.full_at = Some(t0);
        two_looks(&mut w, asleep.0, asleep.1, t0);
        assert_eq!(w.use_now, CpuUse::Waiting(CPU_WAIT_HOLD));
        w.changed();
        assert_eq!(w.use_now, CpuUse::Measuring);
    }

    #[test]
    fn a_hold_lasts_only_while_children_finish_connections() {
        let mut w = watch();
        let t0 = Instant::now();
        w.use_now = CpuUse::Waiting(3000);
        // No connection has ended yet: long requests, grow carefully.
        assert_eq!(w.use_at(t0), CpuUse::Stalled);
        w.connection_ended(t0);
        assert_eq!(w.use_at(t0 + HOLD_TURNOVER / 2), CpuUse::Waiting(3000));
        assert_eq!(w.use_at(t0 + HOLD_TURNOVER), CpuUse::Stalled);
        // Only a hold turns into careful growth.
        w.use_now = CpuUse::Waiting(CPU_WAIT_HOLD - 1);
        assert_eq!(
            w.use_at(t0 + HOLD_TURNOVER),
            CpuUse::Waiting(CPU_WAIT_HOLD - 1)
        );
        w.use_now = CpuUse::Measuring;
        assert_eq!(w.use_at(t0 + HOLD_TURNOVER), CpuUse::Measuring);
        // A burst's first requests get the turnover time to finish.
        let mut w = watch();
        w.use_now = CpuUse::Waiting(3000);
        w.burst_at = Some(t0);
        assert_eq!(w.use_at(t0 + HOLD_TURNOVER / 2), CpuUse::Waiting(3000));
        assert_eq!(w.use_at(t0 + HOLD_TURNOVER), CpuUse::Stalled);
    }

    #[test]
    fn a_child_started_after_a_look_is_measured_afresh_before_the_next_spawn() {
        let t0 = Instant::now();
        let t1 = t0 + FIRST_LOOK_AFTER;
        for measured in [0, CPU_WAIT_CAREFUL, CPU_WAIT_HOLD] {
            let mut w = watch();
            w.look(HashMap::new(), t0);
            w.look(HashMap::new(), t1);
            w.use_now = CpuUse::Waiting(measured);
            w.changed();
            // The pool holds, and the next look (due at once) starts a
            // fresh measurement whose second look comes 5 ms later.
            assert_eq!(w.use_now, CpuUse::Measuring, "after Waiting({measured})");
            assert_eq!(w.next_look(), None);
            w.look(HashMap::new(), t1);
            assert_eq!(w.use_now, CpuUse::Measuring);
            assert_eq!(w.next_look(), Some(t1 + FIRST_LOOK_AFTER));
        }
        // Behind long requests too.
        let mut w = watch();
        w.use_now = CpuUse::Stalled;
        w.changed();
        assert_eq!(w.use_now, CpuUse::Measuring);
        // Not looked at (too few busy to fill the CPUs): nothing to redo.
        let mut w = watch();
        w.changed();
        assert_eq!(w.use_now, CpuUse::NotLooked);
    }

    #[test]
    fn a_holding_pool_wakes_for_its_next_look() {
        let mut w = watch();
        let t0 = Instant::now();
        w.last = Some((t0, HashMap::new()));
        w.fresh = true;
        w.use_now = CpuUse::Measuring;
        assert_eq!(w.look_due(2, t0), Some(t0 + FIRST_LOOK_AFTER));
        // Too few busy to fill the CPUs: no look, no wake.
        assert_eq!(w.look_due(1, t0), None);
        // Past due (the loop did not look): no wake, or it would spin.
        assert_eq!(w.look_due(2, t0 + FIRST_LOOK_AFTER), None);
        w.fresh = false;
        w.use_now = CpuUse::Waiting(CPU_WAIT_HOLD);
        assert_eq!(w.look_due(2, t0), Some(t0 + LOOK_INTERVAL));
        // Not holding: the next event is soon enough.
        w.use_now = CpuUse::Waiting(CPU_WAIT_HOLD - 1);
        assert_eq!(w.look_due(2, t0), None);
    }

    #[test]
    fn a_fresh_measurement_looks_again_sooner() {
        let mut w = watch();
        let t0 = Instant::now();
        assert_eq!(w.next_look(), None);
        w.last = Some((t0, HashMap::new()));
        w.fresh = true;
        assert_eq!(w.next_look(), Some(t0 + FIRST_LOOK_AFTER));
        w.fresh = false;
        assert_eq!(w.next_look(), Some(t0 + LOOK_INTERVAL));
    }

    #[test]
    fn a_pool_that_found_the_cpus_taken_grows_only_after_five_free_looks_then_carefully() {
        let mut w = watch();
        let t0 = Instant::now();
        let at = |n: u32| t0 + LOOK_INTERVAL * n;
        // Never taken: each look says what it measured.
        assert_eq!(w.remembered(100, at(0)), 100);
        assert_eq!(w.remembered(CPU_WAIT_HOLD, at(1)), CPU_WAIT_HOLD);
        // Then four free looks still hold, the fifth lets it grow, one
        // child at a time.
        for n in 2..6 {
            assert_eq!(w.remembered(100, at(n)), CPU_WAIT_HOLD, "look {n}");
        }
        assert_eq!(w.remembered(100, at(6)), CPU_WAIT_CAREFUL);
        // A taken look starts the count again.
        assert_eq!(w.remembered(1500, at(7)), 1500);
        assert_eq!(w.remembered(0, at(8)), CPU_WAIT_HOLD);
        // Long after the last taken look, a look is taken at its word.
        let later = at(7) + FULL_MEMORY;
        assert_eq!(w.remembered(0, later), 0);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            /// Busy children asleep at both looks, however long they
            /// waited in between: their waiting holds the pool only when
            /// their CPU time came to a quarter of the CPUs; below that a
            /// look reads no waiting, and a child started after it does
            /// not wait for a fresh measurement.
            #[test]
            fn sleeping_children_hold_only_when_they_used_a_quarter_of_the_cpus(
                cpus in 1usize..5,
                children in proptest::collection::vec(
                    (0u64..3_000_000, 0u64..20_000_000, 1u64..4),
                    1..40,
                ),
                elapsed_ms in 5u64..30,
            ) {
                let t0 = Instant::now();
                let elapsed = Duration::from_millis(elapsed_ms);
                let mut w = CpuWatch { cpus, ..CpuWatch::default() };
                let before: HashMap<i32, Turns> = (0..children.len() as i32)
                    .map(|pid| (pid, child(1_000_000, 1_000_000, 10, false)))
                    .collect();
                let after: HashMap<i32, Turns> = children
                    .iter()
                    .zip(0..)
                    .map(|(&(ran, waited, turns), pid)| {
                        (pid, child(1_000_000 + ran, 1_000_000 + waited, 10 + turns, false))
                    })
                    .collect();
                w.look(before, t0);
                w.look(after, t0 + elapsed);
                let capacity = u128::from(elapsed_ms) * 1_000_000 * cpus as u128;
                let share = |ns: u64| (u128::from(ns) * 1000 / capacity) as u32;
                let ran: u64 = children.iter().map(|c| c.0).sum();
                let waited: u64 = children.iter().map(|c| c.1).sum();
                if share(ran) >= COMPUTING {
                    prop_assert_eq!(w.use_now, CpuUse::Waiting(share(waited)));
                } else {
                    prop_assert_eq!(w.use_now, CpuUse::Waiting(0));
                    w.changed();
                    prop_assert_eq!(w.use_now, CpuUse::Waiting(0));
                    prop_assert!(!w.use_now.holds() && !w.use_now.careful());
                }
            }
        }
    }
}
