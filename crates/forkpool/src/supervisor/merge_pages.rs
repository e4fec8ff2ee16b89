//! `merge_pages` carried out: the supervisor marks itself for the
//! kernel's same-page merging, so that every child it starts from then on
//! is marked too (`sys/memory_merge.rs`), or clears the mark. At start
//! and when a reload changes the setting; children already running keep
//! theirs until they are replaced.

use tracing::{info, warn};

use crate::sys::memory_merge::{self, Merging};

/// Sets the mark to `on`. `Err` names why the kernel cannot, and the fix.
pub(super) fn apply(on: bool) -> Result<(), String> {
    if !on {
        // A kernel without the setting has nothing to clear; an upgrade's
        // new supervisor inherits its predecessor's mark.
        if memory_merge::is_set().unwrap_or(false) {
            memory_merge::set(false)
                .map_err(|e| format!("merge_pages: cannot clear the mark: {e}"))?;
            info!("merge_pages off: children started from now on are not merged");
        }
        return Ok(());
    }
    let merging = memory_merge::readiness()?;
    memory_merge::set(true).map_err(|e| {
        format!("merge_pages: prctl(PR_SET_MEMORY_MERGE) failed: {e}; leave merge_pages off")
    })?;
    if merging == Merging::Stopped {
        warn!(
            "merge_pages: the kernel's same-page merging is stopped (/sys/kernel/mm/ksm/run \
             is not 1), so no page is merged until it runs: echo 1 > /sys/kernel/mm/ksm/run"
        );
    }
    Ok(())
}
