//! Scale-up: how fast a resting pool grows to serve a load step.
//!
//! A pool is started with `--min-spare 2 --min-children 2 --max-children
//! 64` and left to settle at 2 children. Then 64 clients start at once,
//! each sending `?work_ms=50` requests back to back, close per request, so
//! the load needs all 64 children busy at all times. Two clocks are read:
//! - *forked*: children alive, polled from `/proc` every 5 ms (this gives
//!   the measured curve);
//! - *serving*: a child counts from its first answer, told apart by its
//!   `X-Forkpool-Slot`. The 64th distinct slot's first response completed
//!   at some time T; that child started the request at about T - 50 ms, and
//!   that is the reported time. It assumes slot numbers are not reused
//!   during the ramp, which holds while nothing is retired.
//!
//! The first second's p99 is over requests *sent* in that second, so a
//! request that waited in the backlog for a child counts with its wait.
//!
//! Beside the measurements, [`simulate`] replays the same step with the
//! same policy at both cadences, once an event and once a second.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use forkpool::config::{DispatchMode, PoolConfig};
use serde::Serialize;

use super::latency::{self, Percentiles};
use super::loadgen::{self, ConnectionMode, ErrorCounts, Sample};
use super::pool_process::PoolProcess;
use super::procstat;
use super::simulate::{self, Cadence, Point, Scenario};
use super::target::Target;
use super::{pool_args, progress, BenchArgs, POOL_START, POOL_STOP};

/// Clients in the load step, and the pool's ceiling.
pub const CLIENTS: u32 = 64;
/// Work per request, in milliseconds.
pub const WORK_MS: u64 = 50;
/// Children at rest.
const AT_REST: u32 = 2;
/// How often the measured curve samples the child count.
const POLL: Duration = Duration::from_millis(5);
/// The simulation's time from spawn decision to a ready child: a
/// fork plus the child's setup, generously rounded up.
const SIM_SPAWN_DELAY: Duration = Duration::from_millis(10);

/// The scale-up benchmark's results.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleupReport {
    /// Clients in the load step.
    pub clients: u32,
    /// Work per request, in milliseconds.
    pub work_ms: u64,
    /// One measured run per dispatch mode.
    pub runs: Vec<ScaleupRun>,
    /// The policy replayed on a simulated clock.
    pub simulated: Simulated,
}

/// One dispatch mode's measured scale-up.
#[derive(Debug, Clone, Serialize)]
pub struct ScaleupRun {
    /// The dispatch mode.
    pub dispatch: DispatchMode,
    /// Milliseconds from the load step until 64 children were alive.
    pub forked_all_ms: Option<u64>,
    /// Milliseconds from the load step until the 64th distinct slot began
    /// serving (see the module docs).
    pub serving_all_ms: Option<u64>,
    /// Distinct slots that answered during the run.
    pub slots_seen: usize,
    /// Requests sent in the first second (and answered).
    pub first_second_requests: u64,
    /// Latency percentiles of those requests.
    pub first_second: Percentiles,
    /// Failed requests over the run.
    pub errors: ErrorCounts,
    /// Live children over time, polled from `/proc`.
    pub children: Vec<Point>,
}

/// The simulated curves.
#[derive(Debug, Clone, Serialize)]
pub struct Simulated {
    /// The assumed spawn-to-ready delay, in milliseconds.
    pub spawn_delay_ms: u64,
    /// `decide` after every event (forkpool's cadence).
    pub every_event: Vec<Point>,
    /// `decide` once a second (Apache prefork's cadence).
    pub every_second: Vec<Point>,
}

/// Runs the simulation and one measured ramp per mode in `args`; modes that
/// cannot be measured are explained in `notes`.
pub fn run(args: &BenchArgs, notes: &mut Vec<String>) -> ScaleupReport {
    let scenario = Scenario {
        config: PoolConfig {
            min_children: AT_REST,
            min_spare: 2,
            max_children: CLIENTS,
            ..PoolConfig::default()
        },
        clients: CLIENTS,
        work: Duration::from_millis(WORK_MS),
        spawn_delay: SIM_SPAWN_DELAY,
        horizon: Duration::from_secs(10),
    };
    let simulated = Simulated {
        spawn_delay_ms: SIM_SPAWN_DELAY.as_millis() as u64,
        every_event: simulate::simulate(&scenario, Cadence::EveryEvent),
        every_second: simulate::simulate(&scenario, Cadence::EverySecond),
    };
    let mut runs = Vec::new();
    for &mode in &args.modes {
        progress(&format!("scaleup forkpool/{mode}"));
        match measure(mode, args) {
            Ok(run) => {
                progress(&format!(
                    "  64 forked at {:?} ms, 64 serving at {:?} ms",
                    run.forked_all_ms, run.serving_all_ms
                ));
                runs.push(run);
            }
            Err(why) => {
                progress(&format!("  {why}"));
                notes.push(format!("scaleup of forkpool/{mode}: {why}"));
            }
        }
    }
    ScaleupReport {
        clients: CLIENTS,
        work_ms: WORK_MS,
        runs,
        simulated,
    }
}

