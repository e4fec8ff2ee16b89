//! For tests that run Python workers from files of their own: a scratch
//! directory the test deploys files into, the example worker run from
//! such a file, and a bounded wait on `forkpool status`.
#![allow(dead_code)] // each test file uses some of these

use std::path::PathBuf;
use std::time::Duration;

use super::common::DemoPool;

const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/python");

/// A directory for the worker file a test rewrites, removed at the end.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = super::common::temp_path(name);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }

    pub fn path(&self, file: &str) -> String {
        self.0.join(file).to_str().unwrap().to_string()
    }

    /// Writes the file under a temporary name and renames it into place,
    /// as a deploy would, so no worker ever reads half of it.
    pub fn deploy(&self, file: &str, text: &str) {
        let staged = self.0.join(format!(".{file}.new"));
        std::fs::write(&staged, text).unwrap();
        std::fs::rename(staged, self.0.join(file)).unwrap();
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The example HTTP worker, run from a file of the test's own.
pub fn good_app() -> String {
    format!(
        "import runpy, sys\nsys.path.insert(0, {CLIENTS:?})\n\
         runpy.run_path({:?}, run_name='__main__')\n",
        format!("{CLIENTS}/example_http_worker.py")
    )
}

/// Polls `forkpool status` until `cond` holds; fails the test with the
/// last snapshot if `timeout` passes first.
pub fn wait_status(
    pool: &DemoPool,
    timeout: Duration,
    cond: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    pool.wait_status(timeout, cond)
        .unwrap_or_else(|| panic!("status never got there: {}", pool.status()))
}
