//! Free sites past `free(NULL)` (issue 41): where a free without a NULL
//! test at its entry is probed so that `free(NULL)` passes no probe.
//!
//! glibc's `free` opens with `test %rdi,%rdi; je <ret>`, and its probe sits
//! past that jump. jemalloc's does not: its fast path looks the block up
//! in the thread's cache first and leaves for a slow path (a function of
//! its own, reached by jumps) on any miss, `free(NULL)` included; the slow
//! path tests for NULL. A program that frees NULL a lot (coreutils' `sort
//! -f` frees its NULL key buffer after every comparison: 2 M calls for 75
//! blocks) paid a probe hit for each.
//!
//! Such a free is split in two sites, each call recording at one at most:
//! - the fast path's last exit to the slow path (a conditional jump the
//!   kernel emulates): the free records there when the jump falls through
//!   to the fast path's `ret`, its outcome read from the flags;
//! - the slow path's first emulated instruction past its NULL test.
//!
//! The slow path must be code only the split frees' exits reach (no other
//! jump, call or stored address leads to it); else the free keeps its
//! single probe.

use std::collections::HashMap;

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpKind,
    Register,
};

use super::returns::{condition_code, stack_move, writes};

/// Instructions of a fast path followed at most.
const MAX_FAST: usize = 64;
/// Instructions of a slow path followed up to its site at most.
const MAX_SLOW: usize = 48;
/// Jumps followed from an exit to the slow path.
const MAX_HOPS: usize = 4;
/// The farthest a slow path's site may be below the entry's stack pointer:
/// the cookie has 8 bits of 8-byte units.
const MAX_SP: i64 = 255 * 8;
/// The registers the free program reads the pointer from, by cookie index
/// (rdi, rsi, rdx, rcx, rax).
const PTR_REGS: [Register; 5] = [
    Register::RDI,
    Register::RSI,
    Register::RDX,
    Register::RCX,
    Register::RAX,
];

/// Where the instructions reaching each of some addresses end (see
/// [`split`]'s `referrers`).
pub type Referrers = HashMap<u64, Vec<u64>>;

/// One site of a split free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FreeSite {
    pub vaddr: u64,
    /// Bytes from the stack pointer at the site up to the entry's.
    pub sp_adjust: u8,
    /// Where the pointer is (index in [`PTR_REGS`]; 0 is rdi).
    pub ptr: u8,
    /// On a conditional jump: its condition code and the outcome the free
    /// completes on.
    pub cond: Option<(u8, bool)>,
}

/// A free split in two: its fast path's site, and its slow path's, shared
/// by every free whose fast path leaves for the same slow path (listed
/// with the first of them only).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Split {
    pub fast: FreeSite,
    pub slow: Option<FreeSite>,
}

/// A fast path as followed: its site, the slow path it leaves for, and the
/// addresses its exits reach it through (the slow path's entry and the
/// jumps on the way, each with the end of the instruction that jumps
/// there).
struct Fast {
    site: FreeSite,
    slow: u64,
    hops: Vec<(u64, u64)>,
}

