//! The program the kernel runs for each new connection: pick the lowest
//! idle slot within the dispatch width and reserve it; failing that, the
//! lowest slot whose reservation is dead; failing that, the next slot of
//! the spread, where the supervisor sets one; failing that, the
//! supervisor's overflow socket.
//!
//! Type `SK_REUSEPORT`, attached to the listener's `SO_REUSEPORT` group.
//! The kernel runs it once per connection, when the SYN arrives and a
//! listener must be chosen; `bpf_sk_select_reuseport` names the chosen
//! socket by its index in the sockarray (slot *i* at index *i*, the
//! overflow socket at index `slots`).
//!
//! **Why a reservation can die.** The program runs at the SYN, before
//! the kernel knows whether the connection will ever reach `accept`. A
//! load balancer's TCP check resets right after its handshake, a scanner
//! never completes one, a client gives up, and with `TCP_DEFER_ACCEPT` a
//! client that never speaks is never queued. Each of those leaves a
//! reservation that no connection fills, and the child behind it would
//! look taken to every later connection. So a reservation holds its slot
//! against others for [`RESERVATION_HOLD`] only: past that, a connection
//! that finds no idle slot takes the dead reservation's slot over (a
//! compare-and-swap from the stamp it read, so two CPUs never both take
//! it), with no supervisor involved. Idle slots come first, so a live
//! reservation that is merely slow (a distant client's handshake, a child
//! waiting for a CPU) is taken over only when every slot is taken anyway,
//! where the other choice, the overflow, would make the connection wait
//! for a finishing child just the same. If a taken-over reservation was
//! alive after all, both connections are queued on the one child's
//! socket and it serves them in turn; none is lost.
//!
//! Per connection, when an idle slot is found it costs one clock read,
//! one load of the dispatch bound, one load per busy slot below the one
//! it picks, one compare-and-swap and one helper call. With no idle slot
//! it reads every slot once more for a dead reservation; one sent to the
//! overflow also adds one to the board's count of them (an atomic add),
//! which lets a finishing child skip looking there when nothing was sent,
//! and a takeover adds one to the count of them (word 6).
//!
//! Word 7 is the spread (`board::SPREAD_WORD`), for a pool whose
//! children take connections only from their own sockets (the messages
//! path, `G`): the supervisor could hand them nothing from the overflow,
//! so with no slot idle or dead the program queues the connection on the
//! next of the first *n* slots' sockets in turn, where it waits behind
//! that child's connection. 0 (the supervisor's choice for any other
//! pool) goes to the overflow as before.
//!
//! Word 5 is the dispatch bound (`board::BOUND_WORD`): 0, or the first
//! slot beyond the dispatch width (`policy::width`). A slot at or above a
//! nonzero bound is never picked; with every slot below it busy, the
//! connection goes to the overflow, where the children in the width take
//! it as they finish their own.
//!
//! Registers: R6 the context, R7 the scoreboard's value, R8 the slot
//! bound a scan stops at, R9 the slot being looked at; the stack holds
//! the reservation stamp (8 bytes at R10−16), the newest stamp a dead
//! reservation can have, less one (8 bytes at R10−24), and the sockarray
//! key (4 bytes at R10−4).
//!
//! The verifier walks every iteration of both scans, and keeps a state
//! for each conditional jump whose other side it has yet to walk: the
//! kernel refuses a program that leaves more than 8,192 waiting. So each
//! scan leaves one waiting per slot (the jump to take it): a slot that
//! cannot be taken falls through to the next, the rest of the scan is
//! walked first, and each waiting take is walked at the end, where its
//! failure joins a `next` already walked and is pruned at once. Each scan
//! reads the bound afresh, so the second starts from the same state
//! whichever slot the first stopped at (the verifier prunes it), which is
//! what lets 2,048 slots load.
//!
//! ```text
//!  0     r6 = r1                        keep the context for the helper
//!  1–2   r7 = &board                    the scoreboard's value (direct access)
//!  3     call ktime_get_ns              r0 = now
//!  4     r1 = r0
//!  5     r1 += -(HOLD + 1)              a reservation stamped before this is dead
//!  6     *(u64 *)(r10 - 24) = r1
//!  7     r0 |= 2                        a reservation never reads as busy (0) or idle (1)
//!  8     *(u64 *)(r10 - 16) = r0        the reservation stamp
//!  9–12  r8 = the bound                 word 5; SLOTS when 0 or beyond the slots
//! 13     r9 = 0                         slot = 0
//! idle_scan:
//! 14     if r9 >= SLOTS goto dead       (the verifier's bound on the scan)
//! 15     if r9 < r8 goto idle_look
//! 16     goto dead                      no slot within the bound is idle
//! idle_look:
//! 17–20  r3 = &record[slot] - 64        32 bytes a slot's record
//! 21     r4 = *(u64 *)(r3 + 64)         the slot's state
//! 22     if r4 == 1 goto take_idle
//! idle_next:
//! 23     r9 += 1
//! 24     goto idle_scan
//! take_idle:
//! 25     r0 = 1
//! 26     r5 = *(u64 *)(r10 - 16)
//! 27     lock cmpxchg *(u64 *)(r3 + 64), r5   idle -> reserved, if still idle
//! 28     if r0 != 1 goto idle_next      another CPU's connection took it first
//! 29     *(u32 *)(r10 - 4) = r9         key = slot
//! 30–36  call sk_select_reuseport       this slot's socket takes the connection
//! 37     if r0 != 0 goto idle_next      (no socket at the slot: the reservation dies)
//! 38     r0 = SK_PASS
//! 39     exit
//! dead:
//! 40–43  r8 = the bound                 read again (see above)
//! 44     r9 = 0
//! dead_scan:
//! 45     if r9 >= SLOTS goto overflow
//! 46     if r9 < r8 goto dead_look
//! 47     goto overflow                  no slot within the bound idle or dead
//! dead_look:
//! 48–51  r3 = &record[slot] - 64
//! 52     r4 = *(u64 *)(r3 + 64)
//! 53     r2 = r4
//! 54     r2 += -2                       busy (0) and idle (1) wrap past every stamp
//! 55     r5 = *(u64 *)(r10 - 24)
//! 56     if r2 < r5 goto take_dead      a reservation at least HOLD old
//! dead_next:
//! 57     r9 += 1
//! 58     goto dead_scan
//! take_dead:
//! 59     r0 = r4
//! 60     r5 = *(u64 *)(r10 - 16)
//! 61     lock cmpxchg *(u64 *)(r3 + 64), r5   dead -> reserved anew, if unchanged
//! 62     if r0 != r4 goto dead_next     moved meanwhile (accepted, or taken over)
//! 63     *(u32 *)(r10 - 4) = r9
//! 64–70  call sk_select_reuseport
//! 71     if r0 != 0 goto dead_next
//! 72     r1 = 1
//! 73     lock *(u64 *)(r7 + 48) += r1   count it: a dead reservation taken over (word 6)
//! 74     r0 = SK_PASS
//! 75     exit
//! spread:
//! 76     r2 = *(u64 *)(r7 + 56)         word 7: the spread
//! 77     r2 &= 0xffff                   n, the slots it spreads over
//! 78     if r2 == 0 goto overflow       (none: children the supervisor hands to)
//! 79     r1 = 1 << 16
//! 80     lock r1 = fetch_add *(u64 *)(r7 + 56)   k, counted above n's bits
//! 81     r1 >>= 16
//! 82     r1 %= r2                       slot = k mod n
//! 83     *(u32 *)(r10 - 4) = r1
//! 84–90  call sk_select_reuseport       that slot's socket takes it, behind its child
//! 91     if r0 != 0 goto overflow       (no socket at the slot)
//! 92     r0 = SK_PASS
//! 93     exit
//! overflow:
//! 94     r1 = 1
//! 95     lock *(u64 *)(r7 + 24) += r1   count it: sent to the overflow (word 3)
//! 96     *(u32 *)(r10 - 4) = SLOTS      key = the overflow socket
//! 97–103 call sk_select_reuseport       (if it fails, the kernel's hash picks)
//! 104    r0 = SK_PASS
//! 105    exit
//! ```

