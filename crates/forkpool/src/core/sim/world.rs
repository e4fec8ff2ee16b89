//! The simulated world: processes that follow the protocol or break it in
//! each documented way, connections, and a clock that only moves when the
//! next thing is due.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::Duration;

use super::rng::Rng;
use crate::policy::shutdown::Stop;

/// How a simulated worker behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Behaviour {
    /// Follows the protocol.
    Good,
    /// Exits before saying `Ready`.
    CrashAtStart,
    /// Dies at a random moment after `Ready`.
    CrashLater,
    /// Never says anything and never exits.
    Silent,
    /// Says `Ready`, then never answers a ping.
    Deaf,
    /// Ignores `Quit`.
    HangOnQuit,
    /// On `Quit`, closes its channel at once and takes up to 15 s to exit.
    SlowExit,
    /// Sends hundreds of messages at once.
    Flood,
    /// Says `Ready` with another pid.
    LiesAboutPid,
    /// Says `Idle` before `Ready`.
    OutOfOrder,
    /// Sends an empty datagram and keeps its channel open.
    EmptyDatagram,
}

impl Behaviour {
    /// Every behaviour, for random picks.
    pub const ALL: [Behaviour; 11] = [
        Behaviour::Good,
        Behaviour::CrashAtStart,
        Behaviour::CrashLater,
        Behaviour::Silent,
        Behaviour::Deaf,
        Behaviour::HangOnQuit,
        Behaviour::SlowExit,
        Behaviour::Flood,
        Behaviour::LiesAboutPid,
        Behaviour::OutOfOrder,
        Behaviour::EmptyDatagram,
    ];
}

/// How a simulated template behaves (`--preload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum TemplateBehaviour {
    /// Follows the protocol.
    Good,
    /// Exits before saying `R`.
    CrashAtStart,
    /// Takes fork orders and never answers them.
    SilentOnOrders,
    /// Names, in `W`, the supervisor's own sidecar.
    LieSidecar,
    /// Names itself in `W`.
    LieSelf,
    /// Names another slot's worker in `W`.
    LieOtherSlot,
    /// Ignores SIGCHLD: the worker it forks dies and is reaped behind the
    /// supervisor's back.
    ReapBehindBack,
    /// Floods its stderr.
    Flood,
    /// Answers `E` (could not fork) to every order.
    ForkFails,
    /// Never says `R` and never exits (new code that hangs on load).
    HangAtStart,
}

impl TemplateBehaviour {
    /// Every behaviour, for random picks.
    pub const ALL: [TemplateBehaviour; 10] = [
        TemplateBehaviour::Good,
        TemplateBehaviour::CrashAtStart,
        TemplateBehaviour::SilentOnOrders,
        TemplateBehaviour::LieSidecar,
        TemplateBehaviour::LieSelf,
        TemplateBehaviour::LieOtherSlot,
        TemplateBehaviour::ReapBehindBack,
        TemplateBehaviour::Flood,
        TemplateBehaviour::ForkFails,
        TemplateBehaviour::HangAtStart,
    ];
}

/// One simulated template.
#[derive(Debug)]
pub(super) struct TemplateProc {
    pub generation: u32,
    pub behaviour: TemplateBehaviour,
    pub exited: bool,
}

/// The supervisor's sidecar: its child, never part of the pool. No
/// signal may ever reach it.
pub(super) const SIDECAR: i32 = 999;

/// One simulated process.
#[derive(Debug)]
pub(super) struct Proc {
    pub slot: usize,
    /// The template that forked it, until it has a group of its own.
    pub in_group_of: Option<i32>,
    /// Reaped by its template behind the supervisor's back.
    pub vanished: bool,
    pub behaviour: Behaviour,
    /// It has exited (a zombie until reaped, or reaped).
    pub exited: bool,
    /// Its channel is closed.
    pub closed: bool,
    /// The connection it holds.
    pub serving: Option<u64>,
    /// It was told to quit.
    pub told_quit: bool,
    /// It said `Ready`.
    pub ready: bool,
    /// Kernel dispatch: it said `K` (keeps a record on the board).
    pub said_k: bool,
    /// Kernel dispatch: it said `G` (its record is moved by the
    /// supervisor from its messages; it waits on the overflow too).
    pub said_g: bool,
    /// Kernel dispatch: its record, once it has its sockets.
    pub board: Option<super::kernel::Record>,
    /// Kernel dispatch: it will write nonsense into its counts.
    pub liar: bool,
}

