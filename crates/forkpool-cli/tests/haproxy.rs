//! Two forkpool pools behind a real HAProxy (Debian's, started by the test
//! on loopback; `bash .ci/deps/haproxy.sh` installs it): both get traffic,
//! losing one costs no more than what was in flight on it, reloading,
//! upgrading or stopping (with the agent check and a drain delay) one under
//! load fails no request, and a saturated pool gets no new work until it
//! frees.

mod common;
#[path = "common/haproxy_support.rs"]
mod haproxy_support;

use std::io::Write;
use std::net::TcpListener;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use forkpool::fleet::agent::AgentReply;
use forkpool::fleet::{Capacity, Phase};

use common::{kill9, temp_path, DemoPool};
use haproxy_support::{report, require_haproxy, Haproxy, Load, Server};

const POOL_ARGS: &[&str] = &["--min-children", "2", "--max-children", "4"];

fn server(name: &str, pool: &DemoPool) -> Server {
    Server {
        name: name.to_string(),
        addr: pool.addr,
        agent_port: None,
    }
}

/// HAProxy in front of pools `a` and `b` with load running, once both
/// have served their share.
fn balance(program: &Path, a: &DemoPool, b: &DemoPool) -> (Haproxy, Load) {
    balance_servers(program, &[server("pool_a", a), server("pool_b", b)])
}

/// Like [`balance`], pool_a answering the agent check on the port it printed.
fn balance_with_agent(program: &Path, a: &DemoPool, b: &DemoPool) -> (Haproxy, Load) {
    let pool_a = Server {
        agent_port: Some(agent_port(a)),
        ..server("pool_a", a)
    };
    balance_servers(program, &[pool_a, server("pool_b", b)])
}

/// HAProxy in front of `servers` with load running, once the first two
/// have served their share.
fn balance_servers(program: &Path, servers: &[Server]) -> (Haproxy, Load) {
    let haproxy = Haproxy::start(program, servers, "/");
    let load = Load::start(haproxy.addr, 4, "/?work_ms=20", Duration::from_secs(90));
    let shared = haproxy.wait_for(Duration::from_secs(20), |s| {
        s.len() == 2 && s.iter().all(|s| s.total >= 30)
    });
    assert!(shared.is_some(), "{:?}", haproxy.servers());
    (haproxy, load)
}

#[test]
fn reloads_of_one_pool_under_load_fail_nothing() {
    let Some(program) = require_haproxy() else {
        return;
    };
    let a = DemoPool::start(POOL_ARGS);
    let b = DemoPool::start(POOL_ARGS);
    let (haproxy, load) = balance(&program, &a, &b);
    const ROUNDS: i64 = 5;
    for round in 1..=ROUNDS {
        a.signal(1);
        let deadline = Instant::now() + Duration::from_secs(10);
        while a.status()["generation"] != round + 1 {
            assert!(Instant::now() < deadline, "reload {round} never happened");
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(load.wait_more(40, Duration::from_secs(20)));
    }
    let last_reload = load.elapsed();
    let before = haproxy.server("pool_a").total;
    assert!(
        haproxy
            .wait_for(Duration::from_secs(20), |s| {
                s.iter()
                    .any(|s| s.name == "pool_a" && s.total >= before + 30)
            })
            .is_some(),
        "pool_a got no traffic after its reloads: {:?}",
        haproxy.servers()
    );
    let outcomes = load.finish();
    report("reload", &outcomes);
    assert!(outcomes.served_by_between("pool_a", last_reload, Duration::MAX) > 0);
    assert_eq!(a.status()["totals"]["reloads"], ROUNDS);
    assert_eq!(haproxy.server("pool_a").status, "UP");
}

/// True once `pid` has exited (a zombie not yet reaped, or gone): its
/// sockets are closed by then.
fn has_exited(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|stat| stat.rsplit(") ").next().is_some_and(|s| s.starts_with('Z')))
        .unwrap_or(true)
}

/// The supervisor a `USR2` starts is nobody's child in the test: it and
/// its children are killed by pid when the test ends.
struct Successor(i32);

