//! Bad configuration is refused before anything starts, naming the fix.

mod common;

use std::process::Command;

fn demo_error(args: &[&str]) -> String {
    let out = Command::new(common::forkpool_bin())
        .arg("demo")
        .args(["--listen", "127.0.0.1:0"])
        .args(args)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "args {args:?} should fail");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn every_validation_error_is_reported() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--min-spare", "8", "--max-spare", "4"],
            "min_spare 8 is above max_spare 4",
        ),
        (
            &[
                "--max-children",
                "0",
                "--min-children",
                "0",
                "--min-spare",
                "0",
            ],
            "max_children must be at least 1",
        ),
        (
            &["--max-children", "5000"],
            "max_children 5000 is above the limit",
        ),
        (
            &[
                "--min-children",
                "10",
                "--max-children",
                "4",
                "--min-spare",
                "1",
            ],
            "min_children 10 is above max_children 4",
        ),
        (
            &[
                "--max-children",
                "2",
                "--min-children",
                "1",
                "--min-spare",
                "3",
                "--max-spare",
                "3",
            ],
            "min_spare 3 is above max_children 2",
        ),
        (
            &["--ping-interval", "0s"],
            "ping_interval must be longer than 0",
        ),
        (
            &["--ping-timeout", "0s"],
            "ping_timeout must be longer than 0",
        ),
        (&["--backlog", "0"], "backlog must be at least 1"),
    ];
    for (args, expected) in cases {
        let stderr = demo_error(args);
        assert!(
            stderr.contains(expected),
            "{args:?}: expected '{expected}' in:\n{stderr}"
        );
    }
}

#[test]
fn malformed_values_name_the_format() {
    let out = Command::new(common::forkpool_bin())
        .args(["demo", "--ping-interval", "soon"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("500ms"));
    let out = Command::new(common::forkpool_bin())
        .args(["demo", "--dispatch", "fast"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("use handoff, order, shared or kernel"));
}

#[test]
fn a_busy_port_is_reported() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let out = Command::new(common::forkpool_bin())
        .args(["demo", "--listen", &addr])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(&format!("cannot bind {addr}")), "{stderr}");
}

#[test]
fn the_shipped_example_config_is_valid() {
    let file = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../dist/systemd/forkpool.toml"
    );
    // The example names www-data; not every machine has it.
    let out = Command::new(common::forkpool_bin())
        .args(["check", "--config", file, "--user", "nobody"])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("children 4..64"), "{stdout}");
}
