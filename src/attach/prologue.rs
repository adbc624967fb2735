//! x86-64 prologue analysis: where on an allocator entry its probe goes.
//!
//! Probe placement matters for cost: the kernel emulates some first
//! instructions (push, nop, relative jumps and calls) at ~0.4 µs a hit,
//! and single-steps the others (test, cmp, mov, sub, ret) at ~14 µs. No
//! allocator entry point of libc, libstdc++, jemalloc, mimalloc or
//! tcmalloc is left single-stepping (issue 22; `tests/attach.rs` checks
//! the installed ones): glibc's `free` opens with `test %rdi,%rdi; je
//! <ret>`, which only skips free(NULL), so its probe goes right after the
//! jump; and a probe moves past leading instructions that every call runs
//! and that cannot change what the programs read, onto the first
//! instruction the kernel emulates (a branch is probed, never passed):
//! moves, tests, compares and register arithmetic, reading memory only
//! %rip-relative, thread-local or through registers they computed (never
//! through an argument as the call got it, which could fault), writing
//! none. libstdc++'s `operator new` opens with `test %rdi,%rdi; mov
//! $1,%eax; push %rbx`, glibc's `valloc` with `cmpb $0,hook(%rip); push
//! %rbx`, its `memalign` with `cmpb $0,hook(%rip); je`, jemalloc's `free`
//! looks its thread cache up in nine instructions before a `jne`. A prefix
//! may move an argument to another register (mimalloc's `malloc` copies
//! its size from rdi to rsi, then loads its heap into rdi; its `calloc`
//! keeps the count in rax; mimalloc 3's `mi_free`, the Rust crate's,
//! keeps the pointer in rsi and loads its page into rdi, issue 41), or
//! multiply count by size (glibc's
//! `reallocarray`: `mov %rsi,%rax; mul %rdx; mov %rax,%rsi; jo`, the probe
//! on the `jo`, where OF says whether it overflowed): the site's [`Abi`]
//! then names where the argument is at the probe. An entry-only probe
//! (operator new, the syscall wrappers) may also be moved past `sub
//! $n,%rsp` (libstdc++'s nothrow `operator new`: `sub $8,%rsp; call`), the
//! return address then n bytes above the stack pointer; a probe with a
//! return probe never is (the kernel replaces the return address at the
//! stack pointer). Sites that still single-step are reported. iced-x86
//! decodes the instructions (length, operands, registers and memory
//! written); which ones are harmless is decided here, and which ones the
//! kernel emulates by its rules (`emulated.rs`).

use iced_x86::{
    Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind,
    Register,
};

use super::emulated::is_emulated;
use super::{Abi, Role};

pub(super) const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Bytes of code examined for a harmless prefix.
pub(super) const HARMLESS_WINDOW: usize = 128;
/// Instructions a harmless prefix may have (jemalloc's `free` looks its
/// thread cache up in nine before its first branch, mimalloc's `mi_free`
/// its page in ten; room for a compiler that schedules a few more).
const HARMLESS_MAX: usize = 16;
/// The stack pointer, in ModRM numbering.
const RSP: u8 = 4;
/// The registers the programs read arguments 0-4 from (rdi, rsi, rdx, rcx,
/// rax: the cookie's argument indices), in ModRM numbering.
const ARG_REGS: [u8; 5] = [7, 6, 2, 1, 0];
/// The registers that carry arguments at a function's entry (rdi, rsi,
/// rdx, rcx, r8, r9), in ModRM numbering.
const ENTRY_ARGS: [u8; 6] = [7, 6, 2, 1, 8, 9];
/// The most stack an entry-only probe may be moved past (`sub $n,%rsp`):
/// the cookie has 4 bits of 8-byte units.
const MAX_SP_ADJUST: i64 = 15 * 8;

/// What a register holds after a prefix, in terms of the registers at the
/// function's entry (ModRM numbering).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Held {
    /// The entry value of this register.
    Reg(u8),
    /// The low 64 bits of the product of two entry values (`mul`), with
    /// the overflow flag set if it overflowed, as long as no later
    /// instruction of the prefix writes the flags.
    Product(u8, u8),
}

