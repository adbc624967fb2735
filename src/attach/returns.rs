//! Return sites: where an allocating function's result is read by an
//! entry probe, not by a kernel return probe (issue 40).
//!
//! This kernel's return probes corrupt a function's result when threads
//! come and go (a program killed by glibc's heap check under a bare
//! bpftrace `uretprobe` on malloc), and a return probe makes the
//! function's return address the kernel's trampoline, which C++ unwinders
//! cannot step through (an exception thrown out of operator new). So an
//! allocating function is probed where it returns instead: on every `ret`
//! its calls can reach, found by following its code from the entry
//! (jumps, tail jumps into shared code, and past calls), or better, on the
//! instruction before it that the kernel emulates (a jump or conditional
//! jump: ~0.4 µs a hit where a `ret` is single-stepped, ~13 µs), when
//! nothing between that instruction and the `ret` changes the result or
//! anything but the stack pointer by a known amount. The probe then knows
//! the result's register, how far the call's entry stack pointer is (the
//! call it ends: BPF compares it with the pending call's), and, on a
//! conditional jump, which outcome returns.
//!
//! Where the code cannot be followed completely (an indirect jump: a jump
//! table, a tail call through a pointer or the PLT), the function keeps a
//! kernel return probe, and the capture says so.

use std::collections::{BTreeMap, HashMap, HashSet};

use iced_x86::{
    Decoder, DecoderOptions, FlowControl, Instruction, InstructionInfoFactory, Mnemonic, OpAccess,
    OpKind, Register,
};

/// Instructions followed from one entry at most: glibc's realloc and
/// calloc reach ~1,500 with the code they jump into.
const MAX_INSNS: usize = 16_384;
/// Instructions walked back from a `ret` at most.
const MAX_BACK: usize = 256;
/// The farthest a site's stack pointer may be below the entry's: the
/// cookie has 8 bits of 8-byte units.
const MAX_DELTA: i64 = 255 * 8;

/// A condition a conditional jump's site returns on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Cond {
    /// The condition code: the low nibble of the jcc's opcode.
    pub cc: u8,
    /// Whether the return follows the taken branch (else the fall-through).
    pub taken: bool,
}

/// One return site of a function.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ReturnSite {
    pub vaddr: u64,
    /// Bytes from the stack pointer at the site up to the call's entry
    /// stack pointer (where its return address is).
    pub sp_delta: u16,
    pub cond: Option<Cond>,
    /// The register holding the result at the site (enum mt_usdt_reg).
    pub reg: u8,
    /// The site is the `ret` itself: single-stepped.
    pub on_ret: bool,
}

/// Why a function's return sites could not all be found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unfollowed {
    /// No valid instruction at this address.
    Undecodable(u64),
    /// An indirect jump (a jump table, a tail call through a pointer).
    Indirect(u64),
    /// More code than [`MAX_INSNS`].
    TooLarge,
    /// No `ret` reached at all (the function never returns normally, or
    /// only through code not followed).
    NoReturn,
    /// Instructions that end transactions or return otherwise.
    Unusual(u64),
}

impl std::fmt::Display for Unfollowed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Undecodable(at) => write!(f, "no instruction at {at:#x}"),
            Self::Indirect(at) => write!(f, "an indirect jump at {at:#x}"),
            Self::TooLarge => write!(f, "over {MAX_INSNS} instructions"),
            Self::NoReturn => write!(f, "no return reached"),
            Self::Unusual(at) => write!(f, "an unusual instruction at {at:#x}"),
        }
    }
}

/// Where a jump through a slot of the image's GOT (a PLT stub's, a tail
/// call through it) goes, as far as the image says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tail {
    /// To a function the image defines itself (at this address).
    Jump(u64),
    /// To a function that returns its first argument (`memset`, `memcpy`,
    /// `memmove`): glibc's calloc ends in a tail call of memset.
    ReturnsFirstArg,
}

/// How control reaches an instruction from one before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Edge {
    /// Falls through (or is the instruction after a call, reached when the
    /// callee returns).
    Fall,
    /// A jump's or a taken conditional jump's target.
    Taken,
}

/// A function's code as followed from its entry.
struct Flow {
    insns: BTreeMap<u64, Instruction>,
    preds: HashMap<u64, Vec<(u64, Edge)>>,
    /// Where calls return, and the register their result is in there:
    /// each `ret` (rax), each tail call of a function returning its first
    /// argument (rdi).
    rets: Vec<(u64, Register)>,
    /// Jumps through the GOT followed to a function of the image: they
    /// change nothing a site reads.
    through: HashSet<u64>,
    /// Calls (through a PLT stub) of a function that returns its first
    /// argument: the result after such a call is the call's rdi.
    first_arg_calls: HashSet<u64>,
}

