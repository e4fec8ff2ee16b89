//! What a server's process tree costs, read from `/proc`: processes,
//! threads, resident memory and CPU time.

use std::fs;
use std::io;

/// The cost of a process and its descendants at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeCost {
    /// Processes in the tree.
    pub processes: usize,
    /// Threads, summed over the tree.
    pub threads: u64,
    /// Resident set size summed over the tree, in KiB. Pages shared between
    /// forked processes count once per process.
    pub rss_kib: u64,
    /// Proportional set size summed over the tree, in KiB: shared pages
    /// are divided among the processes sharing them, so this is what the
    /// tree costs the machine.
    pub pss_kib: u64,
    /// User plus system CPU time so far, in clock ticks.
    pub cpu_ticks: u64,
}

/// Reads the cost of `root` and every process below it.
pub fn tree_cost(root: i32) -> io::Result<TreeCost> {
    let mut cost = TreeCost::default();
    for pid in tree(root)? {
        // A process that exits while we read it simply stops counting.
        let Ok(status) = fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        cost.processes += 1;
        cost.threads += field_kib(&status, "Threads:").unwrap_or(0);
        cost.rss_kib += field_kib(&status, "VmRSS:").unwrap_or(0);
        if let Ok(rollup) = fs::read_to_string(format!("/proc/{pid}/smaps_rollup")) {
            cost.pss_kib += field_kib(&rollup, "Pss:").unwrap_or(0);
        }
        if let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) {
            cost.cpu_ticks += cpu_ticks(&stat).unwrap_or(0);
        }
    }
    Ok(cost)
}

/// `root` and its descendants, parents first.
pub fn tree(root: i32) -> io::Result<Vec<i32>> {
    fs::metadata(format!("/proc/{root}"))?;
    let mut pids = vec![root];
    let mut next = 0;
    while next < pids.len() {
        let pid = pids[next];
        next += 1;
        let Ok(tasks) = fs::read_dir(format!("/proc/{pid}/task")) else {
            continue;
        };
        for task in tasks.flatten() {
            let path = task.path().join("children");
            if let Ok(children) = fs::read_to_string(path) {
                pids.extend(
                    children
                        .split_whitespace()
                        .filter_map(|p| p.parse::<i32>().ok()),
                );
            }
        }
    }
    Ok(pids)
}

/// The number after `name` on its line (`VmRSS:   1234 kB` gives 1234).
fn field_kib(text: &str, name: &str) -> Option<u64> {
    text.lines()
        .find_map(|line| line.strip_prefix(name))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// utime + stime from `/proc/PID/stat` (fields 14 and 15; the command name
/// in parentheses may contain spaces, so count from the closing one).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name, field 3 (state) is at index 0, so field N is N - 3.
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_and_cpu_ticks() {
        assert_eq!(
            field_kib("Name:\tx\nVmRSS:\t  2048 kB\n", "VmRSS:"),
            Some(2048)
        );
        assert_eq!(field_kib("Threads:\t5\n", "Threads:"), Some(5));
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 3 0 0 20 0 1";
        assert_eq!(cpu_ticks(stat), Some(10));
    }

    #[test]
    fn measures_this_process() {
        let cost = tree_cost(std::process::id() as i32).unwrap();
        assert!(cost.processes >= 1);
        assert!(cost.threads >= 1);
        assert!(cost.rss_kib > 0);
    }
}