/// Instructions at a function's start that a probe may be moved past: up
/// to [`HARMLESS_MAX`] of them, each one that every call executes (no
/// branch) and that writes no memory and the stack pointer at most by a
/// `sub $n,%rsp` (which only an entry-only probe may be moved past),
/// followed by an instruction the kernel emulates. The probe then sees the
/// entry's return address (on top of the stack, or `sp_adjust` above it)
/// and, in `holds`, where the entry's registers went.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct Prefix {
    pub(super) len: usize,
    /// For each register (ModRM numbering, rax to r15), what it holds
    /// after the prefix in terms of the entry's registers; None once
    /// overwritten otherwise.
    holds: [Option<Held>; 16],
    /// Bytes the prefix took off the stack pointer.
    sp_adjust: u8,
    /// Whether the flags still hold what the last `mul` set (no later
    /// instruction wrote them).
    mul_flags: bool,
}

impl Prefix {
    /// `abi` with each argument taken from where the prefix left it; None
    /// if the probe's program needs an argument the prefix overwrote, or
    /// the prefix moved the stack and the probe is not entry-only. free's
    /// program reads its pointer from rdi; operator new's and the syscall
    /// wrappers' read no argument.
    pub(super) fn relocate(&self, role: Role, abi: Abi) -> Option<Abi> {
        let held = |reg: u8, value: Held| self.holds[usize::from(reg)] == Some(value);
        // Where the entry's argument i is now, as an argument index.
        let find = |i: u8| -> Option<u8> {
            let arg = *ARG_REGS.get(usize::from(i))?;
            std::iter::once(i)
                .chain(0..ARG_REGS.len() as u8)
                .find(|&j| held(ARG_REGS[usize::from(j)], Held::Reg(arg)))
        };
        // Some(None) for an argument the ABI does not have.
        let find_opt = |i: Option<u8>| match i {
            None => Some(None),
            Some(i) => find(i).map(Some),
        };
        match role {
            Role::New | Role::Syscall | Role::Marker => Some(Abi {
                sp_adjust: self.sp_adjust,
                ..abi
            }),
            Role::Return(_) => None,
            // The pointer where the prefix left it (mimalloc's mi_free
            // copies it to rsi and loads its page into rdi, issue 41);
            // free's program finds its return address `sp_adjust` up
            // (jemalloc's sized delete opens with `sub $8,%rsp`).
            Role::Free => match find(0)? {
                0 => Some(Abi {
                    sp_adjust: self.sp_adjust,
                    ..abi
                }),
                at => Some(Abi {
                    ptr: Some(at),
                    sp_adjust: self.sp_adjust,
                    ..abi
                }),
            },
            _ if self.sp_adjust != 0 => None,
            Role::Alloc => {
                let ptr = find_opt(abi.ptr)?;
                if let (Some(size), Some(count)) = (find(abi.size), find_opt(abi.count)) {
                    return Some(Abi {
                        size,
                        count,
                        ptr,
                        ..abi
                    });
                }
                // The prefix multiplied count by size (glibc's reallocarray,
                // mimalloc's mi_new_reallocn): the product is the size.
                let (n, m) = (
                    *ARG_REGS.get(usize::from(abi.count?))?,
                    *ARG_REGS.get(usize::from(abi.size))?,
                );
                let size = (0..ARG_REGS.len() as u8).find(|&j| {
                    let at = ARG_REGS[usize::from(j)];
                    held(at, Held::Product(n, m)) || held(at, Held::Product(m, n))
                })?;
                self.mul_flags.then_some(Abi {
                    size,
                    count: None,
                    ptr,
                    size_overflow_of: true,
                    ..abi
                })
            }
        }
    }
}