/// Something the world does at a moment.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Happening {
    Ready(i32),
    Finish(i32, u64),
    Pong(i32, u32),
    Exit(i32, bool),
    Reap(i32),
    Close(i32, bool),
    Flood(i32),
    Lie(i32),
    OutOfOrder(i32),
    Arrival,
    ExternalKill,
    Stop(StopKind),
    /// A template says `R`.
    TemplateReady(i32),
    /// A template answers the fork order for a slot.
    TemplateAnswer(i32, usize),
    /// A template answers a ping.
    TemplatePong(i32, u32),
    /// A template exits.
    TemplateExit(i32),
    /// A template floods its stderr.
    TemplateFlood(i32),
    /// A worker forked by a template sends its first message, with its
    /// pid as the kernel says.
    FirstMessage(i32),
    /// The operator sends SIGHUP.
    Reload,
    /// The operator sends SIGUSR2.
    Upgrade,
    /// A binary upgrade's new supervisor says it is ready (`true`), or
    /// exits before it is.
    Successor(i32, bool),
    /// Kernel dispatch: a connection is queued on the socket its SYN was
    /// given (a slot's, or the overflow: `None`).
    Queued(Option<usize>, u64),
}

/// How a reload's new code is broken: what its workers and its template
/// do instead of starting.
#[derive(Debug, Clone, Copy)]
pub(super) struct BrokenCode {
    pub worker: Behaviour,
    pub template: TemplateBehaviour,
}

impl BrokenCode {
    /// Code broken in a random way: crashing at start, hanging, lying,
    /// dying soon after `Ready`, or a template that does one of those.
    pub fn pick(rng: &mut Rng) -> BrokenCode {
        const WORKERS: [Behaviour; 5] = [
            Behaviour::CrashAtStart,
            Behaviour::Silent,
            Behaviour::LiesAboutPid,
            Behaviour::CrashLater,
            Behaviour::Good,
        ];
        const TEMPLATES: [TemplateBehaviour; 5] = [
            TemplateBehaviour::Good,
            TemplateBehaviour::CrashAtStart,
            TemplateBehaviour::HangAtStart,
            TemplateBehaviour::LieSelf,
            TemplateBehaviour::SilentOnOrders,
        ];
        let worker = WORKERS[rng.below(WORKERS.len() as u64) as usize];
        // Good workers from a good template is no broken code.
        let from = if worker == Behaviour::Good { 1 } else { 0 };
        let template = TEMPLATES[from + rng.below((TEMPLATES.len() - from) as u64) as usize];
        BrokenCode { worker, template }
    }
}

/// A stop signal, orderable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum StopKind {
    Graceful,
    Now,
}

impl StopKind {
    pub fn stop(self) -> Stop {
        match self {
            StopKind::Graceful => Stop::Graceful,
            StopKind::Now => Stop::Now,
        }
    }
}

/// Where a connection is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Conn {
    Queued,
    Held(i32),
    Served,
    Failed,
    Closed,
}

/// The world's state.
pub(super) struct World {
    pub rng: Rng,
    /// Nanoseconds since the start.
    pub now: u64,
    queue: BinaryHeap<Reverse<(u64, u64, Happening)>>,
    order: u64,
    pub procs: BTreeMap<i32, Proc>,
    pub next_pid: i32,
    pub backlog: VecDeque<u64>,
    pub conns: Vec<Conn>,
    /// Forks, by when (for the rate check).
    pub forks: VecDeque<u64>,
    /// Connections failed with their child.
    pub failed: u64,
    /// The templates, by pid.
    pub templates: BTreeMap<i32, TemplateProc>,
    /// The generations whose code is broken, and how.
    pub broken: BTreeMap<u32, BrokenCode>,
}

pub(super) const MS: u64 = 1_000_000;
pub(super) const SEC: u64 = 1_000_000_000;

impl World {
    pub fn new(seed: u64) -> World {
        World {
            rng: Rng::new(seed),
            now: 0,
            queue: BinaryHeap::new(),
            order: 0,
            procs: BTreeMap::new(),
            next_pid: 1000,
            backlog: VecDeque::new(),
            conns: Vec::new(),
            forks: VecDeque::new(),
            failed: 0,
            templates: BTreeMap::new(),
            broken: BTreeMap::new(),
        }
    }

    /// Schedules `what` `after` nanoseconds from now.
    pub fn at(&mut self, after: u64, what: Happening) {
        self.order += 1;
        self.queue
            .push(Reverse((self.now + after, self.order, what)));
    }

    /// When the next happening is due.
    pub fn next_due(&self) -> Option<u64> {
        self.queue.peek().map(|Reverse((t, _, _))| *t)
    }

    /// The next happening, if due by `t`.
    pub fn pop_due(&mut self, t: u64) -> Option<Happening> {
        if self.next_due()? > t {
            return None;
        }
        self.queue.pop().map(|Reverse((_, _, what))| what)
    }

    /// A random span in `lo..hi` milliseconds.
    pub fn ms(&mut self, lo: u64, hi: u64) -> u64 {
        (lo + self.rng.below(hi - lo + 1)) * MS
    }

    /// A process forked into `slot`: its behaviour's first steps are
    /// scheduled.
    pub fn fork(&mut self, slot: usize, behaviour: Behaviour) -> i32 {
        let pid = self.new_proc(slot, behaviour, None);
        let start = self.ms(1, 50);
        match behaviour {
            Behaviour::CrashAtStart => self.at(start, Happening::Exit(pid, false)),
            Behaviour::Silent => {}
            Behaviour::LiesAboutPid => self.at(start, Happening::Lie(pid)),
            Behaviour::OutOfOrder => self.at(start, Happening::OutOfOrder(pid)),
            _ => self.at(start, Happening::Ready(pid)),
        }
        pid
    }

