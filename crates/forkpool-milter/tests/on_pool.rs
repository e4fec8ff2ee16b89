//! Milter conversations on a session pool in this process: a hook that
//! panics costs only its own conversation (the MTA gets a tempfail for the
//! command it waited on), and an idle conversation is closed.

use std::io::Write;
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::time::Duration;

use forkpool_milter::{
    client, Actions, Command, Context, Decoder, Filter, MilterContext, MilterSession, OptNeg,
    Protocol, Reply, Status,
};
use forkpool_sessions::{SessionConfig, SessionPool};

/// Panics on a recipient starting with `<panic`.
struct Fragile;

impl Filter for Fragile {
    type Shared = ();

    fn new(_: &Arc<()>) -> Self {
        Fragile
    }

    fn rcpt(&mut self, _: &Context<'_>, recipient: &[u8], _: &[Vec<u8>]) -> Status {
        assert!(!recipient.starts_with(b"<panic"), "a bug in filter code");
        Status::Continue
    }
}

struct Mta {
    stream: TcpStream,
    decoder: Decoder,
}

impl Mta {
    fn connect(pool_addr: std::net::SocketAddr) -> Mta {
        let stream = TcpStream::connect(pool_addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        let mut mta = Mta {
            stream,
            decoder: Decoder::default(),
        };
        mta.send(Command::OptNeg(OptNeg {
            version: 6,
            actions: Actions(0x1ff),
            protocol: Protocol(0x1f_ffff),
        }));
        assert!(matches!(mta.reply(), Some(Reply::Negotiate(_))));
        mta
    }

    fn send(&mut self, command: Command) {
        client::send_command(&mut self.stream, &command).unwrap();
    }

    fn reply(&mut self) -> Option<Reply> {
        client::read_reply(&mut self.stream, &mut self.decoder).unwrap_or(None)
    }

    fn rcpt(&mut self, who: &str) -> Option<Reply> {
        self.send(Command::Rcpt {
            recipient: who.as_bytes().to_vec(),
            args: vec![],
        });
        self.reply()
    }
}

fn pool(config: SessionConfig) -> (SessionPool<MilterSession<Fragile>>, std::net::SocketAddr) {
    let pool =
        SessionPool::<MilterSession<Fragile>>::start(config, MilterContext::new(())).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    pool.serve(listener).unwrap();
    (pool, addr)
}

#[test]
fn a_panicking_hook_tempfails_its_own_conversation_only() {
    let (pool, addr) = pool(SessionConfig {
        workers: 1,
        ..SessionConfig::default()
    });
    let mut calm = Mta::connect(addr);
    let mut doomed = Mta::connect(addr);
    assert_eq!(calm.rcpt("<a@example.org>"), Some(Reply::Continue));
    assert_eq!(doomed.rcpt("<panic@example.org>"), Some(Reply::Tempfail));
    assert_eq!(doomed.reply(), None, "then the conversation is closed");
    // The other conversation, on the same (only) worker thread, goes on.
    assert_eq!(calm.rcpt("<b@example.org>"), Some(Reply::Continue));
    assert_eq!(
        Mta::connect(addr).rcpt("<c@example.org>"),
        Some(Reply::Continue)
    );
    pool.shutdown();
}

#[test]
fn an_idle_conversation_is_closed() {
    let (pool, addr) = pool(SessionConfig {
        idle_timeout: Some(Duration::from_millis(200)),
        ..SessionConfig::default()
    });
    let mut idle = Mta::connect(addr);
    // The read times out after 10 s; the pool closes it long before.
    let started = std::time::Instant::now();
    assert_eq!(idle.reply(), None);
    assert!(started.elapsed() < Duration::from_secs(5));
    pool.shutdown();
}

#[test]
fn a_long_pipelined_body_is_read_in_shares_and_answered_in_order() {
    let (pool, addr) = pool(SessionConfig {
        workers: 1,
        ..SessionConfig::default()
    });
    let mut mta = Mta::connect(addr);
    // 3 MiB of body at once: more than one step reads.
    let chunk = vec![b'x'; 65535];
    let mut wire = Vec::new();
    for _ in 0..48 {
        Command::Body(chunk.clone()).encode(&mut wire).unwrap();
    }
    let mut writer = mta.stream.try_clone().unwrap();
    let sender = std::thread::spawn(move || writer.write_all(&wire).unwrap());
    for n in 0..48 {
        assert_eq!(mta.reply(), Some(Reply::Continue), "chunk {n}");
    }
    sender.join().unwrap();
    pool.shutdown();
}

/// Hangs on a recipient starting with `<hang` until the test lets go.
struct Sticky {
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
}

impl Filter for Sticky {
    type Shared = Gate;

    fn new(gate: &Arc<Gate>) -> Self {
        Sticky {
            gate: Arc::clone(gate),
        }
    }

    fn rcpt(&mut self, _: &Context<'_>, recipient: &[u8], _: &[Vec<u8>]) -> Status {
        if recipient.starts_with(b"<hang") {
            let open = self.gate.open.lock().unwrap();
            let _open = self.gate.opened.wait_while(open, |open| !*open).unwrap();
        }
        Status::Continue
    }
}

#[test]
fn a_hook_past_its_deadline_gets_its_conversation_tempfailed_and_closed() {
    let context =
        MilterContext::with_step_deadline(Gate::default(), Duration::from_millis(300)).unwrap();
    let config = SessionConfig {
        workers: 2,
        ..SessionConfig::default()
    };
    let pool = SessionPool::<MilterSession<Sticky>>::start(config, context).unwrap();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    pool.serve(listener).unwrap();

    // However the test ends, the hook is let go, so the pool can stop.
    struct Release(Arc<Gate>);
    impl Drop for Release {
        fn drop(&mut self) {
            *self.0.open.lock().unwrap() = true;
            self.0.opened.notify_all();
        }
    }
    let release = Release(Arc::clone(&pool.context().shared));

    let mut stuck = Mta::connect(addr);
    let mut other = Mta::connect(addr);
    let started = std::time::Instant::now();
    assert_eq!(stuck.rcpt("<hang@example.org>"), Some(Reply::Tempfail));
    assert_eq!(stuck.reply(), None, "then the conversation is closed");
    assert!(started.elapsed() < Duration::from_secs(5));
    // The hook still holds one worker; the other serves the rest.
    assert_eq!(other.rcpt("<a@example.org>"), Some(Reply::Continue));
    assert_eq!(pool.context().watchdog.as_ref().unwrap().fired(), 1);
    // Let the hook return: its late answer goes nowhere.
    drop(release);
    assert_eq!(other.rcpt("<b@example.org>"), Some(Reply::Continue));
    pool.shutdown();
}