/// The split of each free at `frees` that has one: `code(vaddr)` gives an
/// instruction's bytes, `emulated(vaddr)` whether the kernel emulates the
/// instruction there, `fde_start(vaddr)` whether a function's unwind
/// entry starts there, and `referrers(targets)`, for each target, the ends
/// of the instructions whose displacement reaches it (u64::MAX for an
/// address stored as data).
pub fn split<'a>(
    code: &dyn Fn(u64) -> Option<&'a [u8]>,
    emulated: &dyn Fn(u64) -> bool,
    fde_start: &dyn Fn(u64) -> bool,
    referrers: &dyn Fn(&[u64]) -> Referrers,
    frees: &[u64],
) -> HashMap<u64, Split> {
    let fasts: Vec<(u64, Fast)> = frees
        .iter()
        .filter_map(|&at| Some((at, fast_path(code, at)?)))
        .filter(|(_, f)| fde_start(f.slow))
        .collect();
    if fasts.is_empty() {
        return HashMap::new();
    }
    let targets: Vec<u64> = fasts
        .iter()
        .flat_map(|(_, f)| f.hops.iter().map(|&(to, _)| to))
        .collect();
    let refs = referrers(&targets);
    let mut out = HashMap::new();
    let mut slows: HashMap<u64, Option<FreeSite>> = HashMap::new();
    for (at, fast) in &fasts {
        let group: Vec<&Fast> = fasts
            .iter()
            .map(|(_, f)| f)
            .filter(|f| f.slow == fast.slow)
            .collect();
        let known: Vec<u64> = group
            .iter()
            .flat_map(|f| f.hops.iter().map(|&(_, end)| end))
            .collect();
        let only_ours = group.iter().flat_map(|f| &f.hops).all(|(to, _)| {
            refs.get(to)
                .is_none_or(|ends| ends.iter().all(|e| known.contains(e)))
        });
        if !only_ours {
            tracing::debug!(
                free = format_args!("{at:#x}"),
                slow = format_args!("{:#x}", fast.slow),
                "free not split: its slow path is reached from elsewhere"
            );
            continue;
        }
        let first = !slows.contains_key(&fast.slow);
        let slow = *slows
            .entry(fast.slow)
            .or_insert_with(|| slow_site(code, emulated, fast.slow));
        let Some(slow) = slow else {
            tracing::debug!(
                free = format_args!("{at:#x}"),
                slow = format_args!("{:#x}", fast.slow),
                "free not split: no site past its slow path's NULL test"
            );
            continue;
        };
        out.insert(
            *at,
            Split {
                fast: fast.site,
                slow: first.then_some(slow),
            },
        );
    }
    out
}

fn decode<'a>(code: &dyn Fn(u64) -> Option<&'a [u8]>, at: u64) -> Option<Instruction> {
    let insn = Decoder::with_ip(64, code(at)?, at, DecoderOptions::NONE).decode();
    (!insn.is_invalid()).then_some(insn)
}

/// The fast path from `entry`: straight code to a `ret` whose every exit
/// is a conditional jump to one slow path, leaving rdi and the stack
/// pointer alone. Its site is the last exit, recording on the fall-through.
fn fast_path<'a>(code: &dyn Fn(u64) -> Option<&'a [u8]>, entry: u64) -> Option<Fast> {
    let mut info = InstructionInfoFactory::new();
    let mut at = entry;
    let mut last = None;
    let mut slow = None;
    let mut hops = Vec::new();
    for _ in 0..MAX_FAST {
        let insn = decode(code, at)?;
        match insn.flow_control() {
            FlowControl::Next => {
                let touches = info.info(&insn).used_registers().iter().any(|u| {
                    writes(u.access())
                        && matches!(u.register().full_register(), Register::RDI | Register::RSP)
                });
                if touches || insn.mnemonic() == Mnemonic::Push {
                    return None;
                }
            }
            FlowControl::ConditionalBranch if insn.op0_kind() == OpKind::NearBranch64 => {
                let (to, path) = follow(code, insn.near_branch_target(), insn.next_ip())?;
                if *slow.get_or_insert(to) != to {
                    return None;
                }
                hops.extend(path);
                last = Some(insn);
            }
            FlowControl::Return if insn.mnemonic() == Mnemonic::Ret && insn.op_count() == 0 => {
                let jcc = last?;
                return Some(Fast {
                    site: FreeSite {
                        vaddr: jcc.ip(),
                        sp_adjust: 0,
                        ptr: 0,
                        cond: Some((condition_code(&jcc), false)),
                    },
                    slow: slow?,
                    hops,
                });
            }
            _ => return None,
        }
        at = insn.next_ip();
    }
    None
}

/// Where a jump to `to` (from an instruction ending at `end`) leads through
/// direct jumps, and each address on the way with the end of the
/// instruction jumping there.
fn follow<'a>(
    code: &dyn Fn(u64) -> Option<&'a [u8]>,
    mut to: u64,
    mut end: u64,
) -> Option<(u64, Vec<(u64, u64)>)> {
    let mut path = vec![(to, end)];
    for _ in 0..MAX_HOPS {
        let insn = decode(code, to)?;
        if insn.mnemonic() != Mnemonic::Jmp || insn.op0_kind() != OpKind::NearBranch64 {
            return Some((to, path));
        }
        (to, end) = (insn.near_branch_target(), insn.next_ip());
        path.push((to, end));
    }
    None
}