impl Drop for Successor {
    fn drop(&mut self) {
        let children = format!("/proc/{0}/task/{0}/children", self.0);
        let children = std::fs::read_to_string(children).unwrap_or_default();
        std::iter::once(self.0)
            .chain(children.split_whitespace().filter_map(|p| p.parse().ok()))
            .for_each(kill9);
    }
}

#[test]
fn upgrade_of_one_pool_under_load_fails_nothing() {
    let Some(program) = require_haproxy() else {
        return;
    };
    // Its own copy of the binary, which the successor re-executes.
    let binary = temp_path("forkpool-upgrade-bin");
    std::fs::copy(common::forkpool_bin(), &binary).unwrap();
    let mut a = DemoPool::start_from(&binary, POOL_ARGS, &[]);
    let b = DemoPool::start(POOL_ARGS);
    let (haproxy, load) = balance(&program, &a, &b);
    let old = a.pid;
    a.signal(12);
    let exit = a
        .wait_exit(Duration::from_secs(30))
        .expect("the old supervisor hands over and exits");
    assert!(exit.success(), "{exit:?}");
    let new = a.status()["pid"].as_i64().expect("pid") as i32;
    let _successor = Successor(new);
    assert_ne!(new, old);
    let upgraded_at = load.elapsed();
    assert!(load.wait_more(200, Duration::from_secs(30)));
    let outcomes = load.finish();
    report("upgrade", &outcomes);
    assert!(outcomes.served_by_between("pool_a", upgraded_at, Duration::MAX) > 0);
    assert_eq!(haproxy.server("pool_a").status, "UP");
    let _ = std::fs::remove_file(&binary);
}

#[test]
fn sigkill_of_one_supervisor_marks_it_down_and_fails_only_what_was_in_flight() {
    let Some(program) = require_haproxy() else {
        return;
    };
    // pool_a also answers the agent check: a killed supervisor must be
    // marked down with both checks configured (HAProxy ignores an agent
    // that stops answering; the health check takes it out).
    let mut args = POOL_ARGS.to_vec();
    args.extend(["--agent", "127.0.0.1:0"]);
    let a = DemoPool::start(&args);
    let b = DemoPool::start(POOL_ARGS);
    let (haproxy, load) = balance_with_agent(&program, &a, &b);

    let children = a.children(); // remembered, so Drop kills the orphans
    let killed_at = load.elapsed();
    kill9(a.pid);
    // The pool is gone once its supervisor and the children it leaves
    // behind have exited: the children hold the listener too, and close it
    // when they notice their parent is gone.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::iter::once(&a.pid)
        .chain(&children)
        .all(|p| has_exited(*p))
    {
        assert!(Instant::now() < deadline, "pool_a outlived SIGKILL");
        std::thread::sleep(Duration::from_millis(1));
    }
    let gone_at = load.elapsed();
    let down = haproxy.wait_for(Duration::from_secs(5), |s| {
        s.iter().any(|s| s.name == "pool_a" && s.is_down())
    });
    assert!(
        down.is_some(),
        "HAProxy never marked the killed pool down: {:?}",
        haproxy.servers()
    );
    let down_at = load.elapsed();
    assert!(
        load.wait_more(200, Duration::from_secs(30)),
        "the load stalled after the kill"
    );
    let outcomes = load.finish();
    let failures = outcomes.failures();
    // In flight on the killed pool: sent before it was gone and not
    // answered by the other one.
    let in_flight_on_a = outcomes
        .0
        .iter()
        .filter(|o| o.sent < gone_at && o.done > killed_at)
        .filter(|o| o.server.as_deref() != Some("pool_b"))
        .count();
    println!(
        "sigkill: sent {}, failed {}, pool_a {}, pool_b {}, in flight on pool_a {}, \
         pool gone {:?} and marked down {:?} after the kill\n{}",
        outcomes.sent(),
        failures.len(),
        outcomes.served_by("pool_a"),
        outcomes.served_by("pool_b"),
        in_flight_on_a,
        gone_at - killed_at,
        down_at - killed_at,
        outcomes.timeline(&["pool_a", "pool_b"], Duration::from_millis(250))
    );
    assert!(outcomes.served_by("pool_a") > 0 && outcomes.served_by("pool_b") > 0);
    // A failure is a request that was in flight on the killed pool: sent
    // while its listener still existed. Everything sent once it was gone
    // was retried on, or sent to, the other pool.
    for f in &failures {
        assert!(
            f.sent < gone_at,
            "a request sent {:?} after the pool was gone failed: {f:?}",
            f.sent - gone_at
        );
    }
    // Once HAProxy marked it down, the other pool answers everything.
    assert_eq!(
        outcomes.served_by_between("pool_a", down_at, Duration::MAX),
        0,
        "requests still reached the dead pool after it was marked down"
    );
}