/// The return sites of the function at `entry`: `code(vaddr)` gives the
/// bytes at a virtual address (an instruction's worth, None outside
/// executable segments); `emulated(vaddr)` says whether the kernel
/// emulates the instruction there; `got(slot)` where a jump through the
/// GOT slot at `slot` goes; `function(vaddr)` the address range of the
/// function holding `vaddr` where known (a call whose next instruction is
/// past its function's end returns no more: a call of abort ends it).
/// `keep_memory`: nothing between a site and its `ret` may write memory
/// (the result is written through a pointer, posix_memalign).
pub fn return_sites<'a>(
    code: &dyn Fn(u64) -> Option<&'a [u8]>,
    emulated: &dyn Fn(u64) -> bool,
    got: &dyn Fn(u64) -> Option<Tail>,
    function: &dyn Fn(u64) -> Option<(u64, u64)>,
    entry: u64,
    keep_memory: bool,
) -> Result<Vec<ReturnSite>, Unfollowed> {
    let flow = follow(code, got, function, entry)?;
    if flow.rets.is_empty() {
        return Err(Unfollowed::NoReturn);
    }
    let mut on_ret: HashSet<u64> = HashSet::new();
    loop {
        let mut sites: BTreeMap<u64, ReturnSite> = BTreeMap::new();
        let mut clash: Option<u64> = None;
        for &(ret, reg) in &flow.rets {
            let found = if on_ret.contains(&ret) {
                None
            } else {
                sites_before(&flow, ret, reg, entry, keep_memory, emulated)
            };
            let found = match found {
                Some(found) => found,
                None => vec![ReturnSite {
                    vaddr: ret,
                    sp_delta: 0,
                    cond: None,
                    reg: usdt_reg(reg).ok_or(Unfollowed::Unusual(ret))?,
                    on_ret: true,
                }],
            };
            for site in found {
                match merge(sites.get(&site.vaddr), site) {
                    Some(merged) => {
                        sites.insert(site.vaddr, merged);
                    }
                    None => clash = Some(ret),
                }
            }
            if clash.is_some() {
                break;
            }
        }
        match clash {
            // Two returns want one instruction read two ways: the second
            // is probed on its `ret`, and all are found again.
            Some(ret) if on_ret.insert(ret) => continue,
            // (A return probed on itself clashes with nothing else.)
            Some(ret) => return Err(Unfollowed::Unusual(ret)),
            None => return Ok(sites.into_values().collect()),
        }
    }
}

/// `site` merged with the one already at its address: the same reading
/// (a conditional jump both of whose outcomes return the same way returns
/// whatever its outcome); None where they differ.
fn merge(have: Option<&ReturnSite>, site: ReturnSite) -> Option<ReturnSite> {
    let Some(have) = have else {
        return Some(site);
    };
    if (have.sp_delta, have.reg, have.on_ret) != (site.sp_delta, site.reg, site.on_ret) {
        return None;
    }
    match (have.cond, site.cond) {
        (a, b) if a == b => Some(*have),
        (Some(a), Some(b)) if a.cc == b.cc && a.taken != b.taken => Some(ReturnSite {
            cond: None,
            ..*have
        }),
        _ => None,
    }
}