/// The slow path's site: past its test of the pointer for NULL (`test
/// reg,reg; je`), the first instruction the kernel emulates, reached by
/// straight code that saves registers and takes stack (by known amounts)
/// and keeps the pointer in one of the registers the program reads.
fn slow_site<'a>(
    code: &dyn Fn(u64) -> Option<&'a [u8]>,
    emulated: &dyn Fn(u64) -> bool,
    entry: u64,
) -> Option<FreeSite> {
    let mut info = InstructionInfoFactory::new();
    let mut held = vec![Register::RDI];
    let mut sp: i64 = 0;
    let mut tested = false;
    let mut at = entry;
    for _ in 0..MAX_SLOW {
        let insn = decode(code, at)?;
        if tested && emulated(at) {
            let ptr = PTR_REGS.iter().position(|r| held.contains(r))?;
            return Some(FreeSite {
                vaddr: at,
                sp_adjust: u8::try_from(-sp).ok().filter(|&b| i64::from(b) <= MAX_SP)?,
                ptr: ptr as u8,
                cond: None,
            });
        }
        if !tested && is_null_test(&insn, &held) {
            let je = decode(code, insn.next_ip())?;
            if je.mnemonic() != Mnemonic::Je {
                return None;
            }
            tested = true;
            at = je.next_ip();
            continue;
        }
        if insn.flow_control() != FlowControl::Next {
            return None;
        }
        sp += stack_change(&insn, &mut info)?;
        if sp < -MAX_SP {
            return None;
        }
        track_copies(&insn, &mut held, &mut info);
        at = insn.next_ip();
    }
    None
}

/// `test reg,reg` of a register holding the pointer.
fn is_null_test(insn: &Instruction, held: &[Register]) -> bool {
    insn.mnemonic() == Mnemonic::Test
        && insn.op0_kind() == OpKind::Register
        && insn.op1_kind() == OpKind::Register
        && insn.op0_register() == insn.op1_register()
        && held.contains(&insn.op0_register())
}

/// How much `insn` moves the stack pointer: `push reg`, or what
/// [`stack_move`] knows; 0 for an instruction that leaves it; None for any
/// other change.
fn stack_change(insn: &Instruction, info: &mut InstructionInfoFactory) -> Option<i64> {
    if insn.mnemonic() == Mnemonic::Push && insn.op0_kind() == OpKind::Register {
        return Some(-8);
    }
    if let Some(moved) = stack_move(insn) {
        return Some(moved);
    }
    let moves = info
        .info(insn)
        .used_registers()
        .iter()
        .any(|u| writes(u.access()) && u.register().full_register() == Register::RSP);
    (!moves).then_some(0)
}