/// The agent port a pool started with `--agent 127.0.0.1:0` printed.
fn agent_port(pool: &DemoPool) -> u16 {
    assert!(pool
        .stdout
        .wait_for("forkpool: agent check on ", Duration::from_secs(10)));
    pool.stdout
        .dump()
        .lines()
        .find_map(|l| l.strip_prefix("forkpool: agent check on "))
        .and_then(|a| a.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.port())
        .expect("agent address")
}

/// `TERM` to one pool under load: with the agent check and a drain delay
/// HAProxy stops sending to it before its listeners close, and what was
/// queued on them is served: no request fails.
#[test]
fn term_of_one_pool_with_a_drain_delay_fails_nothing() {
    let Some(program) = require_haproxy() else {
        return;
    };
    let mut args = POOL_ARGS.to_vec();
    args.extend(["--agent", "127.0.0.1:0", "--drain-delay", "3s"]);
    let mut a = DemoPool::start(&args);
    let b = DemoPool::start(POOL_ARGS);
    let (haproxy, load) = balance_with_agent(&program, &a, &b);
    a.signal(15);
    let drained = haproxy.wait_for(Duration::from_secs(5), |s| {
        s.iter()
            .any(|s| s.name == "pool_a" && s.status.starts_with("DRAIN"))
    });
    assert!(drained.is_some(), "never drained: {:?}", haproxy.servers());
    assert!(
        a.wait_exit(Duration::from_secs(30)).is_some(),
        "pool_a stops after its drain delay"
    );
    assert!(load.wait_more(100, Duration::from_secs(30)));
    let outcomes = load.finish();
    report("term with drain delay", &outcomes);
}

/// Saturating one pool (every child busy on slow requests sent straight
/// to it): through the agent check HAProxy sends at least 90% of new
/// requests to the other pool within 2 s, and shares again once it frees.
#[test]
fn a_saturated_pool_gets_new_work_only_after_it_frees() {
    let Some(program) = require_haproxy() else {
        return;
    };
    let a = DemoPool::start(&[
        "--min-children",
        "2",
        "--max-children",
        "2",
        "--agent",
        "127.0.0.1:0",
    ]);
    let b = DemoPool::start(POOL_ARGS);
    let (haproxy, load) = balance_with_agent(&program, &a, &b);
    let saturated_at = load.elapsed();
    let slow: Vec<_> = (0..2)
        .map(|_| common::send(a.addr, "/?work_ms=6000"))
        .collect();
    let weight_one = haproxy.wait_for(Duration::from_secs(5), |s| {
        s.iter().any(|s| s.name == "pool_a" && s.weight == 1)
    });
    assert!(weight_one.is_some(), "{:?}", haproxy.servers());
    let window = (
        saturated_at + Duration::from_secs(2),
        saturated_at + Duration::from_secs(5),
    );
    while load.elapsed() < window.1 {
        std::thread::sleep(Duration::from_millis(50));
    }
    for mut s in slow {
        let mut out = String::new();
        let _ = std::io::Read::read_to_string(&mut s, &mut out);
    }
    let recovered_at = load.elapsed();
    let back = haproxy.wait_for(Duration::from_secs(10), |s| {
        s.iter().any(|s| s.name == "pool_a" && s.weight == 100)
    });
    assert!(back.is_some(), "{:?}", haproxy.servers());
    assert!(load.wait_more(200, Duration::from_secs(30)));
    let outcomes = load.finish();
    report("saturation", &outcomes);
    let on_a = outcomes.served_by_between("pool_a", window.0, window.1);
    let on_b = outcomes.served_by_between("pool_b", window.0, window.1);
    let share_b = on_b as f64 / (on_a + on_b).max(1) as f64;
    println!("saturated window: pool_a {on_a}, pool_b {on_b}, share to pool_b {share_b:.3}");
    assert!(on_b > 0 && share_b >= 0.9, "pool_a {on_a}, pool_b {on_b}");
    assert!(
        outcomes.served_by_between("pool_a", recovered_at, Duration::MAX) > 0,
        "pool_a got no work after it recovered"
    );
}