/// Follows the code from `entry`: every instruction a call can execute,
/// with the edges between them.
fn follow<'a>(
    code: &dyn Fn(u64) -> Option<&'a [u8]>,
    got: &dyn Fn(u64) -> Option<Tail>,
    function: &dyn Fn(u64) -> Option<(u64, u64)>,
    entry: u64,
) -> Result<Flow, Unfollowed> {
    let mut flow = Flow {
        insns: BTreeMap::new(),
        preds: HashMap::new(),
        rets: Vec::new(),
        through: HashSet::new(),
        first_arg_calls: HashSet::new(),
    };
    let mut work = vec![entry];
    while let Some(at) = work.pop() {
        if flow.insns.contains_key(&at) {
            continue;
        }
        if flow.insns.len() >= MAX_INSNS {
            return Err(Unfollowed::TooLarge);
        }
        let bytes = code(at).ok_or(Unfollowed::Undecodable(at))?;
        let insn = Decoder::with_ip(64, bytes, at, DecoderOptions::NONE).decode();
        if insn.is_invalid() {
            return Err(Unfollowed::Undecodable(at));
        }
        flow.insns.insert(at, insn);
        let next = insn.next_ip();
        let inside = |to: u64| function(at).is_none_or(|(start, end)| (start..end).contains(&to));
        let mut edge = |to: u64, how: Edge, work: &mut Vec<u64>| {
            flow.preds.entry(to).or_default().push((at, how));
            work.push(to);
        };
        match insn.flow_control() {
            FlowControl::Call if plt_target(code, got, &insn) == Some(Tail::ReturnsFirstArg) => {
                flow.first_arg_calls.insert(at);
                edge(next, Edge::Fall, &mut work);
            }
            FlowControl::Next | FlowControl::Call | FlowControl::IndirectCall => {
                if matches!(insn.mnemonic(), Mnemonic::Syscall | Mnemonic::Sysenter) {
                    // A syscall returns to the next instruction.
                    edge(next, Edge::Fall, &mut work);
                } else if inside(next) || !is_call(&insn) {
                    edge(next, Edge::Fall, &mut work);
                }
            }
            FlowControl::ConditionalBranch if is_near_branch(&insn) => {
                edge(insn.near_branch_target(), Edge::Taken, &mut work);
                edge(next, Edge::Fall, &mut work);
            }
            FlowControl::UnconditionalBranch if is_near_branch(&insn) => {
                edge(insn.near_branch_target(), Edge::Taken, &mut work);
            }
            FlowControl::Return => {
                if insn.mnemonic() != Mnemonic::Ret || insn.op_count() != 0 {
                    return Err(Unfollowed::Unusual(at));
                }
                flow.rets.push((at, Register::RAX));
            }
            // int3, ud2, hlt: the path ends.
            FlowControl::Interrupt | FlowControl::Exception => {}
            FlowControl::IndirectBranch => {
                let slot = (insn.op0_kind() == OpKind::Memory && insn.is_ip_rel_memory_operand())
                    .then(|| insn.ip_rel_memory_address());
                match slot.and_then(got) {
                    Some(Tail::Jump(to)) => {
                        flow.through.insert(at);
                        edge(to, Edge::Taken, &mut work);
                    }
                    Some(Tail::ReturnsFirstArg) => flow.rets.push((at, Register::RDI)),
                    None => return Err(Unfollowed::Indirect(at)),
                }
            }
            _ => return Err(Unfollowed::Unusual(at)),
        }
    }
    Ok(flow)
}

/// Where a direct call or jump into a PLT stub (`jmp *slot(%rip)`, maybe
/// after `endbr64`) goes, as `got` says.
fn plt_target<'a>(
    code: &dyn Fn(u64) -> Option<&'a [u8]>,
    got: &dyn Fn(u64) -> Option<Tail>,
    insn: &Instruction,
) -> Option<Tail> {
    if !matches!(insn.op0_kind(), OpKind::NearBranch64) {
        return None;
    }
    stub_slot(code, insn.near_branch_target()).and_then(got)
}

/// The GOT slot of the PLT stub at `at` (`jmp *slot(%rip)`, maybe after
/// `endbr64`); None if no such stub is there.
pub fn stub_slot<'a>(code: &dyn Fn(u64) -> Option<&'a [u8]>, at: u64) -> Option<u64> {
    let decode = |at: u64| {
        let insn = Decoder::with_ip(64, code(at)?, at, DecoderOptions::NONE).decode();
        (!insn.is_invalid()).then_some(insn)
    };
    let mut stub = decode(at)?;
    if stub.mnemonic() == Mnemonic::Endbr64 {
        stub = decode(stub.next_ip())?;
    }
    (stub.flow_control() == FlowControl::IndirectBranch
        && stub.op0_kind() == OpKind::Memory
        && stub.is_ip_rel_memory_operand())
    .then(|| stub.ip_rel_memory_address())
}

fn is_call(insn: &Instruction) -> bool {
    matches!(
        insn.flow_control(),
        FlowControl::Call | FlowControl::IndirectCall
    )
}

