//! Compiles the C worker (`clients/c`) for the tests that run it
//! (`c_worker.rs`, `kernel_c.rs`).
#![allow(dead_code)] // each test file uses one of these

use std::path::{Path, PathBuf};
use std::process::Command;

/// Compiles the worker into `dir`; `None` when there is no C compiler
/// and the test must return without running (see `common::require`).
pub fn build_worker(dir: &Path) -> Option<PathBuf> {
    let cc = crate::common::require_program("cc", "run bash .ci/deps/system-tools.sh (gcc)")?;
    let sources = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../clients/c");
    let out = dir.join("forkpool-c-worker");
    let status = Command::new(cc)
        .args(["-O2", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&out)
        .arg(sources.join("forkpool_worker.c"))
        .arg(sources.join("kernel_dispatch.c"))
        .status()
        .expect("run the C compiler");
    assert!(
        status.success(),
        "cc failed to compile the C worker in {}",
        sources.display()
    );
    Some(out)
}

/// The worker compiled into a directory of its own, removed on Drop.
pub struct BuiltWorker {
    dir: PathBuf,
    /// The executable.
    pub path: PathBuf,
}

impl BuiltWorker {
    /// Compiles the worker; `None` as for [`build_worker`].
    pub fn new() -> Option<BuiltWorker> {
        let dir = crate::common::temp_path("c-worker");
        std::fs::create_dir_all(&dir).unwrap();
        let built = build_worker(&dir).map(|path| BuiltWorker {
            dir: dir.clone(),
            path,
        });
        if built.is_none() {
            let _ = std::fs::remove_dir_all(&dir);
        }
        built
    }

    /// The executable's path, as a command-line word.
    pub fn command(&self) -> &str {
        self.path.to_str().expect("a UTF-8 temp path")
    }
}

impl Drop for BuiltWorker {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