/// An agent-check port on loopback that answers whatever line the test
/// sets, until dropped.
struct Agent {
    port: u16,
    line: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Agent {
    fn start(first: &AgentReply) -> Agent {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let port = listener.local_addr().unwrap().port();
        let line = Arc::new(Mutex::new(first.line()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (line, stop) = (Arc::clone(&line), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((mut stream, _)) => {
                            let reply = line.lock().unwrap().clone();
                            let _ = stream.write_all(reply.as_bytes());
                        }
                        Err(_) => std::thread::sleep(Duration::from_millis(5)),
                    }
                }
            })
        };
        Agent {
            port,
            line,
            stop,
            thread: Some(thread),
        }
    }

    fn answer(&self, reply: &AgentReply) {
        *self.line.lock().unwrap() = reply.line();
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A serving pool's capacity.
fn capacity(idle: u32, busy: u32, phase: Phase) -> Capacity {
    Capacity {
        idle,
        busy,
        starting: 0,
        waiting: 0,
        max_children: 4,
        spawn_held_back: false,
        phase,
    }
}

#[test]
fn haproxy_understands_every_agent_reply() {
    let Some(program) = require_haproxy() else {
        return;
    };
    let pool = DemoPool::start(POOL_ARGS);
    let reply = |c: Capacity| AgentReply::for_capacity(&c);
    let agent = Agent::start(&reply(capacity(1, 3, Phase::Serving)));
    let haproxy = Haproxy::start(
        &program,
        &[Server {
            agent_port: Some(agent.port),
            ..server("pool_a", &pool)
        }],
        "/",
    );
    // The weight only matters while the server takes traffic: HAProxy
    // keeps the last one through `drain` and `down`.
    let expect = |what: &str, status: &str, weight: Option<u32>| {
        let seen = haproxy.wait_for(Duration::from_secs(5), |s| {
            s.iter()
                .any(|s| s.status.starts_with(status) && weight.is_none_or(|w| s.weight == w))
        });
        assert!(
            seen.is_some(),
            "{what}: wanted {status} with weight {weight:?}, HAProxy shows {:?}",
            haproxy.servers()
        );
    };
    expect("a quarter free", "UP", Some(25));
    agent.answer(&reply(capacity(4, 0, Phase::Draining)));
    expect("draining", "DRAIN", None);
    agent.answer(&reply(capacity(4, 0, Phase::Serving)));
    expect("ready again", "UP", Some(100));
    agent.answer(&reply(Capacity {
        spawn_held_back: true,
        ..capacity(0, 0, Phase::Serving)
    }));
    expect("no ready child", "DOWN", None);
    agent.answer(&reply(capacity(0, 4, Phase::Serving)));
    expect("saturated", "UP", Some(1));
    agent.answer(&reply(capacity(0, 0, Phase::Starting)));
    expect("starting", "DOWN", None);
    agent.answer(&reply(capacity(2, 2, Phase::Serving)));
    expect("half free", "UP", Some(50));
}

#[test]
fn the_example_config_is_valid() {
    let Some(program) = require_haproxy() else {
        return;
    };
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../dist/haproxy/haproxy.cfg");
    let out = std::process::Command::new(program)
        .arg("-c")
        .arg("-f")
        .arg(&example)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "haproxy -c refuses {}:\n{}{}",
        example.display(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
