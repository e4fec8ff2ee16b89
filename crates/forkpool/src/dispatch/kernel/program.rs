//! The program the kernel runs for each new connection: pick the lowest
//! idle slot within the dispatch width and reserve it, or the
//! supervisor's overflow socket.
//!
//! Type `SK_REUSEPORT`, attached to the listener's `SO_REUSEPORT` group.
//! The kernel runs it once per connection, when the SYN arrives and a
//! listener must be chosen; `bpf_sk_select_reuseport` names the chosen
//! socket by its index in the sockarray (slot *i* at index *i*, the
//! overflow socket at index `slots`). Per connection it costs one clock
//! read, one load of the dispatch bound, one load per busy slot below the
//! one it picks, one compare-and-swap and one helper call; one sent to
//! the overflow also adds one to the board's count of them (an atomic
//! add), which lets a finishing child skip looking there when nothing
//! was sent.
//!
//! Word 5 is the dispatch bound (`board::BOUND_WORD`): 0, or the first
//! slot beyond the dispatch width (`policy::width`). A slot at or above a
//! nonzero bound is never picked; with every slot below it busy, the
//! connection goes to the overflow, where the children in the width take
//! it as they finish their own.
//!
//! Registers: R6 the context, R7 the scoreboard's value, R8 the slot
//! bound the scan stops at, R9 the slot being looked at; the stack holds
//! the reservation stamp (8 bytes at R10−16) and the sockarray key (4
//! bytes at R10−4).
//!
//! The verifier walks every iteration of the scan, and keeps a state for
//! each conditional jump whose other side it has yet to walk: the kernel
//! refuses a program that leaves more than 8,192 waiting. So each step
//! leaves as few as it can: the bound is read once, before the scan, and
//! tested so that its far side (the overflow) is walked at once; a
//! successful pick exits where it is. Two states wait per slot (not idle,
//! taken first by another CPU), which is what lets 2,048 slots load.
//!
//! ```text
//!  0     r6 = r1                        keep the context for the helper
//!  1–2   r7 = &board                    the scoreboard's value (direct access)
//!  3     call ktime_get_ns              r0 = now
//!  4     r0 |= 2                        a reservation never reads as busy (0) or idle (1)
//!  5     *(u64 *)(r10 - 16) = r0        the reservation stamp
//!  6     r9 = 0                         slot = 0
//!  7     r8 = *(u64 *)(r7 + 40)         the dispatch bound (word 5)
//!  8     if r8 == 0 goto all            no bound
//!  9     if r8 < SLOTS goto scan        a bound within the slots
//! all:
//! 10     r8 = SLOTS                     every slot may be picked
//! scan:
//! 11     if r9 >= SLOTS goto overflow   (the verifier's bound on the scan)
//! 12     if r9 < r8 goto look
//! 13     goto overflow                  every slot within the bound busy or reserved
//! look:
//! 14     r2 = r9
//! 15     r2 <<= 5                       32 bytes a slot's record
//! 16     r3 = r7
//! 17     r3 += r2                       r3 = &record[slot] - 64
//! 18     r4 = *(u64 *)(r3 + 64)         the slot's state
//! 19     if r4 != 1 goto next           not idle
//! 20     r0 = 1
//! 21     r5 = *(u64 *)(r10 - 16)
//! 22     lock cmpxchg *(u64 *)(r3 + 64), r5   idle -> reserved, if still idle
//! 23     if r0 != 1 goto next           another CPU's connection took it first
//! 24     *(u32 *)(r10 - 4) = r9         key = slot
//! 25     r1 = r6
//! 26–27  r2 = &sockarray
//! 28     r3 = r10
//! 29     r3 += -4
//! 30     r4 = 0
//! 31     call sk_select_reuseport       this slot's socket takes the connection
//! 32     if r0 != 0 goto next           (no socket at the slot: the reservation
//! 33     r0 = SK_PASS                    stays until the supervisor's deadline)
//! 34     exit
//! next:
//! 35     r9 += 1
//! 36     goto scan
//! overflow:
//! 37     r1 = 1
//! 38     lock *(u64 *)(r7 + 24) += r1   count it: sent to the overflow (word 3)
//! 39     *(u32 *)(r10 - 4) = SLOTS      key = the overflow socket
//! 40     r1 = r6
//! 41–42  r2 = &sockarray
//! 43     r3 = r10
//! 44     r3 += -4
//! 45     r4 = 0
//! 46     call sk_select_reuseport       (if it fails, the kernel's hash picks)
//! 47     r0 = SK_PASS
//! 48     exit
//! ```

use super::asm::{Asm, Cond, Insn, R0, R1, R10, R2, R3, R4, R5, R6, R7, R8, R9};
use super::board::{
    BOUND_WORD, HEADER_WORDS, IDLE, OVERFLOW_SENT_WORD, RECORD_WORDS, RESERVED_BIT,
};

// The scan steps from record to record with a shift.
const _: () = assert!(RECORD_WORDS * 8 == 1 << 5);

/// `BPF_FUNC_ktime_get_ns`.
const KTIME_GET_NS: i32 = 5;
/// `BPF_FUNC_sk_select_reuseport`.
const SK_SELECT_REUSEPORT: i32 = 82;
/// `SK_PASS`: let the connection in (on the socket selected, if any).
const SK_PASS: i32 = 1;
/// The most slots the program scans. The verifier walks every iteration
/// of the scan; Linux 6.18 refuses a scan of 4,096 (`EFAULT`) and loads
/// 2,048 (the test `the_program_loads_for_the_largest_pool_it_scans`). A
/// pool allowed more children falls back to `handoff`
/// (docs/operations.md).
pub const MAX_SLOTS: usize = 2048;