/// A direct near jump or conditional jump (not `loop`/`jrcxz`, whose
/// targets iced also gives but whose conditions the probe cannot read).
fn is_near_branch(insn: &Instruction) -> bool {
    matches!(
        insn.op0_kind(),
        OpKind::NearBranch16 | OpKind::NearBranch32 | OpKind::NearBranch64
    ) && matches!(
        insn.mnemonic(),
        Mnemonic::Jmp
            | Mnemonic::Jo
            | Mnemonic::Jno
            | Mnemonic::Jb
            | Mnemonic::Jae
            | Mnemonic::Je
            | Mnemonic::Jne
            | Mnemonic::Jbe
            | Mnemonic::Ja
            | Mnemonic::Js
            | Mnemonic::Jns
            | Mnemonic::Jp
            | Mnemonic::Jnp
            | Mnemonic::Jl
            | Mnemonic::Jge
            | Mnemonic::Jle
            | Mnemonic::Jg
    )
}

/// The sites that cover `ret`: walking back from it through instructions
/// that leave the result alone, the emulated instructions every path to it
/// passes last. None if a path reaches something else first (the entry,
/// a call, a write of the result's register): the `ret` is then probed
/// itself.
fn sites_before(
    flow: &Flow,
    ret: u64,
    reg: Register,
    entry: u64,
    keep_memory: bool,
    emulated: &dyn Fn(u64) -> bool,
) -> Option<Vec<ReturnSite>> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    // (instruction, bytes from the sp before it to the entry's, the
    // register holding the result before it)
    let mut work: Vec<(u64, i64, Register)> = vec![(ret, 0, reg)];
    let mut info = InstructionInfoFactory::new();
    while let Some((at, delta, reg)) = work.pop() {
        if !seen.insert((at, delta, reg)) {
            continue;
        }
        if seen.len() > MAX_BACK || at == entry {
            return None;
        }
        for &(from, how) in flow.preds.get(&at)? {
            let insn = flow.insns.get(&from)?;
            if flow.through.contains(&from) {
                work.push((from, delta, reg));
                continue;
            }
            if how == Edge::Fall
                && insn.mnemonic() == Mnemonic::Call
                && insn.op0_kind() == OpKind::NearBranch64
                && callee_saved(reg)
            {
                // The result is in a register the callee preserves (the
                // SysV ABI): final before the call (mimalloc's realloc
                // frees the old block last).
                if !emulated(from) {
                    return None;
                }
                out.push(site_at(from, delta, reg, None)?);
                continue;
            }
            if how == Edge::Fall && reg == Register::RAX && flow.first_arg_calls.contains(&from) {
                // `call memset@plt` and back: the result is the call's rdi
                // (the call leaves the stack pointer as it found it).
                if !emulated(from) {
                    return None;
                }
                out.push(site_at(from, delta, Register::RDI, None)?);
                continue;
            }
            let branch = is_near_branch(insn);
            if branch || (how == Edge::Fall && is_plain_emulated(insn)) {
                if !emulated(from) {
                    return None;
                }
                let cond = (branch && insn.mnemonic() != Mnemonic::Jmp).then(|| Cond {
                    cc: condition_code(insn),
                    taken: how == Edge::Taken,
                });
                let sp = delta + sp_change(insn)?;
                out.push(site_at(from, sp, reg, cond)?);
                continue;
            }
            let (change, before) = transparent(insn, reg, keep_memory, &mut info)?;
            work.push((from, delta + change, before));
        }
    }
    Some(out)
}

fn site_at(vaddr: u64, delta: i64, reg: Register, cond: Option<Cond>) -> Option<ReturnSite> {
    if !(0..=MAX_DELTA).contains(&delta) || delta % 8 != 0 {
        return None;
    }
    Some(ReturnSite {
        vaddr,
        sp_delta: u16::try_from(delta).ok()?,
        cond,
        reg: usdt_reg(reg)?,
        on_ret: false,
    })
}

/// An emulated instruction that is no branch: `nop`, `push reg`.
fn is_plain_emulated(insn: &Instruction) -> bool {
    matches!(insn.mnemonic(), Mnemonic::Nop | Mnemonic::Push)
        && insn.flow_control() == FlowControl::Next
}

/// How much the stack pointer rises over `insn`, for the instructions a
/// site may sit on.
fn sp_change(insn: &Instruction) -> Option<i64> {
    match insn.mnemonic() {
        Mnemonic::Push if insn.op0_kind() == OpKind::Register => Some(-8),
        Mnemonic::Push => None,
        _ => Some(0),
    }
}

