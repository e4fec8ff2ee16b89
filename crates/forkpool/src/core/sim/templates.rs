//! The simulator's templates (`--preload`): started by the simulated
//! shell as the core allows, answering fork orders honestly or with each
//! lie a template can tell, forking workers whose first message carries
//! their pid as the kernel would.

use super::super::Input;
use super::world::{Behaviour, Happening, TemplateBehaviour, SIDECAR};
use super::Sim;
use crate::core::child::Child;
use crate::core::vouch::UNVERIFIED_PER_TEMPLATE;
use crate::protocol::{ChildMessage, TemplateReply, TemplateRequest, TEMPLATE_VERSION};

impl Sim {
    /// Keeps a template for the current generation (and the serving
    /// one's while a reload rolls), as the shell does.
    pub(super) fn maintain_template(&mut self) {
        let now = self.now();
        let Some(generation) = self.core.maintain_templates(now) else {
            return;
        };
        let broken = self.world.broken.get(&generation).map(|b| b.template);
        let behaviour = if let Some(broken) = broken {
            broken
        } else if self
            .world
            .rng
            .per_mille(self.scenario.bad_templates_per_mille)
        {
            let all = TemplateBehaviour::ALL;
            all[1 + self.world.rng.below(all.len() as u64 - 1) as usize]
        } else {
            TemplateBehaviour::Good
        };
        let pid = self.world.fork_template(generation, behaviour);
        self.core.template_started(generation, pid, now);
    }

    /// One spawn through the template: a fork order for the lowest free
    /// slot. Returns false when the core allows none now.
    pub(super) fn order_fork(&mut self) -> Result<bool, String> {
        let now = self.now();
        let generation = self.core.generation;
        if !self.core.may_order(generation) {
            return Ok(false);
        }
        let Some(template) = self.template_pid(generation) else {
            return Ok(false);
        };
        let slot = self.core.board.lowest_free();
        self.core.ordered(generation, slot, now);
        let link = Child::new(now, true, TEMPLATE_VERSION);
        self.adopt_checked(slot, 0, link)?;
        if self.world.templates[&template].behaviour != TemplateBehaviour::SilentOnOrders {
            let t = self.world.ms(1, 30);
            self.world.at(t, Happening::TemplateAnswer(template, slot));
        }
        Ok(true)
    }

    /// The live template process of `generation`.
    pub(super) fn template_pid(&self, generation: u32) -> Option<i32> {
        self.world
            .templates
            .iter()
            .find(|(_, t)| t.generation == generation && !t.exited)
            .map(|(pid, _)| *pid)
    }

    fn generation_of(&self, template: i32) -> Option<u32> {
        let t = self.world.templates.get(&template)?;
        (!t.exited).then_some(t.generation)
    }

    /// A template's happening, fed to the core.
    pub(super) fn template_happens(&mut self, what: Happening) -> Result<(), String> {
        let now = self.now();
        match what {
            Happening::TemplateReady(pid) => {
                if let Some(generation) = self.generation_of(pid) {
                    let reply = TemplateReply::Ready { pid: pid as u32 };
                    self.core
                        .on(Input::TemplateReply { generation, reply }, now);
                    if self.world.templates[&pid].behaviour == TemplateBehaviour::Flood {
                        let t = self.world.ms(0, 3000);
                        self.world.at(t, Happening::TemplateFlood(pid));
                    }
                }
            }
            Happening::TemplatePong(pid, seq) => {
                if let Some(generation) = self.generation_of(pid) {
                    let reply = TemplateReply::Pong { seq };
                    self.core
                        .on(Input::TemplateReply { generation, reply }, now);
                }
            }
            Happening::TemplateFlood(pid) => {
                if let Some(generation) = self.generation_of(pid) {
                    let detail = "flooded its stderr".to_string();
                    self.core
                        .on(Input::TemplateBroken { generation, detail }, now);
                }
            }
            Happening::TemplateExit(pid) => self.world.template_exit(pid),
            Happening::TemplateAnswer(pid, slot) => self.answer_fork(pid, slot)?,
            Happening::FirstMessage(pid) => self.first_message(pid)?,
            other => return Err(format!("{other:?} is not a template's")),
        }
        Ok(())
    }