/// Keeps `held` (the registers holding the pointer) true over `insn`: a
/// 64-bit register copy of one adds its destination, any other write
/// removes the register written.
fn track_copies(insn: &Instruction, held: &mut Vec<Register>, info: &mut InstructionInfoFactory) {
    let copy = (insn.mnemonic() == Mnemonic::Mov
        && insn.op0_kind() == OpKind::Register
        && insn.op1_kind() == OpKind::Register
        && insn.op0_register().size() == 8)
        .then(|| (insn.op0_register(), insn.op1_register()));
    for used in info.info(insn).used_registers() {
        if writes(used.access()) {
            let reg = used.register().full_register();
            held.retain(|&r| r != reg);
        }
    }
    if let Some((to, from)) = copy {
        if held.contains(&from) || from == to {
            held.push(to);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A jemalloc-like free at 0x1000 (fast path: three exits to a stub
    /// that jumps to the slow path at 0x2000) and its slow path, assembled
    /// by `as` from:
    ///   0x1000: mov %rdi,%rax; shr $0x1a,%rax; cmp 0x1b0(%rax),%rcx;
    ///           jne stub; mov (%rax),%r9; test %r9,%r9; je stub;
    ///           mov %rdi,-8(%r9); cmp %r9,%rax; je stub; mov %rcx,(%rax); ret;
    ///           stub: jmp 0x2000
    ///   0x2000: push %r15; push %rbx; sub $0x88,%rsp; xor %eax,%eax;
    ///           mov %rdi,%rbx; test %rdi,%rdi; je out; mov (%rbx),%rax;
    ///           cmpb $0,(%rax); jne out; out: add $0x88,%rsp; pop %rbx;
    ///           pop %r15; ret
    const FAST: &[u8] = &[
        0x48, 0x89, 0xf8, 0x48, 0xc1, 0xe8, 0x1a, 0x48, 0x3b, 0x88, 0xb0, 0x01, 0x00, 0x00, 0x75,
        0x17, 0x4c, 0x8b, 0x08, 0x4d, 0x85, 0xc9, 0x74, 0x0f, 0x49, 0x89, 0x79, 0xf8, 0x4c, 0x39,
        0xc8, 0x74, 0x06, 0x48, 0x89, 0x08, 0xc3, 0x90, 0x90, 0xe9, 0xd4, 0x0f, 0x00, 0x00,
    ];
    const SLOW: &[u8] = &[
        0x41, 0x57, 0x53, 0x48, 0x81, 0xec, 0x88, 0x00, 0x00, 0x00, 0x31, 0xc0, 0x48, 0x89, 0xfb,
        0x48, 0x85, 0xff, 0x74, 0x08, 0x48, 0x8b, 0x03, 0x80, 0x38, 0x00, 0x75, 0x00, 0x48, 0x81,
        0xc4, 0x88, 0x00, 0x00, 0x00, 0x5b, 0x41, 0x5f, 0xc3,
    ];

    fn code(at: u64) -> Option<&'static [u8]> {
        let (base, bytes) = if at >= 0x2000 {
            (0x2000, SLOW)
        } else {
            (0x1000, FAST)
        };
        bytes.get(usize::try_from(at.checked_sub(base)?).ok()?..)
    }

    fn emulated(at: u64) -> bool {
        decode(&code, at).is_some_and(|i| {
            matches!(
                i.flow_control(),
                FlowControl::ConditionalBranch | FlowControl::UnconditionalBranch
            ) || i.mnemonic() == Mnemonic::Push
        })
    }

    fn refs(extra: &[u64]) -> impl Fn(&[u64]) -> Referrers + '_ {
        move |targets: &[u64]| {
            let mut out: HashMap<u64, Vec<u64>> = HashMap::new();
            // The stub at 0x1027 is reached by the three exits (ending at
            // 0x1010, 0x1018, 0x1021), the slow path by the stub's jump.
            for (to, end) in [(0x1027, 0x1010), (0x1027, 0x1018), (0x1027, 0x1021)]
                .into_iter()
                .chain([(0x2000, 0x102c)])
                .chain(extra.iter().map(|&e| (0x2000, e)))
            {
                if targets.contains(&to) {
                    out.entry(to).or_default().push(end);
                }
            }
            out
        }
    }

    #[test]
    fn attach_free_split_past_null_test() {
        let split = split(&code, &emulated, &|at| at == 0x2000, &refs(&[]), &[0x1000]);
        let fast = FreeSite {
            vaddr: 0x101f,
            sp_adjust: 0,
            ptr: 0,
            cond: Some((0x4, false)),
        };
        // Past the NULL test: `mov (%rbx),%rax` is single-stepped, the
        // `jne` emulated; the pointer is in rdi (and rbx), 16 + 0x88 bytes
        // below the entry's stack pointer.
        let slow = FreeSite {
            vaddr: 0x201a,
            sp_adjust: 16 + 0x88,
            ptr: 0,
            cond: None,
        };
        assert_eq!(
            split.get(&0x1000),
            Some(&Split {
                fast,
                slow: Some(slow)
            })
        );
    }

    #[test]
    fn attach_free_split_refused_when_shared_or_unsure() {
        // Another jump into the slow path: it is not the frees' own.
        let other = refs(&[0x5005]);
        assert!(split(&code, &emulated, &|at| at == 0x2000, &other, &[0x1000]).is_empty());
        // Its address stored as data (a function pointer).
        let data = refs(&[u64::MAX]);
        assert!(split(&code, &emulated, &|at| at == 0x2000, &data, &[0x1000]).is_empty());
        // Not where a function starts.
        assert!(split(&code, &emulated, &|_| false, &refs(&[]), &[0x1000]).is_empty());
        // A free that tests for NULL first has no fast path of this shape.
        assert!(split(&code, &emulated, &|_| true, &refs(&[]), &[0x2000]).is_empty());
    }
}
