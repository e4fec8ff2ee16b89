//! The pool's size follows the load.

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::{concurrent_gets, total, DemoPool};

#[test]
fn starts_with_min_children() {
    let pool = DemoPool::start(&[
        "--min-children",
        "3",
        "--min-spare",
        "1",
        "--max-spare",
        "8",
    ]);
    assert!(pool.wait_idle(3, Duration::from_secs(5)));
    assert_eq!(pool.children().len(), 3);
    assert_eq!(
        total(&pool.status(), "spawned"),
        3,
        "{}",
        pool.stderr.dump()
    );
}

#[test]
fn grows_under_load_then_shrinks_back() {
    let pool = DemoPool::start(&[
        "--min-children",
        "2",
        "--max-children",
        "16",
        "--min-spare",
        "1",
        "--max-spare",
        "2",
        "--retire-grace",
        "200ms",
    ]);
    assert!(pool.wait_children(Duration::from_secs(5), |n| n == 2));
    let started = Instant::now();
    let results = concurrent_gets(pool.addr, "/?work_ms=1500", 12);
    let elapsed = started.elapsed();
    let mut slots = BTreeSet::new();
    for r in &results {
        let r = r.as_ref().expect("every request succeeds");
        assert_eq!(r.status, 200);
        slots.insert(r.slot.unwrap());
    }
    // Twelve 1.5 s requests finishing in well under two rounds means they ran
    // side by side, one child each.
    assert_eq!(slots.len(), 12, "slots used: {slots:?}");
    assert!(elapsed < Duration::from_millis(2900), "took {elapsed:?}");
    // After the load: idle surplus retired down to max_spare (2) idle.
    assert!(
        pool.wait_children(Duration::from_secs(10), |n| n <= 2),
        "pool did not shrink: {} children\n{}",
        pool.children().len(),
        pool.stderr.dump()
    );
    let status = pool
        .wait_status(Duration::from_secs(5), |s| total(s, "retired") >= 10)
        .unwrap_or_else(|| panic!("{}", pool.status()));
    assert_eq!(total(&status, "killed"), 0, "{status}");
}

#[test]
fn at_max_children_connections_queue_and_one_warning_is_logged() {
    let pool = DemoPool::start(&[
        "--min-children",
        "1",
        "--max-children",
        "2",
        "--min-spare",
        "1",
        "--max-spare",
        "2",
    ]);
    let started = Instant::now();
    let results = concurrent_gets(pool.addr, "/?work_ms=400", 6);
    let elapsed = started.elapsed();
    assert!(results
        .iter()
        .all(|r| r.as_ref().is_ok_and(|r| r.status == 200)));
    let pids: BTreeSet<i32> = results
        .iter()
        .map(|r| r.as_ref().unwrap().pid.unwrap())
        .collect();
    assert!(pids.len() <= 2, "never more than two children: {pids:?}");
    // Six 400 ms requests through two children take three rounds.
    assert!(elapsed >= Duration::from_millis(1150), "took {elapsed:?}");
    assert!(total(&pool.status(), "saturated") >= 1);
    // One warning, not one per connection: the log line is the feature.
    assert_eq!(
        pool.stderr.count("reached max-children=2"),
        1,
        "{}",
        pool.stderr.dump()
    );
}