/// Finds the harmless prefix at the start of `code`, if there is one.
/// iced-x86 decodes; this decides which instructions are harmless: moves,
/// tests and compares, and register arithmetic (`harmless_writes`), with
/// register, immediate, or `%rip`-relative and thread-local (`%fs`/`%gs`)
/// memory operands; anything else ends the search.
pub(super) fn harmless_prefix(code: &[u8]) -> Option<Prefix> {
    let mut p = Prefix {
        len: 0,
        holds: std::array::from_fn(|r| Some(Held::Reg(r as u8))),
        sp_adjust: 0,
        mul_flags: false,
    };
    let mut decoder = Decoder::new(64, code, DecoderOptions::NONE);
    let mut info = InstructionInfoFactory::new();
    let mut sp_adjust: i64 = 0;
    for _ in 0..HARMLESS_MAX {
        if code.get(p.len..).is_some_and(is_emulated) {
            break;
        }
        let insn = decoder.decode();
        if insn.is_invalid() {
            return None; // includes code cut short
        }
        if let Some(n) = stack_sub(&insn) {
            sp_adjust += n;
            if sp_adjust > MAX_SP_ADJUST {
                return None;
            }
            p.mul_flags = false;
            p.len += insn.len();
            continue;
        }
        let product = mul_product(&insn, &p.holds);
        let writes = harmless_writes(&insn, &mut info, &p.holds)?;
        for (dst, src) in writes {
            if dst == RSP {
                return None;
            }
            p.holds[usize::from(dst)] = src.and_then(|src| p.holds[usize::from(src)]);
        }
        if let Some(product) = product {
            p.holds[0] = Some(product);
        }
        p.mul_flags = product.is_some() || (p.mul_flags && insn.rflags_modified() == 0);
        p.len += insn.len();
    }
    p.sp_adjust = u8::try_from(sp_adjust).ok()?;
    (p.len > 0 && code.get(p.len..).is_some_and(is_emulated)).then_some(p)
}

/// n for `sub $n,%rsp` with n a positive multiple of 8.
fn stack_sub(insn: &Instruction) -> Option<i64> {
    let imm = matches!(
        insn.op1_kind(),
        OpKind::Immediate8to64 | OpKind::Immediate32to64
    );
    (insn.mnemonic() == Mnemonic::Sub
        && insn.op_count() == 2
        && insn.op0_kind() == OpKind::Register
        && insn.op0_register() == Register::RSP
        && imm)
        .then(|| insn.immediate(1) as i64)
        .filter(|&n| n > 0 && n % 8 == 0)
}

/// What rax holds after `insn` when it is a 64-bit `mul` of two entry
/// values (rax's and another register's).
fn mul_product(insn: &Instruction, holds: &[Option<Held>; 16]) -> Option<Held> {
    if insn.mnemonic() != Mnemonic::Mul
        || insn.op_count() != 1
        || insn.op0_kind() != OpKind::Register
        || !insn.op0_register().is_gpr64()
    {
        return None;
    }
    let src = gpr_number(insn.op0_register())?;
    match (holds[0]?, holds[usize::from(src)]?) {
        (Held::Reg(a), Held::Reg(b)) => Some(Held::Product(a, b)),
        _ => None,
    }
}

/// The general-purpose register a decoded register is part of, in ModRM
/// numbering (0-15, rax to r15); None for any other register.
fn gpr_number(reg: Register) -> Option<u8> {
    let full = reg.full_register();
    full.is_gpr64()
        .then(|| u8::try_from(full.number()).ok())
        .flatten()
}

