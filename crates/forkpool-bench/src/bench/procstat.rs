//! What a process tree costs, read from `/proc`: context switches, CPU time
//! and memory of a pool's parent and its children.
//!
//! Children are found by scanning `/proc/*/stat` for the parent's pid as
//! ppid (`/proc/PID/task/TID/children` would be cheaper, but kernels built
//! without `CONFIG_PROC_CHILDREN` lack it). A process is known by its pid
//! *and* start time, so a recycled pid is never mistaken for the same child.
//!
//! Usage between two snapshots ([`usage_between`]) survives children that
//! exit in between, with one caveat:
//! - CPU time is exact as long as the parent reaps its children: a child
//!   that exited and was reaped has its whole lifetime in the parent's
//!   `cutime`/`cstime`, so we add the growth of those and subtract what the
//!   vanished child had already used at the first snapshot.
//! - Context switches have no such account: the switches a child made
//!   between the first snapshot and its exit are lost, so with children
//!   retiring during a run the count is a lower bound. Children born during
//!   the run count in full.

use std::collections::HashMap;
use std::fs;
use std::io;

use serde::Serialize;

/// The fields we use from `/proc/PID/stat`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Process id.
    pub pid: i32,
    /// The command name (without the parentheses).
    pub comm: String,
    /// One-letter state (`R`, `S`, `Z`, ...).
    pub state: char,
    /// Parent's pid.
    pub ppid: i32,
    /// User CPU time, in clock ticks.
    pub utime: u64,
    /// System CPU time, in clock ticks.
    pub stime: u64,
    /// User CPU time of reaped children, in clock ticks.
    pub cutime: u64,
    /// System CPU time of reaped children, in clock ticks.
    pub cstime: u64,
    /// When the process started, in clock ticks after boot.
    pub starttime: u64,
}

/// Parses `/proc/PID/stat`. The command name sits in parentheses and may
/// itself hold spaces and parentheses, so the fields are counted from the
/// *last* `)`.
pub fn parse_stat(text: &str) -> Result<Stat, String> {
    let bad = |what: &str| format!("bad /proc stat line ({what}): {text:?}");
    let open = text.find('(').ok_or_else(|| bad("no '('"))?;
    let close = text.rfind(')').ok_or_else(|| bad("no ')'"))?;
    if close < open {
        return Err(bad("')' before '('"));
    }
    let pid = text[..open].trim().parse().map_err(|_| bad("pid"))?;
    let comm = text[open + 1..close].to_string();
    // After the name: field 3 (state) onwards; field n is at index n - 3.
    let fields: Vec<&str> = text[close + 1..].split_ascii_whitespace().collect();
    let field = |n: usize| fields.get(n - 3).copied().ok_or_else(|| bad("too short"));
    let number =
        |n: usize| -> Result<u64, String> { field(n)?.parse().map_err(|_| bad("not a number")) };
    Ok(Stat {
        pid,
        comm,
        state: field(3)?.chars().next().ok_or_else(|| bad("state"))?,
        ppid: field(4)?.parse().map_err(|_| bad("ppid"))?,
        utime: number(14)?,
        stime: number(15)?,
        cutime: number(16)?,
        cstime: number(17)?,
        starttime: number(22)?,
    })
}

/// Voluntary plus involuntary context switches in `/proc/PID/status` text.
pub fn parse_ctxt_switches(status: &str) -> Result<u64, String> {
    let mut total = 0;
    let mut found = 0;
    for line in status.lines() {
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        if key == "voluntary_ctxt_switches" || key == "nonvoluntary_ctxt_switches" {
            total += value
                .trim()
                .parse::<u64>()
                .map_err(|_| format!("bad {key} value '{}'", value.trim()))?;
            found += 1;
        }
    }
    if found != 2 {
        return Err("status has no voluntary_ctxt_switches/nonvoluntary_ctxt_switches".to_string());
    }
    Ok(total)
}

/// A process's memory, in KiB.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// Resident set: every page mapped and in RAM, shared or not.
    pub rss_kib: u64,
    /// Proportional set: each shared page divided among its sharers.
    pub pss_kib: u64,
    /// Unique set: pages only this process has (`Private_Clean` +
    /// `Private_Dirty`); what killing it would free.
    pub uss_kib: u64,
}

impl Memory {
    /// The mean of `all` (zero for none).
    pub fn mean(all: &[Memory]) -> Memory {
        let n = all.len().max(1) as u64;
        Memory {
            rss_kib: all.iter().map(|m| m.rss_kib).sum::<u64>() / n,
            pss_kib: all.iter().map(|m| m.pss_kib).sum::<u64>() / n,
            uss_kib: all.iter().map(|m| m.uss_kib).sum::<u64>() / n,
        }
    }
}

