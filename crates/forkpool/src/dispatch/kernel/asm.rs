//! A small eBPF assembler: just the instructions kernel dispatch's program
//! uses, with labels for jumps, so the program reads as a list of named
//! steps and builds without clang or a BPF toolchain.
//!
//! Each instruction is the kernel's 8-byte `struct bpf_insn`: an opcode
//! (class | size or operation | mode or source), the destination register
//! in the low four bits of the next byte and the source register in the
//! high four, a signed 16-bit offset and a signed 32-bit immediate, in
//! little-endian order. A 64-bit load of a map's address takes two slots.

/// A register: `R0` (return value), `R1`–`R5` (arguments, clobbered by a
/// call), `R6`–`R9` (kept across calls), `R10` (the frame pointer,
/// read-only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reg(pub u8);

/// The return value and a helper's result.
pub const R0: Reg = Reg(0);
/// The first argument (the context when the program starts).
pub const R1: Reg = Reg(1);
/// The second argument.
pub const R2: Reg = Reg(2);
/// The third argument.
pub const R3: Reg = Reg(3);
/// The fourth argument.
pub const R4: Reg = Reg(4);
/// The fifth argument.
pub const R5: Reg = Reg(5);
/// Kept across calls.
pub const R6: Reg = Reg(6);
/// Kept across calls.
pub const R7: Reg = Reg(7);
/// Kept across calls.
pub const R8: Reg = Reg(8);
/// Kept across calls.
pub const R9: Reg = Reg(9);
/// The frame pointer: the stack is the 512 bytes below it.
pub const R10: Reg = Reg(10);

// Instruction classes.
const LD: u8 = 0x00;
const LDX: u8 = 0x01;
const ST: u8 = 0x02;
const STX: u8 = 0x03;
const JMP: u8 = 0x05;
const ALU64: u8 = 0x07;
// Sizes.
const W: u8 = 0x00;
const DW: u8 = 0x18;
// Modes.
const IMM: u8 = 0x00;
const MEM: u8 = 0x60;
const ATOMIC: u8 = 0xc0;
// Sources.
const K: u8 = 0x00;
const X: u8 = 0x08;
// ALU operations.
const ADD: u8 = 0x00;
const OR: u8 = 0x40;
const LSH: u8 = 0x60;
const RSH: u8 = 0x70;
const MOD: u8 = 0x90;
const AND: u8 = 0x50;
const MOV: u8 = 0xb0;
// Jump operations.
const JA: u8 = 0x00;
const CALL: u8 = 0x80;
const EXIT: u8 = 0x90;
/// `BPF_CMPXCHG`: compare R0 with memory, store the source if equal,
/// and load the old value into R0 either way.
const CMPXCHG: i32 = 0xf0 | 0x01;
/// `BPF_ADD` as an atomic operation: add the source to memory (no fetch).
const ATOMIC_ADD: i32 = 0x00;
/// `BPF_ADD | BPF_FETCH`: add the source to memory, and load the old
/// value into the source.
const ATOMIC_FETCH_ADD: i32 = ATOMIC_ADD | 0x01;
/// `BPF_PSEUDO_MAP_FD`: the immediate of a 64-bit load is a map's fd.
const PSEUDO_MAP_FD: u8 = 1;
/// `BPF_PSEUDO_MAP_VALUE`: ... a map's fd, and the second half's
/// immediate an offset into its (first) value.
const PSEUDO_MAP_VALUE: u8 = 2;

/// A conditional jump's comparison (unsigned, 64-bit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// Equal.
    Eq = 0x10,
    /// Greater than or equal.
    Ge = 0x30,
    /// Not equal.
    Ne = 0x50,
    /// Less than.
    Lt = 0xa0,
}

/// One instruction slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    /// The opcode.
    pub code: u8,
    /// The destination register.
    pub dst: u8,
    /// The source register (or a pseudo-source tag).
    pub src: u8,
    /// The signed offset.
    pub off: i16,
    /// The signed immediate.
    pub imm: i32,
}