/// The condition code of a conditional jump (the low nibble of its
/// opcode: `jo` 0 to `jg` 0xf).
pub(super) fn condition_code(insn: &Instruction) -> u8 {
    match insn.mnemonic() {
        Mnemonic::Jo => 0x0,
        Mnemonic::Jno => 0x1,
        Mnemonic::Jb => 0x2,
        Mnemonic::Jae => 0x3,
        Mnemonic::Je => 0x4,
        Mnemonic::Jne => 0x5,
        Mnemonic::Jbe => 0x6,
        Mnemonic::Ja => 0x7,
        Mnemonic::Js => 0x8,
        Mnemonic::Jns => 0x9,
        Mnemonic::Jp => 0xa,
        Mnemonic::Jnp => 0xb,
        Mnemonic::Jl => 0xc,
        Mnemonic::Jge => 0xd,
        Mnemonic::Jle => 0xe,
        _ => 0xf,
    }
}

/// Whether `insn`, run between a site and its `ret`, leaves the result
/// alone: no branch or call, the stack pointer moved only by a known
/// amount (`pop`, `add`/`sub`/`lea` of a constant), the result's register
/// `reg` written only by a 64-bit move from another register (which then
/// holds the result before it), no memory written if `keep_memory`.
/// Returns how much the stack pointer rises and where the result is
/// before the instruction.
fn transparent(
    insn: &Instruction,
    reg: Register,
    keep_memory: bool,
    info: &mut InstructionInfoFactory,
) -> Option<(i64, Register)> {
    if insn.flow_control() != FlowControl::Next
        || insn.has_lock_prefix()
        || insn.has_rep_prefix()
        || insn.has_repne_prefix()
    {
        return None;
    }
    let mut before = reg;
    let mut change = 0;
    if let Some(moved) = stack_move(insn) {
        change = moved;
    } else if insn.mnemonic() == Mnemonic::Mov
        && insn.op0_kind() == OpKind::Register
        && insn.op1_kind() == OpKind::Register
        && insn.op0_register() == reg
        && insn.op1_register().size() == 8
        && insn.op1_register() != Register::RSP
    {
        before = insn.op1_register();
    }
    let info = info.info(insn);
    for used in info.used_registers() {
        if !writes(used.access()) {
            continue;
        }
        let full = used.register().full_register();
        if full == Register::RSP && change == 0 && insn.mnemonic() != Mnemonic::Pop {
            return None; // moves the stack pointer by an unknown amount
        }
        if full == reg && before == reg {
            return None; // writes the result
        }
    }
    if keep_memory && info.used_memory().iter().any(|m| writes(m.access())) {
        return None;
    }
    Some((change, before))
}

/// Whether an operand access writes.
pub(super) fn writes(access: OpAccess) -> bool {
    matches!(
        access,
        OpAccess::Write | OpAccess::CondWrite | OpAccess::ReadWrite | OpAccess::ReadCondWrite
    )
}

/// How much the stack pointer rises over `insn` if it is a `pop` of a
/// register or adds a constant to it; None for anything else.
pub(super) fn stack_move(insn: &Instruction) -> Option<i64> {
    let rsp_dest = insn.op_count() >= 1
        && insn.op0_kind() == OpKind::Register
        && insn.op0_register() == Register::RSP;
    match insn.mnemonic() {
        Mnemonic::Pop if insn.op0_kind() == OpKind::Register => {
            (insn.op0_register() != Register::RSP).then_some(8)
        }
        Mnemonic::Add | Mnemonic::Sub if rsp_dest && is_immediate(insn.op1_kind()) => {
            let imm = insn.immediate(1) as i64;
            Some(if insn.mnemonic() == Mnemonic::Add {
                imm
            } else {
                -imm
            })
        }
        Mnemonic::Lea
            if rsp_dest
                && insn.memory_base() == Register::RSP
                && insn.memory_index() == Register::None =>
        {
            Some(insn.memory_displacement64() as i64)
        }
        _ => None,
    }
}

fn is_immediate(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Immediate8
            | OpKind::Immediate8to32
            | OpKind::Immediate8to64
            | OpKind::Immediate32
            | OpKind::Immediate32to64
    )
}

/// Whether a called function leaves `reg` as it found it (the SysV ABI's
/// callee-saved registers).
fn callee_saved(reg: Register) -> bool {
    matches!(
        reg,
        Register::RBX
            | Register::RBP
            | Register::R12
            | Register::R13
            | Register::R14
            | Register::R15
    )
}

/// enum mt_usdt_reg's `MT_REG_AX`.
pub const MT_REG_AX: u8 = 0;