use super::asm::{Asm, Cond, Insn, Label, R0, R1, R10, R2, R3, R4, R5, R6, R7, R8, R9};
use super::board::{
    BOUND_WORD, HEADER_WORDS, IDLE, OVERFLOW_SENT_WORD, RECORD_WORDS, RESERVED_BIT, SPREAD_STEP,
    SPREAD_WORD, TAKEN_OVER_WORD,
};
use crate::policy::reservations::RESERVATION_HOLD;

// The scan steps from record to record with a shift.
const _: () = assert!(RECORD_WORDS * 8 == 1 << 5);

// The hold is a 32-bit immediate in the program.
const _: () = assert!(RESERVATION_HOLD.as_nanos() < i32::MAX as u128);

/// `BPF_FUNC_ktime_get_ns`.
const KTIME_GET_NS: i32 = 5;
/// `BPF_FUNC_sk_select_reuseport`.
const SK_SELECT_REUSEPORT: i32 = 82;
/// `SK_PASS`: let the connection in (on the socket selected, if any).
const SK_PASS: i32 = 1;
/// The most slots the program scans. The verifier walks every iteration
/// of both scans; Linux 6.18 loads 2,048 (the test
/// `the_program_loads_for_the_largest_pool_it_scans`). A pool allowed
/// more children falls back to `handoff` (docs/operations.md).
pub const MAX_SLOTS: usize = 2048;