/// The program for a scoreboard map `board` and a sockarray `sockets` of
/// `slots + 1` entries (descriptors as the loading process holds them).
/// A slot's record is 32 bytes (`board::RECORD_WORDS`), its state first.
pub fn pick_lowest_idle(board: i32, sockets: i32, slots: usize) -> Vec<Insn> {
    assert!(
        (1..=MAX_SLOTS).contains(&slots),
        "{slots} slots: kernel dispatch takes 1 to {MAX_SLOTS}"
    );
    let slots = slots as i32;
    let word = (8 * HEADER_WORDS) as i16;
    let key = -4;
    let stamp = -16;
    let mut asm = Asm::new();
    let all = asm.label();
    let scan = asm.label();
    let look = asm.label();
    let next = asm.label();
    let overflow = asm.label();

    asm.mov(R6, R1);
    asm.load_map_value(R7, board, 0);
    asm.call(KTIME_GET_NS);
    asm.or_imm(R0, RESERVED_BIT as i32);
    asm.store_u64(R10, stamp, R0);
    asm.mov_imm(R9, 0);
    asm.load_u64(R8, R7, (8 * BOUND_WORD) as i16);
    asm.jump_if(Cond::Eq, R8, 0, all);
    asm.jump_if(Cond::Lt, R8, slots, scan);
    asm.bind(all);
    asm.mov_imm(R8, slots);

    asm.bind(scan);
    asm.jump_if(Cond::Ge, R9, slots, overflow);
    asm.jump_if_reg(Cond::Lt, R9, R8, look);
    asm.jump(overflow);
    asm.bind(look);
    asm.mov(R2, R9);
    asm.lsh_imm(R2, 5);
    asm.mov(R3, R7);
    asm.add(R3, R2);
    asm.load_u64(R4, R3, word);
    asm.jump_if(Cond::Ne, R4, IDLE as i32, next);
    asm.mov_imm(R0, IDLE as i32);
    asm.load_u64(R5, R10, stamp);
    asm.cmpxchg_u64(R3, word, R5);
    asm.jump_if(Cond::Ne, R0, IDLE as i32, next);
    asm.store_u32(R10, key, R9);
    select_socket_at_key(&mut asm, sockets, key);
    asm.jump_if(Cond::Ne, R0, 0, next);
    asm.mov_imm(R0, SK_PASS);
    asm.exit();

    asm.bind(next);
    asm.add_imm(R9, 1);
    asm.jump(scan);

    asm.bind(overflow);
    asm.mov_imm(R1, 1);
    asm.atomic_add_u64(R7, (8 * OVERFLOW_SENT_WORD) as i16, R1);
    asm.store_u32_imm(R10, key, slots);
    select_socket_at_key(&mut asm, sockets, key);
    asm.mov_imm(R0, SK_PASS);
    asm.exit();
    asm.finish()
        .expect("every label is bound and every jump is short")
}

/// `r0 = bpf_sk_select_reuseport(ctx, &sockets, r10 + key, 0)`: the
/// socket whose sockarray index is on the stack at `key` takes the
/// connection (the context is in R6).
fn select_socket_at_key(asm: &mut Asm, sockets: i32, key: i16) {
    asm.mov(R1, R6);
    asm.load_map(R2, sockets);
    asm.mov(R3, R10);
    asm.add_imm(R3, key.into());
    asm.mov_imm(R4, 0);
    asm.call(SK_SELECT_REUSEPORT);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_program_is_the_forty_nine_slots_its_listing_shows() {
        let insns = pick_lowest_idle(3, 4, 16);
        assert_eq!(insns.len(), 49);
        // The stamp on the stack, the bound read once and clamped.
        assert_eq!((insns[5].code, insns[5].off), (0x7b, -16));
        assert_eq!((insns[7].code, insns[7].dst, insns[7].off), (0x79, 8, 40));
        assert_eq!((insns[8].code, insns[8].imm, insns[8].off), (0x15, 0, 1));
        assert_eq!((insns[9].code, insns[9].imm, insns[9].off), (0xa5, 16, 1));
        assert_eq!((insns[10].code, insns[10].imm), (0xb7, 16));
        // The scan's bounds: the slots, then the width; the slot word's
        // offset; the overflow key.
        assert_eq!(
            (insns[11].code, insns[11].imm, insns[11].off),
            (0x35, 16, 25)
        );
        assert_eq!((insns[12].code, insns[12].dst, insns[12].src), (0xad, 9, 8));
        assert_eq!(insns[12].off, 1);
        assert_eq!((insns[13].code, insns[13].off), (0x05, 23));
        assert_eq!(insns[18].off, 64);
        assert_eq!((insns[22].code, insns[22].imm), (0xdb, 0xf1));
        assert_eq!(
            (insns[32].code, insns[32].off),
            (0x55, 2),
            "a failed pick: the next slot"
        );
        assert_eq!(
            (insns[38].code, insns[38].off),
            (0xdb, 24),
            "the overflow count"
        );
        assert_eq!(insns[39].imm, 16);
        assert_eq!(insns[36].off, -26, "back to the scan");
        assert_eq!(insns[48].code, 0x95);
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
