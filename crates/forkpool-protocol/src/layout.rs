//! What an exec'd worker finds when it starts, in any language: the
//! descriptors it inherits and the environment variables that name them.
//! `forkpool run -- CMD` sets this up in every slot before `exec`;
//! `docs/protocol.md` and `docs/workers.md` tell the same for worker authors.
//!
//! | fd          | what                                                        |
//! |-------------|-------------------------------------------------------------|
//! | 0           | `/dev/null`                                                 |
//! | 1           | the supervisor's standard output, shared                    |
//! | 2           | a pipe the supervisor reads; each line is logged with the slot and pid |
//! | 3 … 3+n−1   | the n listening sockets, in every mode (in `kernel`: the slot's own) |
//! | 3+n         | the back-channel (not in `none` mode)                       |
//!
//! In `kernel` dispatch the pool's listeners (the overflow) come after the
//! back-channel, at 3+n+1 … 3+2n, and the scoreboard map at 3+2n+1
//! (`FORKPOOL_OVERFLOW_FD`, `FORKPOOL_BOARD_FD`).
//!
//! No other descriptor is open. The environment says where things are:
//!
//! | variable              | value                                                   |
//! |-----------------------|---------------------------------------------------------|
//! | `LISTEN_FDS`          | n, when n > 0 (systemd socket activation)               |
//! | `LISTEN_PID`          | the worker's own pid, when n > 0                        |
//! | `LISTEN_FDNAMES`      | each listener's name (`--listen NAME=ADDR`), else `listenerI`; when n > 0 |
//! | `FORKPOOL_CHANNEL_FD` | 3+n, except in `none` mode                              |
//! | `FORKPOOL_PROTOCOL`   | `1`, the back-channel protocol version, except in `none` mode |
//! | `FORKPOOL_SLOT`       | the worker's slot number                                |
//! | `FORKPOOL_GENERATION` | the pool generation (it goes up on every reload)        |
//! | `FORKPOOL_DISPATCH`   | `handoff`, `order`, `shared`, `herd` or `none` (`kernel` dispatch says `handoff`) |
//! | `FORKPOOL_BACKLOG`    | the pool's `listen(2)` backlog (`--backlog`), in every mode: never `listen` again on an inherited socket |
//! | `FORKPOOL_KERNEL_DISPATCH` | `1` in `kernel` dispatch                           |
//! | `FORKPOOL_OVERFLOW_FD` | `kernel` only: 3+n+1, the first of the pool's n listeners |
//! | `FORKPOOL_BOARD_FD`   | `kernel` only: the scoreboard map, 3+2n+1               |
//! | `FORKPOOL_MAX_REQUESTS` | `kernel` only: connections before it leaves, when limited |
//! | `FORKPOOL_MAX_CHILD_MEMORY` | `kernel` only: bytes of unshared memory (USS) past which it leaves, when limited |
//! | `FORKPOOL_MAX_CHILD_LIFETIME_MS` | `kernel` only: milliseconds of life after which it leaves, when limited |
//!
//! Variables of these names that the supervisor itself inherited are removed,
//! so a worker never mistakes its parent's socket activation for its own.

use std::os::fd::RawFd;

/// The first descriptor passed beyond the standard streams (systemd's
/// `SD_LISTEN_FDS_START`).
pub const FIRST_FD: RawFd = 3;

/// Names the back-channel's descriptor number.
pub const CHANNEL_FD_VAR: &str = "FORKPOOL_CHANNEL_FD";
/// The back-channel protocol version, `1`.
pub const PROTOCOL_VAR: &str = "FORKPOOL_PROTOCOL";
/// The worker's slot number.
pub const SLOT_VAR: &str = "FORKPOOL_SLOT";
/// The pool generation the worker belongs to.
pub const GENERATION_VAR: &str = "FORKPOOL_GENERATION";
/// The dispatch mode's name.
pub const DISPATCH_VAR: &str = "FORKPOOL_DISPATCH";
/// The pool's `listen(2)` backlog, for a runtime whose server API calls
/// `listen` on the socket it is given (Node's `server.listen({fd})`): it
/// must pass this number, or it silently replaces the pool's backlog.
pub const BACKLOG_VAR: &str = "FORKPOOL_BACKLOG";
/// `1` in `kernel` dispatch, where `FORKPOOL_DISPATCH` says `handoff`: a
/// worker that knows kernel dispatch says `K` and keeps its record; one
/// that does not serves as in `handoff`, which it is for it.
pub const KERNEL_DISPATCH_VAR: &str = "FORKPOOL_KERNEL_DISPATCH";
/// `kernel` dispatch: the first of the pool's listeners (the overflow),
/// which follow the slot's own sockets.
pub const OVERFLOW_FD_VAR: &str = "FORKPOOL_OVERFLOW_FD";
/// `kernel` dispatch: the scoreboard map's descriptor, to `mmap`.
pub const BOARD_FD_VAR: &str = "FORKPOOL_BOARD_FD";
/// `kernel` dispatch: the connections this worker serves before it leaves
/// on its own (`X`); absent or 0: no limit.
pub const MAX_REQUESTS_VAR: &str = "FORKPOOL_MAX_REQUESTS";
/// `kernel` dispatch: the unshared memory (USS, in bytes) past which the
/// worker leaves on its own (`X`) after the connection that took it
/// there, before it goes idle; absent or 0: no limit. Set on a template
/// too, so the workers it forks inherit it.
pub const MAX_CHILD_MEMORY_VAR: &str = "FORKPOOL_MAX_CHILD_MEMORY";
/// `kernel` dispatch: the milliseconds, counted from the worker's start,
/// after which it leaves on its own (`X`) after its connection, before it
/// goes idle; absent or 0: no limit. Set on a template too (without the
/// per-child jitter), so the workers it forks inherit it.
pub const MAX_CHILD_LIFETIME_MS_VAR: &str = "FORKPOOL_MAX_CHILD_LIFETIME_MS";
/// systemd socket activation: how many listeners follow fd 2.
pub const LISTEN_FDS_VAR: &str = "LISTEN_FDS";
/// systemd socket activation: the pid the listeners are meant for.
pub const LISTEN_PID_VAR: &str = "LISTEN_PID";
/// systemd socket activation: a name per listener, `:`-separated.
pub const LISTEN_FDNAMES_VAR: &str = "LISTEN_FDNAMES";
/// Set, to the template channel's descriptor number, only in a program
/// started as a template (`forkpool run --preload`); see `docs/protocol.md`,
/// "Templates".
pub const TEMPLATE_FD_VAR: &str = "FORKPOOL_TEMPLATE_FD";
/// The supervisor's pid, given to a template so that the workers it forks
/// can check they were reparented to the supervisor.
pub const SUPERVISOR_PID_VAR: &str = "FORKPOOL_SUPERVISOR_PID";