/// A 64-bit general register as enum mt_usdt_reg numbers it.
fn usdt_reg(reg: Register) -> Option<u8> {
    Some(match reg {
        Register::RAX => 0,
        Register::RBX => 1,
        Register::RCX => 2,
        Register::RDX => 3,
        Register::RSI => 4,
        Register::RDI => 5,
        Register::RBP => 6,
        Register::R8 => 8,
        Register::R9 => 9,
        Register::R10 => 10,
        Register::R11 => 11,
        Register::R12 => 12,
        Register::R13 => 13,
        Register::R14 => 14,
        Register::R15 => 15,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::{Cond, MT_REG_AX, ReturnSite, Tail, return_sites};

    fn sites(code: &[u8], got: &dyn Fn(u64) -> Option<Tail>) -> Vec<ReturnSite> {
        let bytes = |at: u64| code.get(usize::try_from(at).ok()?..);
        let emulated = |at: u64| bytes(at).is_some_and(super::super::emulated::is_emulated);
        let whole = |_: u64| Some((0, code.len() as u64));
        return_sites(&bytes, &emulated, got, &whole, 0, false).expect("followed")
    }

    /// Check the two ways a return is read: on the conditional jump every
    /// path to one `ret` passes last, with the result in rbx there and
    /// rbx's push to pop; on the other `ret` itself, whose path writes rax
    /// (`xor %eax,%eax`: a failure's NULL).
    #[test]
    fn attach_return_sites_on_jumps_and_rets() {
        let code = [
            0x53, // 0x0 push %rbx
            0x48, 0x89, 0xfb, // 0x1 mov %rdi,%rbx
            0x48, 0x85, 0xdb, // 0x4 test %rbx,%rbx
            0x74, 0x05, // 0x7 je 0xe
            0x48, 0x89, 0xd8, // 0x9 mov %rbx,%rax
            0x5b, // 0xc pop %rbx
            0xc3, // 0xd ret
            0x31, 0xc0, // 0xe xor %eax,%eax
            0x5b, // 0x10 pop %rbx
            0xc3, // 0x11 ret
        ];
        let found = sites(&code, &|_| None);
        assert_eq!(
            found,
            vec![
                ReturnSite {
                    vaddr: 0x7,
                    sp_delta: 8,
                    cond: Some(Cond {
                        cc: 0x4,
                        taken: false
                    }),
                    reg: 1, // rbx (enum mt_usdt_reg)
                    on_ret: false,
                },
                ReturnSite {
                    vaddr: 0x11,
                    sp_delta: 0,
                    cond: None,
                    reg: MT_REG_AX,
                    on_ret: true,
                },
            ]
        );
    }

    /// Check that a call of memset through the PLT before the `ret` is the
    /// site, reading the call's rdi (memset returns it: mimalloc's calloc),
    /// and that a jump through a GOT slot nobody names is not followed.
    #[test]
    fn attach_return_sites_memset_call_and_unknown_slot() {
        let mut code = vec![
            0x48, 0x83, 0xec, 0x08, // 0x0 sub $8,%rsp
            0xe8, 0x17, 0x00, 0x00, 0x00, // 0x4 call 0x20
            0x48, 0x83, 0xc4, 0x08, // 0x9 add $8,%rsp
            0xc3, // 0xd ret
        ];
        code.resize(0x20, 0xcc);
        code.extend([0xff, 0x25, 0x00, 0x10, 0x00, 0x00]); // 0x20 jmp *0x1000(%rip)
        let memset = |slot: u64| (slot == 0x1026).then_some(Tail::ReturnsFirstArg);
        assert_eq!(
            sites(&code, &memset),
            vec![ReturnSite {
                vaddr: 0x4,
                sp_delta: 8,
                cond: None,
                reg: 5, // rdi
                on_ret: false,
            }]
        );
        // The same stub reached by a tail jump from the entry instead.
        let mut tail = vec![0xe9, 0x1b, 0x00, 0x00, 0x00]; // 0x0 jmp 0x20
        tail.resize(0x20, 0xcc);
        tail.extend([0xff, 0x25, 0x00, 0x10, 0x00, 0x00]);
        let bytes = |at: u64| tail.get(usize::try_from(at).ok()?..);
        let emulated = |at: u64| bytes(at).is_some_and(super::super::emulated::is_emulated);
        let whole = |_: u64| Some((0, tail.len() as u64));
        let unknown = return_sites(&bytes, &emulated, &|_| None, &whole, 0, false);
        assert_eq!(unknown, Err(super::Unfollowed::Indirect(0x20)));
        let found = return_sites(&bytes, &emulated, &memset, &whole, 0, false).expect("found");
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].vaddr, found[0].reg, found[0].sp_delta),
            (0x0, 5, 0)
        );
    }
}
