//! Counting signal deliveries from inside the handler.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Adds one to `counter` each time `sig` is delivered, from the signal
/// handler itself (the supervisor's loop reads and resets the count).
pub fn count_deliveries(sig: i32, counter: Arc<AtomicUsize>) -> io::Result<()> {
    // SAFETY: the handler only does an atomic add, which is
    // async-signal-safe, on a counter the closure owns a reference to.
    unsafe {
        signal_hook::low_level::register(sig, move || {
            counter.fetch_add(1, Ordering::SeqCst);
        })
    }?;
    Ok(())
}
