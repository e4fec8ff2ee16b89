//! The Python and Perl helpers dump a worker's stack on the stack-dump
//! signal (SIGURG, docs/protocol.md "Stack dumps") and keep running.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients");

/// A worker program stuck in `crunch_the_numbers`, killed on drop.
struct Stuck {
    child: Child,
    stderr: mpsc::Receiver<String>,
}

impl Stuck {
    /// Runs `program` on `script` (written to a temp file) and waits until
    /// it says it is inside the function.
    fn start(program: &str, script: &str) -> Stuck {
        let path = common::temp_path("stuck");
        std::fs::write(&path, script).unwrap();
        let mut child = Command::new(program)
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
        let (tx, stderr) = mpsc::channel();
        let err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut stuck = Stuck { child, stderr };
        let mut line = String::new();
        BufReader::new(stuck.child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(line.trim(), "inside", "{program} did not start");
        stuck
    }

    /// Sends the stack-dump signal and collects stderr until a line names
    /// `function` (10 s at most).
    fn dump_naming(&self, function: &str) -> (bool, String) {
        common::signal_pid(self.child.id() as i32, "URG");
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut text = String::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.stderr.recv_timeout(left) {
                Ok(line) => {
                    text += &line;
                    text.push('\n');
                    if line.contains(function) {
                        return (true, text);
                    }
                }
                Err(_) => break,
            }
        }
        (false, text)
    }

    fn still_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }
}

impl Drop for Stuck {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn dumps_twice_and_lives(program: &str, script: &str) {
    let mut stuck = Stuck::start(program, script);
    for round in 0..2 {
        let (named, text) = stuck.dump_naming("crunch_the_numbers");
        assert!(
            named,
            "round {round}: no stack naming the function:\n{text}"
        );
        assert!(stuck.still_running(), "the worker died of the signal");
    }
}

#[test]
fn python_helper_dumps_every_thread_on_sigurg() {
    let script = format!(
        "import sys, time\n\
         sys.path.insert(0, {CLIENTS:?} + '/python')\n\
         import forkpool_worker\n\
         def crunch_the_numbers():\n\
         \x20   print('inside', flush=True)\n\
         \x20   while True:\n\
         \x20       time.sleep(0.05)\n\
         crunch_the_numbers()\n"
    );
    dumps_twice_and_lives("python3", &script);
}

#[test]
fn perl_helper_prints_a_carp_stack_on_sigurg() {
    let script = format!(
        "use lib {:?};\n\
         use Forkpool::Worker;\n\
         $| = 1;\n\
         sub crunch_the_numbers {{\n\
         \x20   print \"inside\\n\";\n\
         \x20   while (1) {{ select(undef, undef, undef, 0.05) }}\n\
         }}\n\
         crunch_the_numbers();\n",
        format!("{CLIENTS}/perl")
    );
    dumps_twice_and_lives("perl", &script);
}
