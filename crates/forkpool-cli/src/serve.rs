//! Turning resolved [`Settings`] into a [`Pool`] ready to run: listeners
//! (inherited from systemd or an upgrading supervisor, or bound here), the
//! control socket, metrics, the children's user, and SIGHUP's reloader.

use std::io::Write;

use forkpool::{Listener, Pool};
use tracing::warn;

use crate::settings::{ServeArgs, Settings};

use forkpool::pool::{AGENT_FD_NAME, METRICS_FD_NAME, SOCKET_ACTIVATED_ENV, UPGRADE_FROM_ENV};

/// Builds the pool and prints `forkpool: listening on ADDR` for each
/// listener (and `forkpool: metrics on ...`) on standard output.
///
/// One function on purpose: the start-up steps in the order they must
/// happen, with the lines collected as they go and printed only once every
/// step has succeeded.
pub fn prepare(args: &ServeArgs, settings: &Settings) -> Result<Pool, String> {
    let mut pool = Pool::new(settings.pool.clone());
    // Printed only once everything is bound, so a script that waits for
    // these lines can use the control socket and metrics at once.
    let mut out = Vec::new();
    let mut inherited = Listener::inherited().map_err(|e| e.to_string())?;
    // A USR2 predecessor passes its metrics and agent ports along.
    let mut passed_metrics = take_named(&mut inherited, METRICS_FD_NAME);
    let mut passed_agent = take_named(&mut inherited, AGENT_FD_NAME);
    if inherited.is_empty() {
        for spec in &settings.listen {
            let kernel = settings.pool.dispatch == forkpool::DispatchMode::Kernel;
            let listener = Listener::bind_with(&spec.addr, settings.pool.backlog, kernel)
                .map_err(|e| e.to_string())?
                .with_name(spec.name.clone());
            if let Some(mode) = settings.unix_mode {
                listener
                    .set_unix_mode(mode)
                    .map_err(|e| format!("cannot set the mode of {}: {e}", spec.addr))?;
            }
            let _ = writeln!(out, "forkpool: listening on {}", listener.local_addr());
            pool.add_listener(listener);
        }
    } else {
        // From systemd, or from a predecessor that had them from systemd:
        // they outlive this process.
        let from_predecessor = std::env::var_os(UPGRADE_FROM_ENV).is_some();
        if !from_predecessor || std::env::var_os(SOCKET_ACTIVATED_ENV).is_some() {
            pool.listeners_from_socket_activation();
        }
        for listener in inherited {
            let _ = writeln!(
                out,
                "forkpool: listening on {} (inherited)",
                listener.local_addr()
            );
            pool.add_listener(listener);
        }
    }
    let (path, explicit) = &settings.control;
    // A supervisor started by its predecessor's upgrade (USR2) takes over
    // the control socket instead of refusing it.
    let take_over = std::env::var_os(UPGRADE_FROM_ENV).is_some();
    match pool.control_socket(path, take_over) {
        Ok(()) => {}
        Err(e) if *explicit => return Err(e.to_string()),
        Err(e) => warn!("{e}; `forkpool status` will not reach this pool (pass --control PATH)"),
    }
    if let Some(addr) = settings.metrics {
        let bound = match passed_metrics.take() {
            Some(listener) => pool.adopt_metrics(listener),
            None => pool.metrics(addr),
        }
        .map_err(|e| e.to_string())?;
        let _ = writeln!(out, "forkpool: metrics on http://{bound}/metrics");
    }
    if let Some(addr) = settings.agent {
        let bound = match passed_agent.take() {
            Some(listener) => pool.adopt_agent(listener),
            None => pool.agent(addr),
        }
        .map_err(|e| e.to_string())?;
        let _ = writeln!(out, "forkpool: agent check on {bound}");
    }
    if let Some(credentials) = settings.credentials {
        pool.run_children_as(credentials)
            .map_err(|e| e.to_string())?;
    }
    pool.on_reload(args.reloader());
    pool.enable_upgrades()
        .map_err(|e| format!("cannot find this program for upgrades: {e}"))?;
    let mut stdout = std::io::stdout().lock();
    let _ = stdout.write_all(&out);
    let _ = stdout.flush();
    Ok(pool)
}

/// Removes the listener named `name` from `listeners`, if one is there.
fn take_named(listeners: &mut Vec<Listener>, name: &str) -> Option<Listener> {
    let i = listeners.iter().position(|l| l.name() == name)?;
    Some(listeners.remove(i))
}
