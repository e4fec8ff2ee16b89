//! Per-process figures from `/proc/PID/*`: CPU time, memory (RSS, PSS,
//! USS) and the kernel's view of where the process waits.
//!
//! Why USS/PSS and not RSS: children of a preforked pool share most of
//! their pages with the supervisor (copy-on-write after `fork`), and RSS
//! counts every shared page in full in every child. A child's RSS can be
//! large while it costs almost nothing; USS (pages only this process maps)
//! is what the system gets back when it exits, and PSS (shared pages split
//! between their users) adds up to the pool's real footprint.

use std::collections::HashMap;
use std::io::{self, Read};
use std::time::{Duration, Instant};

/// The text of a `/proc` file, read 4 KiB at a time. `read_to_string`
/// first asks for the file's size, which procfs gives as 0, then reads
/// in pieces that start at 32 bytes and double: nine system calls for a
/// `stat`, where this makes four (open, read, the read that finds the
/// end, close). The supervisor reads two such files of every serving
/// child fifty times a second under load (`supervisor::cpu`).
pub fn read_proc(path: &str) -> io::Result<String> {
    let mut file = std::fs::File::open(path)?;
    let mut text = Vec::new();
    let mut piece = [0u8; 4096];
    loop {
        match file.read(&mut piece) {
            Ok(0) => break,
            Ok(n) => text.extend_from_slice(&piece[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    String::from_utf8(text)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{path}: {e}")))
}

/// Figures from `/proc/PID/stat` that the supervisor uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// The one-letter state (`R`, `S`, `D`, `Z`, ...).
    pub state: char,
    /// The parent's process id.
    pub ppid: i32,
    /// Its process group (field 5).
    pub pgrp: i32,
    /// CPU time in user mode, in clock ticks.
    pub utime_ticks: u64,
    /// CPU time in kernel mode, in clock ticks.
    pub stime_ticks: u64,
    /// When it started, in clock ticks since boot (field 22).
    pub start_ticks: u64,
}

/// Parses the text of `/proc/PID/stat`. The command name (field 2) is in
/// parentheses and may itself hold spaces and `)`, so fields are counted
/// from the last `)`.
pub fn parse_stat(text: &str) -> Result<Stat, String> {
    let close = text
        .rfind(')')
        .ok_or_else(|| "no ')' after the command name".to_string())?;
    // After ") ": field 3 (state) is index 0, utime (field 14) is index 11.
    let fields: Vec<&str> = text[close + 1..].split_whitespace().collect();
    let field = |i: usize, name: &str| -> Result<u64, String> {
        fields
            .get(i)
            .ok_or_else(|| format!("{name} missing"))?
            .parse()
            .map_err(|e| format!("{name}: {e}"))
    };
    let state = fields
        .first()
        .and_then(|s| s.chars().next())
        .ok_or_else(|| "state missing".to_string())?;
    Ok(Stat {
        state,
        ppid: field(1, "ppid")? as i32,
        pgrp: field(2, "pgrp")? as i32,
        utime_ticks: field(11, "utime")?,
        stime_ticks: field(12, "stime")?,
        start_ticks: field(19, "starttime")?,
    })
}

/// The parent of `pid`, from `/proc/PID/stat`; `None` if it is gone.
pub fn parent_of(pid: i32) -> Option<i32> {
    stat_of(pid).map(|s| s.ppid)
}

/// The boot clock now in the clock ticks `/proc/PID/stat` counts a
/// start in (rounded down, so a process started from now on has a start
/// at or above it).
pub fn boot_ticks_now() -> io::Result<u64> {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_BOOTTIME)?;
    let ticks = clock_ticks_per_second()?;
    let ns = u64::try_from(now.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(now.tv_nsec()).unwrap_or(0);
    Ok(ns / (1_000_000_000 / ticks.max(1)))
}

/// `pid`'s record in `/proc/PID/stat`; `None` if it is gone.
pub fn stat_of(pid: i32) -> Option<Stat> {
    let text = read_proc(&format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text).ok()
}

/// What `/proc/PID/schedstat` says of a process's turns on the CPUs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SchedStat {
    /// Nanoseconds spent on a CPU, as of the kernel's last update (at
    /// least every scheduler tick while it runs).
    pub ran_ns: u64,
    /// Nanoseconds spent runnable in a run queue, waiting for a CPU. The
    /// kernel adds a wait when it ends (the process gets a CPU), so a
    /// wait still going on is not in it yet.
    pub waited_ns: u64,
    /// Times the process got a CPU.
    pub timeslices: u64,
}

/// `pid`'s scheduler statistics (`/proc/PID/schedstat`: on a CPU,
/// waiting, timeslices); `None` if it is gone or the kernel keeps none.
pub fn sched_stat(pid: i32) -> Option<SchedStat> {
    let text = read_proc(&format!("/proc/{pid}/schedstat")).ok()?;
    parse_schedstat(&text)
}

/// The three fields of a `schedstat` line: on a CPU, waiting, timeslices.
pub fn parse_schedstat(text: &str) -> Option<SchedStat> {
    let mut fields = text.split_whitespace();
    Some(SchedStat {
        ran_ns: fields.next()?.parse().ok()?,
        waited_ns: fields.next()?.parse().ok()?,
        timeslices: fields.next()?.parse().ok()?,
    })
}

/// Memory of one process, in bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Memory {
    /// Resident set size: every page mapped and present, shared or not.
    pub rss_bytes: u64,
    /// Proportional set size: shared pages divided among their users.
    pub pss_bytes: u64,
    /// Unique set size: pages no other process maps
    /// (`Private_Clean + Private_Dirty`).
    pub uss_bytes: u64,
}

/// Parses the text of `/proc/PID/smaps_rollup` (lines like `Pss: 1234 kB`).
pub fn parse_smaps_rollup(text: &str) -> Result<Memory, String> {
    let mut found = [None::<u64>; 4];
    const KEYS: [&str; 4] = ["Rss", "Pss", "Private_Clean", "Private_Dirty"];
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let Some(i) = KEYS.iter().position(|k| *k == key) else {
            continue;
        };
        let mut words = rest.split_whitespace();
        let value: u64 = words
            .next()
            .ok_or_else(|| format!("{key}: no value"))?
            .parse()
            .map_err(|e| format!("{key}: {e}"))?;
        let unit = match words.next() {
            Some("kB") => 1024,
            None => 1,
            Some(other) => return Err(format!("{key}: unknown unit {other:?}")),
        };
        found[i] = Some(value * unit);
    }
    let get = |i: usize| found[i].ok_or_else(|| format!("no {} line", KEYS[i]));
    Ok(Memory {
        rss_bytes: get(0)?,
        pss_bytes: get(1)?,
        uss_bytes: get(2)? + get(3)?,
    })
}

