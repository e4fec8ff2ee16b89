//! The forkpool-bench crate's binaries, for the tests that need them: the
//! demo with fault injection (`forkpool-bench demo --chaos`) and the
//! example Rust worker. Neither ships with the `forkpool` command, so
//! cargo cannot name them to this package's tests; it builds them next to
//! `forkpool` when the whole workspace is tested.
#![allow(dead_code)] // each test file uses some of these

use std::path::PathBuf;

/// The path of the workspace binary `name`, which must be built.
pub fn workspace_bin(name: &str) -> PathBuf {
    let path = std::path::Path::new(env!("CARGO_BIN_EXE_forkpool")).with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build it with `cargo build -p forkpool-bench` \
         (`cargo test --workspace` does)",
        path.display()
    );
    path
}

/// `forkpool-bench`, whose `demo` subcommand takes `--chaos`.
pub fn forkpool_bench() -> PathBuf {
    workspace_bin("forkpool-bench")
}
