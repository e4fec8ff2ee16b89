//! What the supervisor can see of its children and listeners without their
//! help: CPU and memory from `/proc`, where a process is waiting in the
//! kernel, how many connections wait in a listener's accept queue, which
//! clients a process is talking to, and the record logged when a request
//! is slow.
//!
//! Everything here is either a pure function of text the kernel wrote (so
//! it is tested on fixtures) or a thin reader around one, so the supervisor
//! can call it from its loop and `forkpool top` can show the results.
//! Linux only: other systems get errors, never wrong figures.

pub mod capture;
pub mod peers;
pub mod procfs;
pub mod queue;

pub use capture::{CaptureLimiter, SlowCapture};
pub use procfs::{CpuSampler, Memory, ProcessSample};
pub use queue::{listen_queue, listen_queues_of_process, ListenQueue, Listening};