    /// The template `pid` answers the fork order for `slot`, as its
    /// behaviour says.
    fn answer_fork(&mut self, pid: i32, slot: usize) -> Result<(), String> {
        let now = self.now();
        let Some(generation) = self.generation_of(pid) else {
            return Ok(());
        };
        let behaviour = self.world.templates[&pid].behaviour;
        if behaviour == TemplateBehaviour::ForkFails {
            let reply = TemplateReply::ForkFailed {
                slot: slot as u32,
                errno: libc::EAGAIN as u32,
            };
            self.core
                .on(Input::TemplateReply { generation, reply }, now);
            return Ok(());
        }
        let worker_behaviour = self.pick_worker_behaviour(generation);
        let worker = self.world.fork_for_template(pid, slot, worker_behaviour);
        let named = match behaviour {
            TemplateBehaviour::LieSidecar => SIDECAR,
            TemplateBehaviour::LieSelf => pid,
            TemplateBehaviour::LieOtherSlot => self
                .core
                .board
                .iter()
                .map(|(_, s)| s.pid)
                .find(|p| *p > 0)
                .unwrap_or(SIDECAR),
            _ => worker,
        };
        let reply = TemplateReply::Forked {
            slot: slot as u32,
            pid: named as u32,
        };
        self.core
            .on(Input::TemplateReply { generation, reply }, now);
        if behaviour == TemplateBehaviour::ReapBehindBack {
            // It dies at once and its template reaps it: the supervisor
            // sees its channel close and never a zombie.
            let p = self.world.procs.get_mut(&worker).expect("just forked");
            p.vanished = true;
            self.world.exit(worker);
            return Ok(());
        }
        match worker_behaviour {
            Behaviour::CrashAtStart => {
                let t = self.world.ms(0, 30);
                self.world.at(t, Happening::Exit(worker, false));
            }
            Behaviour::Silent => {}
            _ => {
                let t = self.world.ms(1, 50);
                self.world.at(t, Happening::FirstMessage(worker));
            }
        }
        Ok(())
    }

    /// The worker `pid`, forked by a template, sends its first message:
    /// the shell learns its pid from the kernel and asks the core to
    /// vouch for it, then the message is a report like any.
    fn first_message(&mut self, pid: i32) -> Result<(), String> {
        let now = self.now();
        let Some(p) = self
            .world
            .procs
            .get(&pid)
            .filter(|p| !p.exited && !p.closed)
        else {
            return Ok(());
        };
        let slot = p.slot;
        let behaviour = p.behaviour;
        let Some(entry) = self.core.board.get(slot) else {
            return Ok(());
        };
        if entry.pid == 0 {
            match self.core.verify(slot, Some(pid), true, true) {
                Ok(_) => {}
                Err(why) => {
                    self.core.template_failed_worker(slot, why, now);
                    return Ok(());
                }
            }
        } else if entry.pid != pid {
            // Its slot went to another worker meanwhile: its channel was
            // closed by the shell; nothing reaches the core.
            return Ok(());
        }
        let first = match behaviour {
            Behaviour::LiesAboutPid => ChildMessage::Ready {
                pid: pid as u32 + 1,
            },
            Behaviour::OutOfOrder => ChildMessage::Idle,
            _ => self.kernel_first_message(pid),
        };
        let ready = matches!(
            first,
            ChildMessage::Ready { pid: p } | ChildMessage::ReadyOnBoard { pid: p } if p as i32 == pid
        );
        self.report(slot, first);
        if ready {
            self.world.procs.get_mut(&pid).expect("alive").ready = true;
            self.world.after_ready(pid);
        }
        Ok(())
    }

    /// What a template-related effect does to the world.
    pub(super) fn template_effect_checks(&mut self, generation: u32, request: TemplateRequest) {
        let Some(pid) = self.template_pid(generation) else {
            return;
        };
        match request {
            TemplateRequest::Ping { seq } => {
                let t = self.world.ms(0, 5);
                self.world.at(t, Happening::TemplatePong(pid, seq));
            }
            TemplateRequest::Quit => {
                let t = self.world.ms(0, 20);
                self.world.at(t, Happening::TemplateExit(pid));
            }
            TemplateRequest::Fork { .. } => {}
        }
    }

    /// The bound on unverified workers holds for every template.
    pub(super) fn check_templates(&self) -> Result<(), String> {
        for t in &self.core.templates {
            let n = self.core.unverified_of(t.role.generation);
            if n > UNVERIFIED_PER_TEMPLATE {
                return Err(format!(
                    "{n} unverified workers for the template of generation {}",
                    t.role.generation
                ));
            }
        }
        Ok(())
    }

    /// How a new worker of `generation` behaves: as its code is broken,
    /// if it is; otherwise well, or badly in a random way.
    pub(super) fn pick_worker_behaviour(&mut self, generation: u32) -> Behaviour {
        if let Some(broken) = self.world.broken.get(&generation) {
            return broken.worker;
        }
        if self.world.rng.per_mille(self.scenario.bad_per_mille) {
            let all = Behaviour::ALL;
            all[1 + self.world.rng.below(all.len() as u64 - 1) as usize]
        } else {
            Behaviour::Good
        }
    }
}