/// The registers a harmless instruction writes, each with the register
/// (ModRM numbering) whose whole value it copies when it is a 64-bit
/// register-to-register move; None if the instruction is not harmless.
/// `holds` says what the registers hold (see [`Prefix`]).
fn harmless_writes(
    insn: &Instruction,
    info: &mut InstructionInfoFactory,
    holds: &[Option<Held>; 16],
) -> Option<Vec<(u8, Option<u8>)>> {
    use Mnemonic as M;
    let arithmetic = matches!(
        insn.mnemonic(),
        M::Lea
            | M::Add
            | M::Sub
            | M::And
            | M::Or
            | M::Shr
            | M::Shl
            | M::Sar
            | M::Mul
            | M::Imul
            | M::Movzx
            | M::Movsxd
            | M::Movsx
            | M::Not
            | M::Neg
            | M::Inc
            | M::Dec
    );
    if !(arithmetic || matches!(insn.mnemonic(), M::Test | M::Cmp | M::Mov | M::Xor))
        || insn.has_lock_prefix()
    {
        return None;
    }
    // Memory is only read, and never through an argument as the call got
    // it (the probe must not skip a load that faults on a bad pointer
    // argument): %rip-relative, thread-local, or through registers the
    // prefix computed (an allocator's thread cache); lea reads none.
    let has_memory = (0..insn.op_count()).any(|i| insn.op_kind(i) == OpKind::Memory);
    let through_arg = [insn.memory_base(), insn.memory_index()]
        .into_iter()
        .filter_map(gpr_number)
        .any(|r| matches!(holds[usize::from(r)], Some(Held::Reg(a)) if ENTRY_ARGS.contains(&a)));
    if has_memory && insn.mnemonic() != M::Lea && !insn.is_ip_rel_memory_operand() && through_arg {
        return None;
    }
    let info = info.info(insn);
    if info
        .used_memory()
        .iter()
        .any(|m| m.access() != OpAccess::Read && m.access() != OpAccess::NoMemAccess)
    {
        return None;
    }
    let copy = (insn.mnemonic() == Mnemonic::Mov
        && insn.op_count() == 2
        && insn.op0_kind() == OpKind::Register
        && insn.op1_kind() == OpKind::Register
        && insn.op0_register().is_gpr64()
        && insn.op1_register().is_gpr64())
    .then(|| gpr_number(insn.op1_register()))
    .flatten();
    let mut writes = Vec::new();
    for used in info.used_registers() {
        match used.access() {
            OpAccess::Read | OpAccess::CondRead | OpAccess::NoMemAccess | OpAccess::None => {}
            _ => {
                // A segment, control... register is not harmless.
                writes.push((gpr_number(used.register())?, copy));
            }
        }
    }
    Some(writes)
}

#[cfg(test)]
mod tests {
    use super::harmless_prefix;
    use crate::attach::api::{COUNT_SIZE, REALLOC_N, SIZE0, SIZE1};
    use crate::attach::{Abi, Role};

    /// The length of the harmless prefix of `code`, 0 for none.
    fn len(code: &[u8]) -> usize {
        harmless_prefix(code).map_or(0, |p| p.len)
    }