/// Parses `/proc/PID/smaps_rollup`.
pub fn parse_smaps_rollup(text: &str) -> Result<Memory, String> {
    let mut fields = HashMap::new();
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let Some(kib) = rest.trim().strip_suffix("kB") else {
            continue;
        };
        if let Ok(n) = kib.trim().parse::<u64>() {
            fields.insert(key.trim(), n);
        }
    }
    let get = |key: &str| {
        fields
            .get(key)
            .copied()
            .ok_or_else(|| format!("smaps_rollup has no {key} line"))
    };
    Ok(Memory {
        rss_kib: get("Rss")?,
        pss_kib: get("Pss")?,
        uss_kib: get("Private_Clean")? + get("Private_Dirty")?,
    })
}

/// Clock ticks per second, the unit of CPU times in `/proc/PID/stat`.
pub fn clock_ticks_per_second() -> u64 {
    crate::sys::clock_ticks_per_second()
}

/// Reads and parses `/proc/PID/stat`.
pub fn read_stat(pid: i32) -> io::Result<Stat> {
    let text = fs::read_to_string(format!("/proc/{pid}/stat"))?;
    parse_stat(&text).map_err(io::Error::other)
}

/// The live children of `pid` (zombies included), by their stat lines.
pub fn children_of(pid: i32) -> io::Result<Vec<Stat>> {
    let mut children = Vec::new();
    for entry in fs::read_dir("/proc")? {
        let Some(candidate) = entry?
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        // A process may exit while we look; that is not an error.
        if let Ok(stat) = read_stat(candidate) {
            if stat.ppid == pid {
                children.push(stat);
            }
        }
    }
    Ok(children)
}

/// The memory of `pid` from its `smaps_rollup`.
pub fn memory_of(pid: i32) -> io::Result<Memory> {
    let text = fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))?;
    parse_smaps_rollup(&text).map_err(io::Error::other)
}

/// Context switches of all of `pid`'s threads (`/proc/PID/status` alone
/// counts only the main thread).
pub fn ctxt_switches_of(pid: i32) -> io::Result<u64> {
    let mut total = 0;
    for task in fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = task?.path().join("status");
        match fs::read_to_string(&path) {
            Ok(text) => total += parse_ctxt_switches(&text).map_err(io::Error::other)?,
            // A thread that ended while we looked.
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(total)
}

/// One process at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessSample {
    /// Its stat line.
    pub stat: Stat,
    /// Context switches of all its threads.
    pub ctxt_switches: u64,
}

impl ProcessSample {
    fn read(stat: Stat) -> io::Result<ProcessSample> {
        let ctxt_switches = ctxt_switches_of(stat.pid)?;
        Ok(ProcessSample {
            stat,
            ctxt_switches,
        })
    }

    fn cpu_ticks(&self) -> u64 {
        self.stat.utime + self.stat.stime
    }
}

/// A parent and its children at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The parent.
    pub parent: ProcessSample,
    /// Its children, by (pid, start time).
    pub children: HashMap<(i32, u64), ProcessSample>,
}

impl Snapshot {
    /// Reads `pid` and its children; a child that exits meanwhile is left out.
    pub fn take(pid: i32) -> io::Result<Snapshot> {
        let parent = ProcessSample::read(read_stat(pid)?)?;
        let mut children = HashMap::new();
        for stat in children_of(pid)? {
            if let Ok(sample) = ProcessSample::read(stat) {
                children.insert((sample.stat.pid, sample.stat.starttime), sample);
            }
        }
        Ok(Snapshot { parent, children })
    }
}

/// What a process tree used between two snapshots.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Usage {
    /// Context switches, parent and children (see the module docs' caveat).
    pub ctxt_switches: u64,
    /// CPU seconds, user plus system, parent and children.
    pub cpu_seconds: f64,
}

