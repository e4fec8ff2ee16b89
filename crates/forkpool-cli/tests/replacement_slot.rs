//! A child killed from outside is replaced in its own slot: the
//! replacement waits for the old child's reap instead of taking a higher
//! slot while the dead one still holds its own.

mod common;

use std::time::Duration;

use common::{kill9, total, DemoPool};

/// The (slot, pid) of every child in a status snapshot.
fn slots(status: &serde_json::Value) -> Vec<(u64, i64)> {
    status["slots"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .map(|r| (r["slot"].as_u64().unwrap(), r["pid"].as_i64().unwrap()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_child_killed_from_outside_is_replaced_in_its_own_slot() {
    let pool = DemoPool::start(&["--min-children", "2", "--max-children", "4"]);
    let wait = Duration::from_secs(10);
    for round in 1..=5u64 {
        let status = pool
            .wait_status(wait, |s| {
                slots(s).len() == 2 && total(s, "died") == round - 1
            })
            .expect("two children");
        let before = slots(&status);
        let (slot, victim) = before[0];
        kill9(victim as i32);
        let after = pool
            .wait_status(wait, |s| {
                total(s, "died") >= round
                    && slots(s).len() == 2
                    && slots(s).iter().all(|&(_, pid)| pid != victim)
                    && s["slots"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .all(|r| r["state"] == "idle")
            })
            .unwrap_or_else(|| panic!("no replacement for {victim}\n{}", pool.stderr.dump()));
        let now: Vec<u64> = slots(&after).iter().map(|&(s, _)| s).collect();
        assert_eq!(
            now,
            vec![0, 1],
            "round {round}: slot {slot}'s child {victim} was replaced elsewhere: {after}"
        );
    }
}