    /// Check the prefixes of real allocator entries (Debian 12's libc,
    /// libstdc++, jemalloc, tcmalloc and mimalloc, after endbr64) and the
    /// ones a probe must not skip.
    #[test]
    fn attach_harmless_prefixes() {
        // operator new: test %rdi,%rdi; mov $1,%eax; push %rbx.
        let new = [
            0x48, 0x85, 0xff, 0xb8, 1, 0, 0, 0, 0x53, 0x48, 0x0f, 0x45, 0xc7,
        ];
        assert_eq!(len(&new), 8);
        // valloc: cmpb $0,disp(%rip); push %rbx.
        let valloc = [
            0x80, 0x3d, 0x31, 0x0e, 0x14, 0x00, 0x00, 0x53, 0x48, 0x89, 0xfb,
        ];
        assert_eq!(len(&valloc), 7);
        // Already emulated: push %r12.
        assert_eq!(len(&[0x41, 0x54, 0x49, 0x89, 0xd4]), 0);
        // memalign: cmpb; je. The probe goes on the je, which every call
        // reaches and the kernel emulates, never past it.
        let memalign = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0x00, 0x00, 0x74, 0x07, 0xe9];
        assert_eq!(len(&memalign), 7);
        // A branch that is not emulated ends the search: cmpb; jmp *%rax.
        let indirect = [0x80, 0x3d, 0x71, 0x0e, 0x14, 0x00, 0x00, 0xff, 0xe0];
        assert_eq!(len(&indirect), 0);
        // reallocarray: mov %rsi,%rax; mul %rdx; mov %rax,%rsi; jo.
        let reallocarray = [
            0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48, 0x89, 0xc6, 0x70, 0x05,
        ];
        assert_eq!(len(&reallocarray), 9);
        // operator new(nothrow): sub $8,%rsp; call. The probe goes on the
        // call, 8 bytes below the return address.
        let nothrow =
            harmless_prefix(&[0x48, 0x83, 0xec, 0x08, 0xe8, 0, 0, 0, 0]).expect("a prefix");
        assert_eq!((nothrow.len, nothrow.sp_adjust), (4, 8));
        // mov %rax,%rsp writes the stack pointer; add $8,%rsp and sub $4
        // are not taken either.
        assert_eq!(len(&[0x48, 0x89, 0xc4, 0x53]), 0);
        assert_eq!(len(&[0x48, 0x83, 0xc4, 0x08, 0x53]), 0);
        assert_eq!(len(&[0x48, 0x83, 0xec, 0x04, 0x53]), 0);
        // Past 120 bytes of stack: sub $0x80,%rsp.
        assert_eq!(len(&[0x48, 0x81, 0xec, 0x80, 0, 0, 0, 0x53]), 0);
        // jemalloc's malloc: cmp $0x1000,%rdi; ja.
        let je_malloc = [
            0x48, 0x81, 0xff, 0x00, 0x10, 0x00, 0x00, 0x0f, 0x87, 0x93, 0, 0, 0,
        ];
        assert_eq!(len(&je_malloc), 7);
        // tcmalloc's malloc: mov disp(%rip),%rax; test %rax,%rax; jne.
        let tc_malloc = [
            0x48, 0x8b, 0x05, 0x59, 0xab, 0, 0, 0x48, 0x85, 0xc0, 0x75, 0x75,
        ];
        assert_eq!(len(&tc_malloc), 10);
        // A prefix that never reaches an emulated instruction is not taken.
        assert_eq!(len(&[0x48, 0x85, 0xff, 0x48, 0x89, 0xf8]), 0);
        // mov (%rdi),%rax is not decoded (memory other than %rip, %fs).
        assert_eq!(len(&[0x48, 0x8b, 0x07, 0x53]), 0);
        // Cut code.
        assert_eq!(len(&[0x80, 0x3d, 0x00]), 0);
        // 32-bit and r8-r15 forms: mov %ecx,%r10d; test $0x40,%sil; jne.
        assert_eq!(
            len(&[0x41, 0x89, 0xca, 0x40, 0xf6, 0xc6, 0x40, 0x75, 0x07]),
            7
        );
        // jemalloc's sdallocx: mov %rdi,%r8; cmp $0x1000,%rsi; ja.
        let sdallocx = [
            0x49, 0x89, 0xf8, 0x48, 0x81, 0xfe, 0, 0x10, 0, 0, 0x77, 0x0c,
        ];
        assert_eq!(len(&sdallocx), 10);
        // mov %rdi,(%rip) writes memory.
        assert_eq!(len(&[0x48, 0x89, 0x3d, 0x10, 0, 0, 0, 0x53]), 0);
        // cmp $0,(%rdi) reads through an argument.
        assert_eq!(len(&[0x48, 0x83, 0x3f, 0x00, 0x74, 0x05]), 0);
        // lock cmpxchg is not a harmless form (and writes memory).
        assert_eq!(len(&[0xf0, 0x0f, 0xb1, 0x0d, 0, 0, 0, 0, 0x53]), 0);
        // add %rsi,%rax changes a register arithmetically: harmless.
        assert_eq!(len(&[0x48, 0x01, 0xf0, 0x53]), 3);
        // tcmalloc's posix_memalign: lea -1(%rsi),%rax; or $7,%rax;
        // test %rsi,%rax; jne (lea reads no memory).
        let tc_memalign = [
            0x48, 0x8d, 0x46, 0xff, 0x48, 0x83, 0xc8, 0x07, 0x48, 0x85, 0xf0, 0x75, 0x2b,
        ];
        assert_eq!(len(&tc_memalign), 11);
        // A load through a computed register is read-only: mov %rdi,%rax;
        // shr $26,%rax; cmp 0x1b0(%rax),%rcx; jne. Through the argument
        // itself it is not taken: cmp 0x1b0(%rdi),%rcx; jne.
        let computed = [
            0x48, 0x89, 0xf8, 0x48, 0xc1, 0xe8, 0x1a, 0x48, 0x3b, 0x88, 0xb0, 1, 0, 0, 0x75, 0x10,
        ];
        assert_eq!(len(&computed), 14);
        assert_eq!(len(&[0x48, 0x3b, 0x8f, 0xb0, 1, 0, 0, 0x75, 0x10]), 0);
        // Through a copy of the argument neither: mov %rdi,%rax;
        // cmp (%rax),%rcx; jne.
        assert_eq!(len(&[0x48, 0x89, 0xf8, 0x48, 0x3b, 0x08, 0x75, 0x10]), 0);
        // A store is never taken: add %rax,0x10(%rip).
        assert_eq!(len(&[0x48, 0x01, 0x05, 0x10, 0, 0, 0, 0x53]), 0);
        // mov %fs:0x10,%rax (absolute thread-local) reads memory only.
        let tls = [0x64, 0x48, 0x8b, 0x04, 0x25, 0x10, 0, 0, 0, 0x53];
        assert_eq!(len(&tls), 9);
    }

    /// Check that arguments are read where a prefix moved them, and that a
    /// prefix overwriting one the probe needs is not taken.
    #[test]
    fn attach_prefix_relocates_arguments() {
        // mimalloc's malloc: mov disp(%rip),%rax; mov %rdi,%rsi;
        // mov %fs:(%rax),%rdi; cmp $0x400,%rsi; ja. The size is in rsi.
        let mi_malloc = [
            0x48, 0x8b, 0x05, 0x49, 0xb4, 0, 0, 0x48, 0x89, 0xfe, 0x64, 0x48, 0x8b, 0x38, 0x48,
            0x81, 0xfe, 0x00, 0x04, 0x00, 0x00, 0x77, 0x29,
        ];
        let p = harmless_prefix(&mi_malloc).expect("a prefix");
        assert_eq!(p.len, 21);
        assert_eq!(p.relocate(Role::Alloc, SIZE0), Some(SIZE1));
        // The same prefix serves a free whose pointer is then in rsi.
        assert_eq!(
            p.relocate(Role::Free, SIZE0),
            Some(Abi {
                ptr: Some(1),
                ..SIZE0
            })
        );
        assert_eq!(p.relocate(Role::New, SIZE0), Some(SIZE0));
        // mimalloc 3's mi_free (the mimalloc crate, memtrail's own
        // allocator; issue 41): mov _mi_page_map(%rip),%rax; mov %rdi,%rdx;
        // mov %rdi,%rsi; shr $29,%rdx; mov (%rax,%rdx,8),%rdx;
        // mov %rdi,%rax; shr $16,%rax; and $0x1fff,%eax;
        // mov (%rdx,%rax,8),%rdi; test %rdi,%rdi; je. Ten instructions,
        // the page in rdi, the pointer in rsi.
        let mi3_free = [
            0x48, 0x8b, 0x05, 0x29, 0xb8, 0x73, 0x00, 0x48, 0x89, 0xfa, 0x48, 0x89, 0xfe, 0x48,
            0xc1, 0xea, 0x1d, 0x48, 0x8b, 0x14, 0xd0, 0x48, 0x89, 0xf8, 0x48, 0xc1, 0xe8, 0x10,
            0x25, 0xff, 0x1f, 0x00, 0x00, 0x48, 0x8b, 0x3c, 0xc2, 0x48, 0x85, 0xff, 0x74, 0x23,
        ];
        let p = harmless_prefix(&mi3_free).expect("a prefix");
        assert_eq!(p.len, 40);
        assert_eq!(
            p.relocate(Role::Free, SIZE0),
            Some(Abi {
                ptr: Some(1),
                ..SIZE0
            })
        );
        // mimalloc's free: mov %rdi,%rcx; test %rdi,%rdi; je.
        let mi_free = [0x48, 0x89, 0xf9, 0x48, 0x85, 0xff, 0x74, 0x5d];
        let p = harmless_prefix(&mi_free).expect("a prefix");
        assert_eq!(p.len, 6);
        assert_eq!(p.relocate(Role::Free, SIZE0), Some(SIZE0));
        // mimalloc's calloc: mov disp(%rip),%rdx; mov %rdi,%rax;
        // mov %fs:(%rdx),%rdi; cmp $1,%rax; je. The count went to rax,
        // which the programs do not read.
        let mi_calloc = [
            0x48, 0x8b, 0x15, 0xc9, 0xad, 0, 0, 0x48, 0x89, 0xf8, 0x64, 0x48, 0x8b, 0x3a, 0x48,
            0x83, 0xf8, 0x01, 0x74, 0x08,
        ];
        let p = harmless_prefix(&mi_calloc).expect("a prefix");
        assert_eq!(
            p.relocate(Role::Alloc, COUNT_SIZE),
            Some(Abi {
                count: Some(4),
                ..COUNT_SIZE
            })
        );
        // glibc's reallocarray: the product of count and size is the size,
        // and OF at the `jo` says whether it overflowed.
        let reallocarray = [
            0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48, 0x89, 0xc6, 0x70, 0x05,
        ];
        let p = harmless_prefix(&reallocarray).expect("a prefix");
        assert_eq!(
            p.relocate(Role::Alloc, REALLOC_N),
            Some(Abi {
                size: 1,
                count: None,
                size_overflow_of: true,
                ..REALLOC_N
            })
        );
        // A flags write after the multiply loses the overflow: mov %rsi,%rax;
        // mul %rdx; test %rax,%rax; jo.
        let p = harmless_prefix(&[
            0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48, 0x85, 0xc0, 0x70, 5,
        ])
        .expect("a prefix");
        assert_eq!(p.relocate(Role::Alloc, REALLOC_N), None);
    }

    /// Check what a prefix that moves the stack serves, and the moves that
    /// carry no argument.
    #[test]
    fn attach_prefix_stack_and_lost_arguments() {
        // A moved stack serves an entry-only probe and a free (whose
        // program finds the return address that far up: jemalloc's sized
        // delete), never one with a return probe (the kernel would replace
        // the wrong slot).
        let p = harmless_prefix(&[0x48, 0x83, 0xec, 0x08, 0xe8, 0, 0, 0, 0]).expect("a prefix");
        assert_eq!(p.relocate(Role::Alloc, SIZE0), None);
        assert_eq!(
            p.relocate(Role::Free, SIZE0),
            Some(Abi {
                sp_adjust: 8,
                ..SIZE0
            })
        );
        assert_eq!(
            p.relocate(Role::New, SIZE0),
            Some(Abi {
                sp_adjust: 8,
                ..SIZE0
            })
        );
        // A 32-bit move does not carry a 64-bit argument: mov %edi,%esi.
        let p = harmless_prefix(&[0x89, 0xfe, 0x53]).expect("a prefix");
        assert_eq!(p.relocate(Role::Alloc, SIZE1), None);
        // A copy from r8 is not an argument the programs know: mov %r8,%rdi.
        let p = harmless_prefix(&[0x4c, 0x89, 0xc7, 0x53]).expect("a prefix");
        assert_eq!(p.relocate(Role::Free, SIZE0), None);
        // mov %rsi,%rdi; mov %rdi,%rsi swaps nothing back: rdi's value is
        // lost, rsi's is in both.
        let p = harmless_prefix(&[0x48, 0x89, 0xf7, 0x48, 0x89, 0xfe, 0x53]).expect("a prefix");
        assert_eq!(p.relocate(Role::Alloc, SIZE0), None);
        assert_eq!(p.relocate(Role::Alloc, SIZE1), Some(SIZE1));
        // Unmoved arguments stay where they were.
        let p = harmless_prefix(&[0x48, 0x85, 0xff, 0x53]).expect("a prefix");
        assert_eq!(p.relocate(Role::Alloc, REALLOC_N), Some(REALLOC_N));
    }
}
