//! `forkpool-bench` end to end: the real binary benchmarks a real demo pool
//! (one dispatch mode, tiny windows) and reports every section as JSON.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Runs `forkpool-bench ARGS`, killing it if it takes longer than `limit`.
fn bench(args: &[&str], limit: Duration) -> (bool, String, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_forkpool-bench"))
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        stdout.read_to_string(&mut s).unwrap();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        stderr.read_to_string(&mut s).unwrap();
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            panic!("forkpool-bench took longer than {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status.success(), out.join().unwrap(), err.join().unwrap())
}

#[test]
fn every_benchmark_reports_on_a_real_pool() {
    let (ok, out, err) = bench(
        &[
            "--modes",
            "handoff",
            "--concurrency",
            "2",
            "--duration",
            "300ms",
            "--warmup",
            "100ms",
            "--session-rounds",
            "1",
            "--json",
        ],
        // A guard against a hang, not a speed test: this takes about 80 s
        // on an idle 2-core machine (the sessions benchmark measures each
        // server for its own fixed 10 s, the preload one starts a heavy
        // app), and a loaded CI machine may take twice that.
        Duration::from_secs(300),
    );
    assert!(ok, "bench failed:\n{err}");
    let report: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    assert_eq!(report["notes"], Value::Array(vec![]), "{err}");

    let throughput = report["throughput"].as_array().unwrap();
    assert_eq!(throughput.len(), 2, "close and keepalive at c=2");
    for row in throughput {
        assert_eq!(row["server"], "forkpool/handoff");
        assert!(row["requests"].as_u64().unwrap() > 0, "{row}");
        assert!(row["p99_ms"].as_f64().unwrap() > 0.0, "{row}");
    }

    let wakeups = &report["wakeups"][0];
    assert!(
        wakeups["ctxt_switches_per_request"].as_f64().unwrap() > 0.0,
        "{wakeups}"
    );
    assert!(wakeups["accepted"].as_u64().unwrap() >= wakeups["requests"].as_u64().unwrap());

    let scaleup = &report["scaleup"];
    let run = &scaleup["runs"][0];
    assert!(
        run["slots_seen"].as_u64().unwrap() > 2,
        "the pool grew: {run}"
    );
    assert!(!scaleup["simulated"]["every_second"]
        .as_array()
        .unwrap()
        .is_empty());

    let memory = report["memory"].as_array().unwrap();
    let rss = |row: &Value| row["child_mean"]["rss_kib"].as_u64().unwrap();
    let uss = |row: &Value| row["child_mean"]["uss_kib"].as_u64().unwrap();
    assert_eq!(memory.len(), 2);
    // The 100 MiB table shows in each child's RSS but not in its USS.
    assert!(rss(&memory[1]) > rss(&memory[0]) + 90 * 1024, "{memory:?}");
    assert!(uss(&memory[1]) < uss(&memory[0]) + 10 * 1024, "{memory:?}");
}

#[test]
fn refuses_a_non_loopback_url() {
    let (ok, _, err) = bench(&["--url", "http://192.0.2.1/"], Duration::from_secs(10));
    assert!(!ok);
    assert!(
        err.contains("refusing non-loopback host 192.0.2.1"),
        "{err}"
    );
}