/// Stack offsets (below R10).
const KEY: i16 = -4;
const STAMP: i16 = -16;
const DEAD_BEFORE: i16 = -24;

/// The program for a scoreboard map `board` and a sockarray `sockets` of
/// `slots + 1` entries (descriptors as the loading process holds them).
/// A slot's record is 32 bytes (`board::RECORD_WORDS`), its state first.
pub fn pick_lowest_idle(board: i32, sockets: i32, slots: usize) -> Vec<Insn> {
    assert!(
        (1..=MAX_SLOTS).contains(&slots),
        "{slots} slots: kernel dispatch takes 1 to {MAX_SLOTS}"
    );
    let slots = slots as i32;
    let hold = RESERVATION_HOLD.as_nanos() as i32;
    let mut asm = Asm::new();
    let dead = asm.label();
    let spread = asm.label();
    let overflow = asm.label();

    asm.mov(R6, R1);
    asm.load_map_value(R7, board, 0);
    asm.call(KTIME_GET_NS);
    asm.mov(R1, R0);
    asm.add_imm(R1, -(hold + 1));
    asm.store_u64(R10, DEAD_BEFORE, R1);
    asm.or_imm(R0, RESERVED_BIT as i32);
    asm.store_u64(R10, STAMP, R0);

    // First: the lowest idle slot.
    let scan = Scan::begin(&mut asm, slots, dead);
    asm.jump_if(Cond::Eq, R4, IDLE as i32, scan.take);
    scan.next_then_take(&mut asm);
    asm.mov_imm(R0, IDLE as i32);
    asm.load_u64(R5, R10, STAMP);
    asm.cmpxchg_u64(R3, slot_word(), R5);
    asm.jump_if(Cond::Ne, R0, IDLE as i32, scan.next);
    select_socket(&mut asm, sockets, Some(R9));
    asm.jump_if(Cond::Ne, R0, 0, scan.next);
    asm.mov_imm(R0, SK_PASS);
    asm.exit();

    // Then: the lowest slot whose reservation is dead.
    asm.bind(dead);
    let scan = Scan::begin(&mut asm, slots, spread);
    asm.mov(R2, R4);
    asm.add_imm(R2, -2);
    asm.load_u64(R5, R10, DEAD_BEFORE);
    asm.jump_if_reg(Cond::Lt, R2, R5, scan.take);
    scan.next_then_take(&mut asm);
    asm.mov(R0, R4);
    asm.load_u64(R5, R10, STAMP);
    asm.cmpxchg_u64(R3, slot_word(), R5);
    asm.jump_if_reg(Cond::Ne, R0, R4, scan.next);
    select_socket(&mut asm, sockets, Some(R9));
    asm.jump_if(Cond::Ne, R0, 0, scan.next);
    asm.mov_imm(R1, 1);
    asm.atomic_add_u64(R7, (8 * TAKEN_OVER_WORD) as i16, R1);
    asm.mov_imm(R0, SK_PASS);
    asm.exit();

    // Then, where the supervisor spreads (children that cannot be handed
    // a connection): the next of the first n slots in turn, on its own
    // socket, to wait behind its child's connection.
    asm.bind(spread);
    asm.load_u64(R2, R7, (8 * SPREAD_WORD) as i16);
    asm.and_imm(R2, 0xffff);
    asm.jump_if(Cond::Eq, R2, 0, overflow);
    asm.mov_imm(R1, SPREAD_STEP as i32);
    asm.atomic_fetch_add_u64(R7, (8 * SPREAD_WORD) as i16, R1);
    asm.rsh_imm(R1, SPREAD_STEP.trailing_zeros() as i32);
    asm.mod_reg(R1, R2);
    select_socket(&mut asm, sockets, Some(R1));
    asm.jump_if(Cond::Ne, R0, 0, overflow);
    asm.mov_imm(R0, SK_PASS);
    asm.exit();

    asm.bind(overflow);
    asm.mov_imm(R1, 1);
    asm.atomic_add_u64(R7, (8 * OVERFLOW_SENT_WORD) as i16, R1);
    asm.store_u32_imm(R10, KEY, slots);
    select_socket(&mut asm, sockets, None);
    asm.mov_imm(R0, SK_PASS);
    asm.exit();
    asm.finish()
        .expect("every label is bound and every jump is short")
}

