//! Runs a check over the corpus's cases and asserts that none failed,
//! printing each failure and the count per class (for the servers' corpus
//! tests that do not go through `http_corpus::run_corpus` as is).

use crate::http_corpus::{failures_by_class, Case, Failure};

/// Every case `check` refuses, as failures; then the assertion that there
/// are none.
pub fn assert_every_case_passes(cases: Vec<Case>, check: impl Fn(&Case) -> Result<(), String>) {
    let failures: Vec<Failure> = cases
        .into_iter()
        .filter_map(|case| {
            let what = check(&case).err()?;
            Some(Failure {
                case: case.name,
                what,
            })
        })
        .collect();
    let report: Vec<String> = failures.iter().map(|f| f.to_string()).collect();
    assert!(
        failures.is_empty(),
        "{} corpus cases failed ({:?}):\n{}",
        failures.len(),
        failures_by_class(&failures),
        report.join("\n")
    );
}