/// The usage between `before` and `after`, given `ticks` per second.
pub fn usage_between(before: &Snapshot, after: &Snapshot, ticks: u64) -> Usage {
    let parent_ticks =
        |s: &Snapshot| s.parent.cpu_ticks() + s.parent.stat.cutime + s.parent.stat.cstime;
    let mut cpu = parent_ticks(after) as i64 - parent_ticks(before) as i64;
    let mut switches = after.parent.ctxt_switches as i64 - before.parent.ctxt_switches as i64;
    for (id, now) in &after.children {
        let earlier = before.children.get(id);
        cpu += now.cpu_ticks() as i64 - earlier.map_or(0, |e| e.cpu_ticks() as i64);
        switches += now.ctxt_switches as i64 - earlier.map_or(0, |e| e.ctxt_switches as i64);
    }
    for (id, gone) in &before.children {
        if !after.children.contains_key(id) {
            // Reaped: its whole life is now in the parent's cutime/cstime.
            cpu -= gone.cpu_ticks() as i64;
        }
    }
    Usage {
        ctxt_switches: switches.max(0) as u64,
        cpu_seconds: cpu.max(0) as f64 / ticks.max(1) as f64,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "4242 (my (odd) name) S 4200 4242 4200 0 -1 4194560 500 0 0 0 \
                        120 30 7 3 20 0 1 0 98765 123456789 300 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n";

    const STATUS: &str = "Name:\tforkpool\nState:\tS (sleeping)\nPid:\t4242\nPPid:\t4200\n\
                          Threads:\t1\nvoluntary_ctxt_switches:\t1500\nnonvoluntary_ctxt_switches:\t25\n";

    const SMAPS_ROLLUP: &str =
        "55d0c0a00000-7ffd5e5fe000 ---p 00000000 00:00 0                          [rollup]\n\
        Rss:              104660 kB\nPss:               35120 kB\nPss_Dirty:         34000 kB\n\
        Pss_Anon:          34000 kB\nPss_File:           1120 kB\nPss_Shmem:             0 kB\n\
        Shared_Clean:       1432 kB\nShared_Dirty:     102400 kB\nPrivate_Clean:       36 kB\n\
        Private_Dirty:       792 kB\nReferenced:       104660 kB\nAnonymous:        103192 kB\n\
        Swap:                  0 kB\n";

    #[test]
    fn stat_with_spaces_and_parentheses_in_the_name() {
        let stat = parse_stat(STAT).unwrap();
        assert_eq!(
            stat,
            Stat {
                pid: 4242,
                comm: "my (odd) name".to_string(),
                state: 'S',
                ppid: 4200,
                utime: 120,
                stime: 30,
                cutime: 7,
                cstime: 3,
                starttime: 98765,
            }
        );
        assert!(parse_stat("4242 (cut short) S 1 2").is_err());
        assert!(parse_stat("garbage").is_err());
    }

    #[test]
    fn status_context_switches() {
        assert_eq!(parse_ctxt_switches(STATUS), Ok(1525));
        assert!(parse_ctxt_switches("Name:\tx\n").is_err());
    }

    #[test]
    fn smaps_rollup_memory() {
        assert_eq!(
            parse_smaps_rollup(SMAPS_ROLLUP),
            Ok(Memory {
                rss_kib: 104660,
                pss_kib: 35120,
                uss_kib: 828
            })
        );
        assert!(parse_smaps_rollup("Rss: 1 kB\n").is_err());
    }

    fn sample(pid: i32, start: u64, cpu: u64, cutime: u64, switches: u64) -> ProcessSample {
        ProcessSample {
            stat: Stat {
                pid,
                comm: "x".to_string(),
                state: 'S',
                ppid: 1,
                utime: cpu,
                stime: 0,
                cutime,
                cstime: 0,
                starttime: start,
            },
            ctxt_switches: switches,
        }
    }

    fn snapshot(parent: ProcessSample, children: Vec<ProcessSample>) -> Snapshot {
        Snapshot {
            parent,
            children: children
                .into_iter()
                .map(|c| ((c.stat.pid, c.stat.starttime), c))
                .collect(),
        }
    }

    #[test]
    fn usage_survives_children_coming_and_going() {
        // Child 11 lives on; 12 exits (used 30 ticks before, 50 in all);
        // 13 is born; 14's pid is reused by a new process (other start).
        let before = snapshot(
            sample(10, 1, 100, 0, 1000),
            vec![
                sample(11, 2, 40, 0, 10),
                sample(12, 2, 30, 0, 20),
                sample(14, 2, 5, 0, 5),
            ],
        );
        let after = snapshot(
            sample(10, 1, 110, 50 + 5, 1100),
            vec![
                sample(11, 2, 60, 0, 15),
                sample(13, 9, 7, 0, 3),
                sample(14, 9, 1, 0, 2),
            ],
        );
        let usage = usage_between(&before, &after, 100);
        // parent 10 + 11's 20 + 12's last 20 + 13's 7 + old 14's 0 + new 14's 1.
        assert_eq!(usage.cpu_seconds, 0.58);
        // parent 100 + 11's 5 + 13's 3 + new 14's 2 (12's are lost).
        assert_eq!(usage.ctxt_switches, 110);
    }

    #[test]
    fn this_process_reads_back() {
        let me = std::process::id() as i32;
        let stat = read_stat(me).unwrap();
        assert_eq!(stat.pid, me);
        assert!(ctxt_switches_of(me).unwrap() > 0);
        let memory = memory_of(me).unwrap();
        assert!(memory.rss_kib >= memory.uss_kib && memory.rss_kib > 0);
        let mut child = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .unwrap();
        let children = children_of(me).unwrap();
        let found = children.iter().any(|c| c.pid == child.id() as i32);
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(found, "sleep not among {children:?}");
        assert!(clock_ticks_per_second() > 0);
    }
}
