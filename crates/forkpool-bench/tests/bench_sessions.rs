//! The session benchmark runs end to end, small: every server answers
//! every command, the numbers it reads from /proc make sense, and rounds
//! are summed up by their median.

use std::process::Command;
use std::time::{Duration, Instant};

#[test]
fn a_small_run_measures_all_three_servers() {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_forkpool-bench"))
        .args([
            "bench-sessions",
            "--json",
            "--sessions",
            "40",
            "--busy",
            "2",
        ])
        .args([
            "--duration",
            "1s",
            "--idle",
            "200ms",
            "--sessions-per-child",
            "16",
            "--rounds",
            "2",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(started.elapsed() < Duration::from_secs(90));
    let rows: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let servers: Vec<&str> = rows.iter().map(|r| r["server"].as_str().unwrap()).collect();
    assert_eq!(servers, ["threads", "pool", "forkpool"]);
    for row in rows {
        assert_eq!(row["errors"], 0, "{row}\n{stderr}");
        assert!(row["commands"].as_u64().unwrap() >= 40, "{row}");
        assert!(row["rss_mib"].as_f64().unwrap() > 0.0, "{row}");
        // Every server measured twice, the row the median of both.
        assert_eq!(row["rounds"], 2, "{row}");
        let p99s: Vec<f64> = row["p99_rounds_ms"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(p99s.len(), 2, "{row}");
        let middle = (p99s[0] + p99s[1]) / 2.0;
        assert!(
            (row["p99_ms"].as_f64().unwrap() - middle).abs() < 1e-9,
            "{row}"
        );
    }
    // One thread per session, plus the accepting one.
    assert!(rows[0]["threads"].as_u64().unwrap() > 40);
    // Four workers (taking turns at the poll), plus the main thread.
    assert_eq!(rows[1]["threads"], 5);
    // 40 sessions of 16 per child: three children, a spare one and the
    // supervisor.
    assert!(rows[2]["processes"].as_u64().unwrap() >= 5, "{}", rows[2]);
}
