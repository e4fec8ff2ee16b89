//! What the supervisor makes of a child's or a template's stderr, without
//! the pipe: the bytes cut into lines (a long one in pieces), each line
//! within the stderr budget (`policy/budget.rs`) handed on to be logged,
//! with one line saying so when a flood begins, the last few lines kept to
//! quote when a start fails, the lines dropped for the totals, and when a
//! writer has flooded for so long that it must end. The shell reads the
//! pipe and logs (`supervisor/output.rs`).

use std::collections::VecDeque;
use std::time::Instant;

use super::Counted;
use crate::policy::budget::{Admit, OutputGate, STDERR_FLOOD_LIMIT, STDERR_LINES_PER_SECOND};

/// Longer lines are logged in pieces of this size.
pub(crate) const MAX_LINE: usize = 8 * 1024;
/// Lines kept from the end of a stderr, to quote when a reload fails
/// because the worker could not start.
const TAIL_LINES: usize = 5;
/// Characters kept of each of those lines.
const TAIL_LINE_CHARS: usize = 300;

/// One stderr, as lines.
#[derive(Debug, Default)]
pub(crate) struct StderrLines {
    /// The start of a line whose end has not arrived yet.
    partial: Vec<u8>,
    /// The last few lines, shortened.
    tail: VecDeque<String>,
    /// The stderr budget: lines over it are counted, not logged.
    gate: OutputGate,
}

impl StderrLines {
    /// Takes `bytes` read at `now`, handing each complete line within the
    /// budget to `line`.
    pub fn feed(&mut self, bytes: &[u8], now: Instant, line: &mut impl FnMut(&str)) {
        for mut piece in bytes.split_inclusive(|b| *b == b'\n') {
            while !piece.is_empty() {
                let room = MAX_LINE - self.partial.len();
                let (head, rest) = piece.split_at(piece.len().min(room));
                self.partial.extend_from_slice(head);
                piece = rest;
                if self.partial.ends_with(b"\n") || self.partial.len() >= MAX_LINE {
                    self.flush(now, line);
                }
            }
        }
    }

    /// Ends the line begun, if one is (the writer closed the pipe).
    pub fn flush(&mut self, now: Instant, line: &mut impl FnMut(&str)) {
        if self.partial.is_empty() {
            return;
        }
        let text = String::from_utf8_lossy(&self.partial);
        let text = text.trim_end_matches(['\n', '\r']);
        match self.gate.admit(now, text.len()) {
            Admit::Log => line(text),
            Admit::Drop { first: true } => line(&format!(
                "(over {STDERR_LINES_PER_SECOND} lines a second: further output is dropped \
                 until the worker slows down, and the worker is killed if it keeps on \
                 for {STDERR_FLOOD_LIMIT:?})"
            )),
            Admit::Drop { first: false } => {}
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail
            .push_back(text.chars().take(TAIL_LINE_CHARS).collect());
        self.partial.clear();
    }

    /// Moves the last lines read to the end of `into`, keeping at most
    /// `TAIL_LINES` there.
    pub fn save_tail(&mut self, into: &mut Vec<String>) {
        into.extend(self.tail.drain(..));
        let extra = into.len().saturating_sub(TAIL_LINES);
        into.drain(..extra);
    }

    /// The lines the budget dropped since last asked, for the core to
    /// count.
    pub fn dropped(&mut self) -> Counted {
        Counted::StderrLinesDropped(std::mem::take(&mut self.gate.dropped))
    }

    /// Why the writer must end, if it has flooded its stderr for too long
    /// at `now`.
    pub fn flood(&self, now: Instant) -> Option<String> {
        self.gate.flooding_too_long(now).then(|| {
            format!(
                "wrote more than {STDERR_LINES_PER_SECOND} lines a second to stderr \
                 for {STDERR_FLOOD_LIMIT:?}"
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn lines_of(s: &mut StderrLines, bytes: &[u8], now: Instant) -> Vec<String> {
        let mut got = Vec::new();
        s.feed(bytes, now, &mut |l| got.push(l.to_string()));
        got
    }

    #[test]
    fn lines_are_split_joined_and_flushed_at_the_end() {
        let now = Instant::now();
        let mut s = StderrLines::default();
        assert_eq!(
            lines_of(&mut s, b"first\nsecond\r\nthi", now),
            ["first", "second"]
        );
        assert_eq!(lines_of(&mut s, b"rd\nunfinished", now), ["third"]);
        let mut got = Vec::new();
        s.flush(now, &mut |l| got.push(l.to_string()));
        assert_eq!(got, ["unfinished"]);
    }

    #[test]
    fn long_lines_come_in_pieces() {
        let now = Instant::now();
        let mut s = StderrLines::default();
        let got = lines_of(&mut s, &vec![b'x'; MAX_LINE + 10], now);
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].len(), MAX_LINE);
        assert_eq!(lines_of(&mut s, b"\n", now), ["x".repeat(10)]);
    }

    #[test]
    fn the_tail_keeps_the_last_lines_shortened() {
        let now = Instant::now();
        let mut s = StderrLines::default();
        let long = "y".repeat(TAIL_LINE_CHARS + 50);
        lines_of(
            &mut s,
            format!("0\n1\n2\n3\n4\n5\n{long}\n").as_bytes(),
            now,
        );
        let mut tail = vec![String::from("older")];
        s.save_tail(&mut tail);
        assert_eq!(tail.len(), TAIL_LINES);
        assert_eq!(tail[..4], ["2", "3", "4", "5"]);
        assert_eq!(tail[4].len(), TAIL_LINE_CHARS);
    }

    #[test]
    fn a_flood_is_said_once_counted_and_ends_the_writer() {
        let t0 = Instant::now();
        let mut s = StderrLines::default();
        let mut logged = Vec::new();
        // 100,000 lines a second until past the flood limit.
        let lines = (STDERR_FLOOD_LIMIT.as_millis() as u64 + 1000) * 100;
        for i in 0..lines {
            let now = t0 + Duration::from_micros(i * 10);
            s.feed(b"spam\n", now, &mut |l| logged.push(l.to_string()));
        }
        let said = logged.iter().filter(|l| l.starts_with("(over")).count();
        assert_eq!(said, 1);
        let Counted::StderrLinesDropped(dropped) = s.dropped() else {
            panic!("not a count of dropped lines");
        };
        assert_eq!(dropped + logged.len() as u64 - 1, lines);
        assert_eq!(s.dropped(), Counted::StderrLinesDropped(0));
        let end = t0 + Duration::from_micros(lines * 10);
        assert!(s.flood(end).is_some());
        // A pause ends it.
        assert!(s.flood(end + Duration::from_secs(2)).is_none());
    }
}