/// The offset of a slot's state from `&record[slot] - 64` (R3).
fn slot_word() -> i16 {
    (8 * HEADER_WORDS) as i16
}

/// One scan over the slots within the bound: its labels, once the head
/// is emitted. The head leaves the slot's record address in R3 and its
/// state in R4, for the test that jumps to `take`.
struct Scan {
    next: Label,
    take: Label,
    scan: Label,
}

impl Scan {
    /// Reads the bound into R8 (every slot when it is 0 or beyond the
    /// slots), starts at slot 0, and emits the loop's head: past the
    /// bound, on to `done`.
    fn begin(asm: &mut Asm, slots: i32, done: Label) -> Scan {
        let all = asm.label();
        let from_zero = asm.label();
        let look = asm.label();
        let scan = Scan {
            next: asm.label(),
            take: asm.label(),
            scan: asm.label(),
        };
        asm.load_u64(R8, R7, (8 * BOUND_WORD) as i16);
        asm.jump_if(Cond::Eq, R8, 0, all);
        asm.jump_if(Cond::Lt, R8, slots, from_zero);
        asm.bind(all);
        asm.mov_imm(R8, slots);
        asm.bind(from_zero);
        asm.mov_imm(R9, 0);
        asm.bind(scan.scan);
        asm.jump_if(Cond::Ge, R9, slots, done);
        asm.jump_if_reg(Cond::Lt, R9, R8, look);
        asm.jump(done);
        asm.bind(look);
        asm.mov(R2, R9);
        asm.lsh_imm(R2, 5);
        asm.mov(R3, R7);
        asm.add(R3, R2);
        asm.load_u64(R4, R3, slot_word());
        scan
    }

    /// After the test: the step to the next slot, then the take's label.
    fn next_then_take(&self, asm: &mut Asm) {
        asm.bind(self.next);
        asm.add_imm(R9, 1);
        asm.jump(self.scan);
        asm.bind(self.take);
    }
}