fn measure(mode: DispatchMode, args: &BenchArgs) -> Result<ScaleupRun, String> {
    let extra = [
        "--min-spare",
        "2",
        "--min-children",
        "2",
        "--max-children",
        "64",
    ];
    let pool = PoolProcess::start_demo(&pool_args(mode, &extra), POOL_START)?;
    let resting = pool.settle(
        AT_REST as usize,
        Duration::from_millis(200),
        Duration::from_secs(5),
    )?;
    let resting = (Instant::now(), resting.len() as u32);
    let target = Target::at(pool.addr(), &format!("/?work_ms={WORK_MS}"));
    let mut spec = args.load(target, ConnectionMode::Close, CLIENTS as usize);
    spec.warmup = Duration::ZERO;
    spec.duration = args.duration.max(Duration::from_secs(2));
    spec.trace = true;
    let stop = AtomicBool::new(false);
    let pid = pool.pid();
    let (outcome, counts) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| watch_children(pid, resting, &stop));
        let outcome = loadgen::run(&spec, &mut |_| {});
        stop.store(true, Ordering::Relaxed);
        (outcome, watcher.join().unwrap_or_default())
    });
    let outcome = outcome?;
    pool.stop(POOL_STOP)?;
    let children: Vec<Point> = counts
        .into_iter()
        .map(|(at, children)| Point {
            ms: at.saturating_duration_since(outcome.started).as_millis() as u64,
            children,
        })
        .collect();
    let (slots_seen, serving_all) = serving_all(
        &outcome.samples,
        CLIENTS as usize,
        Duration::from_millis(WORK_MS),
    );
    let (first_second_requests, first_second) = first_second(&outcome.samples);
    Ok(ScaleupRun {
        dispatch: mode,
        forked_all_ms: simulate::time_to(&children, CLIENTS),
        serving_all_ms: serving_all.map(|d| d.as_millis() as u64),
        slots_seen,
        first_second_requests,
        first_second,
        errors: outcome.errors,
        children,
    })
}

/// The child count of `pid` at each change, from the `resting` count taken
/// before the load until `stop`.
fn watch_children(pid: i32, resting: (Instant, u32), stop: &AtomicBool) -> Vec<(Instant, u32)> {
    let mut counts = vec![resting];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if let Ok(children) = procstat::children_of(pid) {
            let n = children.len() as u32;
            if counts.last().is_some_and(|&(_, last)| last != n) {
                counts.push((now, n));
            }
        }
        std::thread::sleep(POLL);
    }
    counts
}

/// How many distinct slots answered, and when the `want`-th of them began
/// serving (its first response's completion minus `work`).
fn serving_all(samples: &[Sample], want: usize, work: Duration) -> (usize, Option<Duration>) {
    let mut by_completion: Vec<&Sample> = samples.iter().filter(|s| s.status == 200).collect();
    by_completion.sort_by_key(|s| s.sent + s.latency);
    let mut seen = std::collections::HashSet::new();
    let mut reached = None;
    for sample in by_completion {
        if let Some(slot) = sample.slot {
            if seen.insert(slot) && seen.len() == want {
                reached = Some((sample.sent + sample.latency).saturating_sub(work));
            }
        }
    }
    (seen.len(), reached)
}

/// Requests sent in the first second that were answered, and their latency.
fn first_second(samples: &[Sample]) -> (u64, Percentiles) {
    let mut histogram = latency::histogram();
    for sample in samples
        .iter()
        .filter(|s| s.status == 200 && s.sent < Duration::from_secs(1))
    {
        latency::record(&mut histogram, sample.latency);
    }
    (histogram.len(), Percentiles::of(&histogram))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(sent_ms: u64, latency_ms: u64, slot: u32) -> Sample {
        Sample {
            sent: Duration::from_millis(sent_ms),
            latency: Duration::from_millis(latency_ms),
            status: 200,
            slot: Some(slot),
        }
    }

    #[test]
    fn serving_counts_from_the_first_answer_of_the_last_new_slot() {
        let samples = [
            sample(0, 50, 0),
            sample(0, 300, 2), // waited 250 ms for slot 2, which began at 250
            sample(0, 120, 1), // slot 1 began at 70
            sample(50, 50, 0),
            sample(400, 50, 2),
        ];
        let work = Duration::from_millis(50);
        assert_eq!(
            serving_all(&samples, 3, work),
            (3, Some(Duration::from_millis(250)))
        );
        assert_eq!(serving_all(&samples, 4, work), (3, None));
    }

    #[test]
    fn first_second_is_by_send_time() {
        let samples = [sample(0, 10, 0), sample(900, 400, 1), sample(1000, 1, 0)];
        let (n, p) = first_second(&samples);
        assert_eq!(n, 2);
        assert!((p.max_ms - 400.0).abs() < 1.0, "{p:?}");
    }
}
