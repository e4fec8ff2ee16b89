//! The network in the simulator: what each arriving connection turns out
//! to be. The kernel's program picks a child at the SYN, before any of
//! this is known, so most of these hold a reservation that nothing ever
//! fills, or fill it late:
//! - a SYN whose handshake never completes (a scanner, a client gone),
//!   a reset before accept (a load balancer's TCP check), a client silent
//!   under `TCP_DEFER_ACCEPT` (never queued);
//! - data that comes late under deferred accept (queued long after the
//!   SYN);
//! - a close with no data, or a reset after accept (served at once);
//! - a slow client (served for seconds);
//! - and ordinary connections, queued within a round trip.
//!
//! A burst beyond the listen backlog is refused by the kernel.

use super::world::{Conn, MS};
use super::Sim;

/// What a connection turns out to be, drawn at its SYN.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    /// Never queued anywhere: its reservation dies.
    Never,
    /// Queued this long after the SYN, then served for `serve` ns.
    Queued { after: u64, serve: u64 },
}

/// The listen backlog of the simulated overflow socket.
pub(super) const BACKLOG: usize = 128;

impl Sim {
    /// The next connection's kind: with the network's faults on, a third
    /// never come, and some come late, empty or slow.
    pub(super) fn draw_kind(&mut self) -> Kind {
        let w = &mut self.world;
        if !self.scenario.network {
            let after = w.rng.below(MS);
            return Kind::Queued {
                after,
                serve: w.ms(1, 40),
            };
        }
        match w.rng.below(100) {
            0..=29 => Kind::Never,
            30..=34 => Kind::Queued {
                after: w.ms(40, 400),
                serve: w.ms(1, 40),
            },
            35..=44 => Kind::Queued {
                after: w.rng.below(2 * MS),
                serve: w.rng.below(MS),
            },
            45..=49 => Kind::Queued {
                after: w.rng.below(2 * MS),
                serve: w.ms(200, 2000),
            },
            _ => Kind::Queued {
                after: w.rng.below(2 * MS),
                serve: w.ms(1, 40),
            },
        }
    }

    /// A new connection, waiting to be queued: its id.
    pub(super) fn new_conn(&mut self, serve: u64) -> u64 {
        let id = self.world.conns.len() as u64;
        self.world.conns.push(Conn::Queued);
        self.serve_for.push(serve);
        id
    }

    /// How long connection `conn` takes to serve.
    pub(super) fn service(&self, conn: u64) -> u64 {
        self.serve_for[conn as usize]
    }

    /// A connection reaches the overflow's accept queue: refused if it is
    /// full, closed if the pool is stopping (its listeners are).
    pub(super) fn queue_on_overflow(&mut self, conn: u64) {
        if self.core.shutdown.is_some() {
            self.world.conns[conn as usize] = Conn::Closed;
            return;
        }
        if self.world.backlog.len() >= BACKLOG {
            self.world.conns[conn as usize] = Conn::Closed;
            self.outcome.backlog_full += 1;
            return;
        }
        self.world.backlog.push_back(conn);
        self.messages_worker_takes_overflow();
    }
}