/// `r0 = bpf_sk_select_reuseport(ctx, &sockets, r10 + KEY, 0)`: the
/// socket whose sockarray index is on the stack at `KEY` takes the
/// connection (the context is in R6); `slot` is stored there first.
fn select_socket(asm: &mut Asm, sockets: i32, slot: Option<super::asm::Reg>) {
    if let Some(slot) = slot {
        asm.store_u32(R10, KEY, slot);
    }
    asm.mov(R1, R6);
    asm.load_map(R2, sockets);
    asm.mov(R3, R10);
    asm.add_imm(R3, KEY.into());
    asm.mov_imm(R4, 0);
    asm.call(SK_SELECT_REUSEPORT);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_is_the_hundred_and_six_instructions_its_listing_shows() {
        let insns = pick_lowest_idle(3, 4, 16);
        assert_eq!(insns.len(), 106);
        // The dead-before moment and the stamp on the stack.
        assert_eq!((insns[5].code, insns[5].imm), (0x07, -30_000_001));
        assert_eq!((insns[6].code, insns[6].off), (0x7b, -24));
        assert_eq!((insns[8].code, insns[8].off), (0x7b, -16));
        // Each scan reads the bound afresh and clamps it.
        for at in [9, 40] {
            assert_eq!(
                (insns[at].code, insns[at].dst, insns[at].off),
                (0x79, 8, 40)
            );
            assert_eq!((insns[at + 1].code, insns[at + 1].imm), (0x15, 0));
            assert_eq!((insns[at + 2].code, insns[at + 2].imm), (0xa5, 16));
            assert_eq!((insns[at + 3].code, insns[at + 3].imm), (0xb7, 16));
        }
        // The idle scan: past the slots or the bound, on to the dead scan.
        assert_eq!(
            (insns[14].code, insns[14].imm, insns[14].off),
            (0x35, 16, 25)
        );
        assert_eq!((insns[15].code, insns[15].dst, insns[15].src), (0xad, 9, 8));
        assert_eq!((insns[16].code, insns[16].off), (0x05, 23));
        assert_eq!(insns[21].off, 64);
        assert_eq!((insns[22].code, insns[22].imm, insns[22].off), (0x15, 1, 2));
        assert_eq!(insns[24].off, -11, "back to the idle scan");
        assert_eq!((insns[27].code, insns[27].imm), (0xdb, 0xf1));
        assert_eq!((insns[28].code, insns[28].off), (0x55, -6));
        assert_eq!((insns[37].code, insns[37].off), (0x55, -15));
        // The dead scan: a stamp at least the hold old, taken from the
        // value read; a takeover counted in word 6.
        assert_eq!((insns[47].code, insns[47].off), (0x05, 28));
        assert_eq!((insns[54].code, insns[54].imm), (0x07, -2));
        assert_eq!((insns[55].code, insns[55].off), (0x79, -24));
        assert_eq!((insns[56].code, insns[56].dst, insns[56].src), (0xad, 2, 5));
        assert_eq!((insns[59].code, insns[59].dst, insns[59].src), (0xbf, 0, 4));
        assert_eq!((insns[61].code, insns[61].imm), (0xdb, 0xf1));
        assert_eq!((insns[62].code, insns[62].dst, insns[62].src), (0x5d, 0, 4));
        assert_eq!(
            (insns[73].code, insns[73].off),
            (0xdb, 48),
            "the takeover count"
        );
        // The spread: n from word 7's low bits (none: the overflow), k
        // fetched and stepped above them, slot k mod n.
        assert_eq!((insns[76].code, insns[76].off), (0x79, 56));
        assert_eq!((insns[77].code, insns[77].imm), (0x57, 0xffff));
        assert_eq!(
            (insns[78].code, insns[78].imm, insns[78].off),
            (0x15, 0, 15)
        );
        assert_eq!((insns[79].code, insns[79].imm), (0xb7, 1 << 16));
        assert_eq!(
            (insns[80].code, insns[80].off, insns[80].imm),
            (0xdb, 56, 0x01),
            "fetch and add"
        );
        assert_eq!((insns[81].code, insns[81].imm), (0x77, 16));
        assert_eq!((insns[82].code, insns[82].dst, insns[82].src), (0x9f, 1, 2));
        assert_eq!((insns[83].code, insns[83].src), (0x63, 1));
        assert_eq!((insns[91].code, insns[91].off), (0x55, 2));
        // The overflow.
        assert_eq!(
            (insns[95].code, insns[95].off),
            (0xdb, 24),
            "the overflow count"
        );
        assert_eq!(insns[96].imm, 16);
        assert_eq!(insns[105].code, 0x95);
    }

    #[test]
    fn every_jump_lands_inside_the_program() {
        for slots in [1, 2, 64, MAX_SLOTS] {
            let insns = pick_lowest_idle(3, 4, slots);
            for (at, insn) in insns.iter().enumerate() {
                let class = insn.code & 0x07;
                let op = insn.code & 0xf0;
                if class == 0x05 && op != 0x80 && op != 0x90 {
                    let target = at as i64 + 1 + i64::from(insn.off);
                    assert!((0..insns.len() as i64).contains(&target), "slot {at}");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "kernel dispatch takes 1 to")]
    fn a_pool_larger_than_the_scan_is_refused() {
        pick_lowest_idle(3, 4, MAX_SLOTS + 1);
    }
}