/// Clock ticks per second, the unit of the CPU times in `/proc/PID/stat`.
pub fn clock_ticks_per_second() -> io::Result<u64> {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => Ok(ticks as u64),
        Ok(_) => Err(io::Error::other("sysconf(_SC_CLK_TCK) gave no value")),
        Err(e) => Err(e.into()),
    }
}

/// CPU time and memory of one process at one moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ProcessSample {
    /// User plus system CPU time since the process started, in seconds.
    pub cpu_seconds: f64,
    /// Its memory.
    pub memory: Memory,
}

/// Reads CPU time and memory of `pid`. Fails if the process is gone or its
/// `/proc` entries are not readable (another user's process, hidepid).
pub fn sample_process(pid: i32) -> io::Result<ProcessSample> {
    let stat = read_proc(&format!("/proc/{pid}/stat"))?;
    let stat = parse_stat(&stat).map_err(|e| bad_proc(pid, "stat", e))?;
    let rollup = read_proc(&format!("/proc/{pid}/smaps_rollup"))?;
    let memory = parse_smaps_rollup(&rollup).map_err(|e| bad_proc(pid, "smaps_rollup", e))?;
    let ticks = clock_ticks_per_second()?;
    Ok(ProcessSample {
        cpu_seconds: (stat.utime_ticks + stat.stime_ticks) as f64 / ticks as f64,
        memory,
    })
}