    /// What a process does once it said `Ready`.
    pub fn after_ready(&mut self, pid: i32) {
        let behaviour = self.procs[&pid].behaviour;
        match behaviour {
            Behaviour::CrashLater => {
                let t = self.ms(50, 3000);
                self.at(t, Happening::Exit(pid, false))
            }
            Behaviour::Flood => {
                let t = self.ms(0, 500);
                self.at(t, Happening::Flood(pid))
            }
            Behaviour::EmptyDatagram => {
                let t = self.ms(0, 2000);
                self.at(t, Happening::Close(pid, false))
            }
            _ => {}
        }
    }

    /// The process exits now (or dies): its channel closes and the
    /// supervisor reaps it, in either order.
    pub fn exit(&mut self, pid: i32) {
        if self.templates.contains_key(&pid) {
            // A worker that became the template (a refork).
            return self.template_exit(pid);
        }
        let Some(p) = self.procs.get_mut(&pid) else {
            return;
        };
        if p.exited {
            return;
        }
        p.exited = true;
        if let Some(conn) = p.serving.take() {
            self.conns[conn as usize] = Conn::Failed;
            self.failed += 1;
        }
        let close = self.ms(0, 2);
        let reap = self.ms(0, 2);
        if !self.procs[&pid].closed {
            self.at(close, Happening::Close(pid, true));
        }
        // A worker reaped behind the supervisor's back leaves no zombie.
        if !self.procs[&pid].vanished {
            self.at(reap, Happening::Reap(pid));
        }
    }
}

/// The time as the core sees it: `base` plus the world's clock.
pub(super) fn span(nanos: u64) -> Duration {
    Duration::from_nanos(nanos)
}

impl World {
    /// A template for `generation` started.
    pub fn fork_template(&mut self, generation: u32, behaviour: TemplateBehaviour) -> i32 {
        let pid = self.next_pid;
        self.next_pid += 1;
        self.template_starts(pid, generation, behaviour);
        pid
    }

    /// `pid` is the template of `generation` now, and takes its first
    /// steps as its behaviour says.
    fn template_starts(&mut self, pid: i32, generation: u32, behaviour: TemplateBehaviour) {
        self.templates.insert(
            pid,
            TemplateProc {
                generation,
                behaviour,
                exited: false,
            },
        );
        let t = self.ms(1, 100);
        match behaviour {
            TemplateBehaviour::CrashAtStart => self.at(t, Happening::TemplateExit(pid)),
            TemplateBehaviour::HangAtStart => {}
            _ => self.at(t, Happening::TemplateReady(pid)),
        }
    }

    /// The worker `pid`, told `T`, becomes the template of `generation`
    /// (a refork): its worker channel is no longer read.
    pub fn become_template(&mut self, pid: i32, generation: u32, behaviour: TemplateBehaviour) {
        let p = self.procs.get_mut(&pid).expect("a worker");
        p.closed = true;
        self.template_starts(pid, generation, behaviour);
    }

    /// A worker the template `template` forked for `slot`: in the
    /// template's process group until it says `Ready`.
    pub fn fork_for_template(&mut self, template: i32, slot: usize, behaviour: Behaviour) -> i32 {
        self.new_proc(slot, behaviour, Some(template))
    }

    /// A new process in `slot`, forked by the supervisor or (in its group)
    /// by the template `in_group_of`: counted as a fork.
    fn new_proc(&mut self, slot: usize, behaviour: Behaviour, in_group_of: Option<i32>) -> i32 {
        let pid = self.next_pid;
        self.next_pid += 1;
        self.forks.push_back(self.now);
        self.procs.insert(
            pid,
            Proc {
                slot,
                in_group_of,
                vanished: false,
                behaviour,
                exited: false,
                closed: false,
                serving: None,
                told_quit: false,
                ready: false,
                said_k: false,
                said_g: false,
                board: None,
                liar: false,
            },
        );
        pid
    }

    /// The template `pid` exits (or is killed with its group): the workers
    /// still in its group die with it.
    pub fn template_exit(&mut self, pid: i32) {
        let Some(t) = self.templates.get_mut(&pid) else {
            return;
        };
        if t.exited {
            return;
        }
        t.exited = true;
        if let Some(p) = self.procs.get_mut(&pid) {
            // A worker that had become the template.
            p.exited = true;
        }
        let in_group: Vec<i32> = self
            .procs
            .iter()
            .filter(|(_, p)| p.in_group_of == Some(pid) && !p.exited)
            .map(|(pid, _)| *pid)
            .collect();
        for worker in in_group {
            self.exit(worker);
        }
        let t = self.ms(0, 2);
        self.at(t, Happening::Reap(pid));
    }
}