impl Insn {
    /// The kernel's encoding, as one little-endian 64-bit word.
    pub fn encode(self) -> u64 {
        u64::from(self.code)
            | u64::from(self.dst & 0x0f | (self.src & 0x0f) << 4) << 8
            | u64::from(self.off as u16) << 16
            | u64::from(self.imm as u32) << 32
    }
}

/// A jump target, bound to a position with [`Asm::bind`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Label(usize);

/// Why a program could not be assembled (a bug in the program's builder).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsmError {
    /// A jump names a label that was never bound.
    Unbound,
    /// A jump is farther than a 16-bit offset reaches.
    TooFar,
}

/// Builds a program, one instruction a call.
#[derive(Debug, Default)]
pub struct Asm {
    insns: Vec<Insn>,
    labels: Vec<Option<usize>>,
    jumps: Vec<(usize, Label)>,
}

impl Asm {
    /// An empty program.
    pub fn new() -> Asm {
        Asm::default()
    }

    fn push(&mut self, code: u8, dst: Reg, src: Reg, off: i16, imm: i32) {
        self.insns.push(Insn {
            code,
            dst: dst.0,
            src: src.0,
            off,
            imm,
        });
    }

    /// A new label, not yet bound.
    pub fn label(&mut self) -> Label {
        self.labels.push(None);
        Label(self.labels.len() - 1)
    }

    /// Binds `label` to the next instruction.
    pub fn bind(&mut self, label: Label) {
        self.labels[label.0] = Some(self.insns.len());
    }

    /// `dst = src`.
    pub fn mov(&mut self, dst: Reg, src: Reg) {
        self.push(ALU64 | MOV | X, dst, src, 0, 0);
    }