fn bad_proc(pid: i32, file: &str, e: String) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("/proc/{pid}/{file}: {e}"),
    )
}

/// The kernel function the process sleeps in (`/proc/PID/wchan`), `None`
/// if it is running, unreadable, or the kernel hides it (it then says `0`).
pub fn read_wchan(pid: i32) -> Option<String> {
    let text = read_proc(&format!("/proc/{pid}/wchan")).ok()?;
    let text = text.trim();
    (!text.is_empty() && text != "0").then(|| text.to_string())
}

/// The system call the process is blocked in (`/proc/PID/syscall`: its
/// number and arguments, `running`, or `-1 ...` when not in one), `None`
/// when unreadable (it needs ptrace rights over the process).
pub fn read_syscall(pid: i32) -> Option<String> {
    read_trimmed(&format!("/proc/{pid}/syscall"))
}

/// The process's kernel stack (`/proc/PID/stack`), `None` when unreadable:
/// most kernels show it to root only.
pub fn read_kernel_stack(pid: i32) -> Option<String> {
    read_trimmed(&format!("/proc/{pid}/stack"))
}

fn read_trimmed(path: &str) -> Option<String> {
    let text = read_proc(path).ok()?;
    let text = text.trim_end();
    (!text.is_empty()).then(|| text.to_string())
}

/// CPU% over the interval between two samples of each process: keeps the
/// previous CPU time per pid.
#[derive(Debug, Default)]
pub struct CpuSampler {
    previous: HashMap<i32, (Instant, f64)>,
}

impl CpuSampler {
    /// An empty sampler.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `cpu_seconds` for `pid` at `now` and returns the CPU% since
    /// its previous sample (100 = one core busy the whole interval), `None`
    /// on the first sample or when no time passed. A CPU time that went
    /// backwards means the pid was reused by a new process: it starts over.
    pub fn record(&mut self, pid: i32, now: Instant, cpu_seconds: f64) -> Option<f64> {
        let before = self.previous.insert(pid, (now, cpu_seconds));
        let (then, cpu_then) = before?;
        let wall = now.checked_duration_since(then).unwrap_or(Duration::ZERO);
        if wall.is_zero() || cpu_seconds < cpu_then {
            return None;
        }
        Some((cpu_seconds - cpu_then) / wall.as_secs_f64() * 100.0)
    }

    /// Reads `pid`'s CPU time and memory now, and its CPU% since the last
    /// call for it: what the supervisor puts in a child's status on each
    /// sampling tick.
    pub fn sample(&mut self, pid: i32, now: Instant) -> io::Result<(ProcessSample, Option<f64>)> {
        let sample = sample_process(pid)?;
        let percent = self.record(pid, now, sample.cpu_seconds);
        Ok((sample, percent))
    }

