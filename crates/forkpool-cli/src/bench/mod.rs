//! `forkpool bench`: measuring pools and other servers (work in progress).

mod http;
mod latency;
mod loadgen;
mod pool_process;
mod procstat;
mod simulate;
mod target;
#[cfg(test)]
mod test_server;
