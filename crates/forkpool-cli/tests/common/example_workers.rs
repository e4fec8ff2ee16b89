//! The example workers every language's helper ships, for tests that run
//! them under `forkpool run`.
#![allow(dead_code)] // each test file uses some of these

use super::bench_bins;

/// `clients/python/example_http_worker.py`.
pub const PYTHON_WORKER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/python/example_http_worker.py"
);

/// `clients/perl/example_http_worker.pl`.
pub const PERL_WORKER: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../clients/perl/example_http_worker.pl"
);

/// The example Rust worker, a binary of the `forkpool-bench` crate (so that
/// installing the CLI does not install it).
pub fn rust_worker() -> &'static str {
    static PATH: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        bench_bins::workspace_bin("forkpool-example-worker")
            .display()
            .to_string()
    })
}