    /// `dst = imm` (sign-extended).
    pub fn mov_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | MOV | K, dst, R0, 0, imm);
    }

    /// `dst += src`.
    pub fn add(&mut self, dst: Reg, src: Reg) {
        self.push(ALU64 | ADD | X, dst, src, 0, 0);
    }

    /// `dst += imm`.
    pub fn add_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | ADD | K, dst, R0, 0, imm);
    }

    /// `dst |= imm`.
    pub fn or_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | OR | K, dst, R0, 0, imm);
    }

    /// `dst <<= imm`.
    pub fn lsh_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | LSH | K, dst, R0, 0, imm);
    }

    /// `dst >>= imm` (logical).
    pub fn rsh_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | RSH | K, dst, R0, 0, imm);
    }

    /// `dst &= imm` (sign-extended).
    pub fn and_imm(&mut self, dst: Reg, imm: i32) {
        self.push(ALU64 | AND | K, dst, R0, 0, imm);
    }

    /// `dst %= src` (unsigned; `dst` is left as it is when `src` is 0).
    pub fn mod_reg(&mut self, dst: Reg, src: Reg) {
        self.push(ALU64 | MOD | X, dst, src, 0, 0);
    }

    /// `dst = *(u64 *)(src + off)`.
    pub fn load_u64(&mut self, dst: Reg, src: Reg, off: i16) {
        self.push(LDX | DW | MEM, dst, src, off, 0);
    }

    /// `*(u64 *)(dst + off) = src`.
    pub fn store_u64(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(STX | DW | MEM, dst, src, off, 0);
    }

    /// `*(u32 *)(dst + off) = src`.
    pub fn store_u32(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(STX | W | MEM, dst, src, off, 0);
    }

    /// `*(u32 *)(dst + off) = imm`.
    pub fn store_u32_imm(&mut self, dst: Reg, off: i16, imm: i32) {
        self.push(ST | W | MEM, dst, R0, off, imm);
    }

    /// Atomically: `old = *(u64 *)(dst + off); if old == R0 { *(u64 *)(dst
    /// + off) = src }; R0 = old`.
    pub fn cmpxchg_u64(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(STX | DW | ATOMIC, dst, src, off, CMPXCHG);
    }

    /// Atomically: `*(u64 *)(dst + off) += src`.
    pub fn atomic_add_u64(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(STX | DW | ATOMIC, dst, src, off, ATOMIC_ADD);
    }

    /// Atomically: `old = *(u64 *)(dst + off); *(u64 *)(dst + off) +=
    /// src; src = old`.
    pub fn atomic_fetch_add_u64(&mut self, dst: Reg, off: i16, src: Reg) {
        self.push(STX | DW | ATOMIC, dst, src, off, ATOMIC_FETCH_ADD);
    }

    /// `dst` = the address of map `fd` (for a helper's map argument).
    pub fn load_map(&mut self, dst: Reg, fd: i32) {
        self.push(LD | DW | IMM, dst, Reg(PSEUDO_MAP_FD), 0, fd);
        self.push(0, R0, R0, 0, 0);
    }

    /// `dst` = the address of byte `offset` of the value of one-element
    /// array map `fd` (direct value access: no lookup call).
    pub fn load_map_value(&mut self, dst: Reg, fd: i32, offset: i32) {
        self.push(LD | DW | IMM, dst, Reg(PSEUDO_MAP_VALUE), 0, fd);
        self.push(0, R0, R0, 0, offset);
    }

    /// `if reg <cond> imm goto target`.
    pub fn jump_if(&mut self, cond: Cond, reg: Reg, imm: i32, target: Label) {
        self.jumps.push((self.insns.len(), target));
        self.push(JMP | cond as u8 | K, reg, R0, 0, imm);
    }

    /// `if dst <cond> src goto target` (two registers).
    pub fn jump_if_reg(&mut self, cond: Cond, dst: Reg, src: Reg, target: Label) {
        self.jumps.push((self.insns.len(), target));
        self.push(JMP | cond as u8 | X, dst, src, 0, 0);
    }

    /// `goto target`.
    pub fn jump(&mut self, target: Label) {
        self.jumps.push((self.insns.len(), target));
        self.push(JMP | JA, R0, R0, 0, 0);
    }

    /// Calls kernel helper number `helper` (arguments in R1–R5, result in
    /// R0; R1–R5 are clobbered).
    pub fn call(&mut self, helper: i32) {
        self.push(JMP | CALL, R0, R0, 0, helper);
    }

    /// Returns R0.
    pub fn exit(&mut self) {
        self.push(JMP | EXIT, R0, R0, 0, 0);
    }

    /// The instructions with every jump resolved.
    pub fn finish(mut self) -> Result<Vec<Insn>, AsmError> {
        for &(at, label) in &self.jumps {
            let target = self.labels[label.0].ok_or(AsmError::Unbound)?;
            let off = target as i64 - at as i64 - 1;
            self.insns[at].off = i16::try_from(off).map_err(|_| AsmError::TooFar)?;
        }
        Ok(self.insns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Encodings worked out by hand from the kernel's instruction-set
    /// document (Documentation/bpf/standardization/instruction-set.rst);
    /// the kernel's verifier loading the whole program is the other check
    /// (`program.rs`).
    #[test]
    fn instructions_encode_as_the_kernel_reads_them() {
        let mut asm = Asm::new();
        asm.mov(R6, R1); // bf 16 00 00 00 00 00 00
        asm.mov_imm(R0, 1); // b7 00 00 00 01 00 00 00
        asm.load_u64(R4, R3, 64); // 79 34 40 00 00 00 00 00
        asm.store_u32(R10, -4, R9); // 63 9a fc ff 00 00 00 00
        asm.store_u32_imm(R10, -4, 7); // 62 0a fc ff 07 00 00 00
        asm.cmpxchg_u64(R3, 64, R5); // db 53 40 00 f1 00 00 00
        asm.call(82); // 85 00 00 00 52 00 00 00
        asm.exit(); // 95 00 00 00 00 00 00 00
        asm.lsh_imm(R2, 3); // 67 02 00 00 03 00 00 00
        asm.add(R3, R2); // 0f 23 00 00 00 00 00 00
        asm.atomic_add_u64(R7, 24, R1); // db 17 18 00 00 00 00 00
        let here = asm.label();
        asm.bind(here);
        asm.jump_if_reg(Cond::Ge, R9, R2, here); // 3d 29 ff ff 00 00 00 00
        asm.jump_if_reg(Cond::Lt, R9, R8, here); // ad 89 fe ff 00 00 00 00
        asm.store_u64(R10, -16, R0); // 7b 0a f0 ff 00 00 00 00
        let words: Vec<[u8; 8]> = asm
            .finish()
            .unwrap()
            .into_iter()
            .map(|i| i.encode().to_le_bytes())
            .collect();
        assert_eq!(
            words,
            [
                [0xbf, 0x16, 0, 0, 0, 0, 0, 0],
                [0xb7, 0x00, 0, 0, 1, 0, 0, 0],
                [0x79, 0x34, 0x40, 0, 0, 0, 0, 0],
                [0x63, 0x9a, 0xfc, 0xff, 0, 0, 0, 0],
                [0x62, 0x0a, 0xfc, 0xff, 7, 0, 0, 0],
                [0xdb, 0x53, 0x40, 0, 0xf1, 0, 0, 0],
                [0x85, 0, 0, 0, 0x52, 0, 0, 0],
                [0x95, 0, 0, 0, 0, 0, 0, 0],
                [0x67, 0x02, 0, 0, 3, 0, 0, 0],
                [0x0f, 0x23, 0, 0, 0, 0, 0, 0],
                [0xdb, 0x17, 0x18, 0, 0, 0, 0, 0],
                [0x3d, 0x29, 0xff, 0xff, 0, 0, 0, 0],
                [0xad, 0x89, 0xfe, 0xff, 0, 0, 0, 0],
                [0x7b, 0x0a, 0xf0, 0xff, 0, 0, 0, 0],
            ]
        );
    }

    #[test]
    fn a_map_load_takes_two_slots_tagged_with_the_pseudo_source() {
        let mut asm = Asm::new();
        asm.load_map(R2, 5);
        asm.load_map_value(R7, 6, 16);
        let insns = asm.finish().unwrap();
        assert_eq!(insns.len(), 4);
        assert_eq!(
            insns[0].encode().to_le_bytes(),
            [0x18, 0x12, 0, 0, 5, 0, 0, 0]
        );
        assert_eq!(insns[1].encode(), 0);
        assert_eq!(
            insns[2].encode().to_le_bytes(),
            [0x18, 0x27, 0, 0, 6, 0, 0, 0]
        );
        assert_eq!(insns[3].encode().to_le_bytes(), [0, 0, 0, 0, 16, 0, 0, 0]);
    }

    #[test]
    fn jumps_count_slots_from_the_next_instruction_both_ways() {
        let mut asm = Asm::new();
        let top = asm.label();
        let end = asm.label();
        asm.bind(top);
        asm.jump_if(Cond::Ge, R9, 4, end); // 0: forward over 1, 2, 3
        asm.load_map(R2, 3); // 1, 2
        asm.jump(top); // 3: back to 0
        asm.bind(end);
        asm.exit(); // 4
        let insns = asm.finish().unwrap();
        assert_eq!(insns[0].off, 3);
        assert_eq!(insns[0].code, 0x35);
        assert_eq!(insns[3].off, -4);
        assert_eq!(insns[3].code, 0x05);
    }

    #[test]
    fn an_unbound_label_is_an_error_not_a_jump_to_zero() {
        let mut asm = Asm::new();
        let nowhere = asm.label();
        asm.jump(nowhere);
        assert_eq!(asm.finish(), Err(AsmError::Unbound));
    }
}