    /// Forgets every pid not in `alive` (children that exited).
    pub fn retain(&mut self, alive: &[i32]) {
        self.previous.retain(|pid, _| alive.contains(pid));
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Whatever its size: a file of more than two pieces reads whole, a
    /// `/proc` file as `read_to_string` reads it, a missing one fails.
    #[test]
    fn read_proc_reads_a_file_whole_in_pieces() {
        let path = std::env::temp_dir().join(format!("forkpool-read-proc-{}", std::process::id()));
        let text: String = (0..2000).map(|i| format!("{i:05}\n")).collect();
        assert!(text.len() > 2 * 4096);
        std::fs::write(&path, &text).unwrap();
        let read = read_proc(path.to_str().unwrap());
        std::fs::remove_file(&path).unwrap();
        assert_eq!(read.unwrap(), text);
        let ours = read_proc("/proc/self/cmdline").unwrap();
        assert_eq!(ours, std::fs::read_to_string("/proc/self/cmdline").unwrap());
        assert_eq!(
            read_proc("/proc/self/no-such-file").unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn schedstat_gives_the_time_spent_waiting_to_run() {
        assert_eq!(
            parse_schedstat("827505 12345 7\n"),
            Some(SchedStat {
                ran_ns: 827505,
                waited_ns: 12345,
                timeslices: 7
            })
        );
        assert_eq!(parse_schedstat("827505 12345"), None);
        assert_eq!(parse_schedstat("827505"), None);
        assert_eq!(parse_schedstat(""), None);
    }

    const STAT: &str = "4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 1234 0 0 0 \
        250 75 0 0 20 0 1 0 123456 10000000 500 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 0 0 0 0 0 0\n";

    const ROLLUP: &str =
        "55d0c0000000-7ffd4a5f1000 ---p 00000000 00:00 0                          [rollup]
Rss:               10240 kB
Pss:                4096 kB
Pss_Dirty:          1024 kB
Pss_Anon:           1024 kB
Shared_Clean:       6144 kB
Shared_Dirty:          0 kB
Private_Clean:       512 kB
Private_Dirty:      1536 kB
Referenced:        10240 kB
Anonymous:          1536 kB
Swap:                  0 kB
SwapPss:               0 kB
Locked:                0 kB
";

    #[test]
    fn stat_fields_are_counted_from_the_last_parenthesis() {
        let stat = parse_stat(STAT).unwrap();
        assert_eq!(
            stat,
            Stat {
                state: 'S',
                ppid: 1,
                pgrp: 4242,
                utime_ticks: 250,
                stime_ticks: 75,
                start_ticks: 123456,
            }
        );
    }

    #[test]
    fn a_process_started_now_starts_at_or_after_the_boot_clock_read_before() {
        let before = boot_ticks_now().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let started = stat_of(child.id() as i32).map(|s| s.start_ticks);
        let _ = child.kill();
        let _ = child.wait();
        assert!(
            started.is_some_and(|t| t >= before),
            "{started:?} < {before}"
        );
        // This test process started before the read.
        let me = stat_of(std::process::id() as i32).unwrap().start_ticks;
        assert!(me <= before, "{me} > {before}");
    }

    #[test]
    fn truncated_stat_is_an_error_naming_the_field() {
        let err = parse_stat("1 (x) S 1 2 3").unwrap_err();
        assert!(err.contains("utime"), "{err}");
        assert!(parse_stat("garbage").is_err());
    }

    #[test]
    fn rollup_gives_rss_pss_and_private_pages_as_uss() {
        let m = parse_smaps_rollup(ROLLUP).unwrap();
        assert_eq!(m.rss_bytes, 10240 * 1024);
        assert_eq!(m.pss_bytes, 4096 * 1024);
        assert_eq!(m.uss_bytes, (512 + 1536) * 1024);
    }

    #[test]
    fn rollup_without_a_needed_line_is_an_error() {
        let err = parse_smaps_rollup("Rss: 1 kB\nPss: 1 kB\n").unwrap_err();
        assert!(err.contains("Private_Clean"), "{err}");
    }

    #[test]
    fn own_process_sample_matches_what_it_allocated() {
        let before = sample_process(std::process::id() as i32).unwrap();
        // Touch 32 MiB that only this process has: USS must grow by it.
        let block = vec![7u8; 32 << 20];
        let after = sample_process(std::process::id() as i32).unwrap();
        assert!(std::hint::black_box(&block)[12345] == 7);
        let grown = after.memory.uss_bytes as i64 - before.memory.uss_bytes as i64;
        assert!(
            (30 << 20..40 << 20).contains(&grown),
            "USS grew by {grown} bytes"
        );
        assert!(after.memory.rss_bytes >= after.memory.pss_bytes);
        assert!(after.memory.pss_bytes >= after.memory.uss_bytes);
        assert!(after.cpu_seconds >= before.cpu_seconds);
    }

    #[test]
    fn own_cpu_time_grows_with_work() {
        let pid = std::process::id() as i32;
        let start = sample_process(pid).unwrap().cpu_seconds;
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut x = 0u64;
        // Spin until the kernel has counted at least 0.2 s more CPU time.
        while sample_process(pid).unwrap().cpu_seconds < start + 0.2 {
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            assert!(Instant::now() < deadline, "CPU time never grew");
        }
    }

    #[test]
    fn sampler_gives_the_cpu_share_of_a_spinning_process() {
        let pid = std::process::id() as i32;
        let mut sampler = CpuSampler::new();
        let t0 = Instant::now();
        let (first, percent) = sampler.sample(pid, t0).unwrap();
        assert_eq!(percent, None);
        // Spin until the kernel has counted 0.2 s more CPU time (bounded,
        // not timed: a loaded machine just takes longer).
        let mut x = 0u64;
        while sample_process(pid).unwrap().cpu_seconds < first.cpu_seconds + 0.2 {
            x = std::hint::black_box(x.wrapping_add(1));
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "CPU time never grew"
            );
        }
        let t1 = Instant::now();
        let (second, percent) = sampler.sample(pid, t1).unwrap();
        let percent = percent.unwrap();
        let wall = (t1 - t0).as_secs_f64();
        // At least the 0.2 s this thread burned, at most every core.
        let cores = std::thread::available_parallelism().unwrap().get() as f64;
        assert!(
            percent >= 0.2 / wall * 100.0 * 0.99,
            "{percent}% over {wall}s"
        );
        // The kernel counts CPU time in clock ticks (10 ms): with other
        // tests busy on every core in this process, two ticks of rounding
        // over a short window can read above the cores.
        let slack = 2.0 * 0.01 / wall;
        assert!(percent <= (cores + slack) * 100.0 * 1.05, "{percent}%");
        assert!(second.cpu_seconds >= first.cpu_seconds + 0.2);
    }

    #[test]
    fn cpu_percent_is_cpu_time_over_wall_time() {
        let mut s = CpuSampler::new();
        let t0 = Instant::now();
        assert_eq!(s.record(1, t0, 10.0), None);
        let half = s.record(1, t0 + Duration::from_secs(2), 11.0).unwrap();
        assert!((half - 50.0).abs() < 1e-9, "{half}");
        // A reused pid (CPU time went down) starts over.
        assert_eq!(s.record(1, t0 + Duration::from_secs(3), 0.5), None);
        s.retain(&[]);
        assert_eq!(s.record(1, t0 + Duration::from_secs(4), 1.0), None);
    }

    /// A `sleep 30` child, killed on drop (also when a test panics).
    pub(crate) struct Sleeper(pub std::process::Child);

    impl Sleeper {
        pub(crate) fn start() -> Sleeper {
            Sleeper(
                std::process::Command::new("sleep")
                    .arg("30")
                    .spawn()
                    .unwrap(),
            )
        }

        pub(crate) fn pid(&self) -> i32 {
            self.0.id() as i32
        }

        /// Its wchan once it has gone to sleep for good (polled, 10 s at
        /// most): the same function twice in a row, 10 ms apart, while its
        /// state is `S`. A single read can catch it still starting up, in
        /// another kernel function, on a loaded machine.
        pub(crate) fn wait_asleep(&self) -> Option<String> {
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut last: Option<String> = None;
            loop {
                let now = read_wchan(self.pid());
                let sleeping = std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
                    .ok()
                    .and_then(|t| parse_stat(&t).ok())
                    .is_some_and(|s| s.state == 'S');
                if sleeping && now.is_some() && now == last {
                    return now;
                }
                last = now;
                if Instant::now() > deadline {
                    return None;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        }
    }

    impl Drop for Sleeper {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }

    #[test]
    fn wchan_of_a_sleeping_child_names_a_kernel_function() {
        let child = Sleeper::start();
        let wchan = child.wait_asleep().expect("a sleeping process has a wchan");
        assert!(
            wchan.contains("sleep") || wchan.contains("nanosleep") || wchan.contains("hrtimer"),
            "{wchan}"
        );
        // Same user: the syscall file is readable and names a blocked call.
        if let Some(s) = read_syscall(child.pid()) {
            assert!(s != "running", "{s}");
        }
    }
}
