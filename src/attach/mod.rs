//! Finding allocator entry points in an image and attaching the probes.
//!
//! An allocator site is a (file, offset) where a probe goes, with the kind
//! of call the BPF side reports (the attach cookie). Several symbols can name
//! one address (glibc's `free`/`cfree`, `memalign`/`aligned_alloc`): a site is
//! attached once per address, under the first name in [`api::libc`] order.
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
//! kernel emulates by its rules (`is_emulated`).
//!
//! Every site gets a hit counter in BPF ([`HitSlots`], carried in its
//! cookie), read after the capture into the profile's `probes`.
//!
//! Probes are per process where the kernel allows ([`per_process`]), else
//! system-wide (every process mapping the file hits them); the BPF programs
//! filter on the tracked-process map either way.

pub mod api;
pub mod cache;
pub mod free_sites;
pub mod per_process;
pub mod place;
pub mod returns;
pub mod shim;
pub mod static_image;
pub mod usdt;
pub mod worker;

use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use iced_x86::{
    Decoder, DecoderOptions, Instruction, InstructionInfoFactory, Mnemonic, OpAccess, OpKind,
    Register,
};
use libbpf_rs::Link;
use object::{Object, ObjectSegment, ObjectSymbol};

pub use api::{Abi, Entry, Role};

use crate::bpf::record::Kind;
use crate::bpf::skel::memtrail::MemtrailSkel;
use crate::bpf::skel::memtrail::types as t;
use crate::profile::ProbeEntry;
use crate::sys::UprobeKind;
use crate::sys::{image_key, panic_text};

/// Sites that get a hit counter in a capture (`MT_MAX_SITES`); the ones
/// attached after them are probed all the same, without a count.
pub const MAX_COUNTED_SITES: u32 = t::mt_site_hits::MT_MAX_SITES.0;

/// Hands out the hit counters of BPF's `site_hits` to sites in the order
/// they are attached, up front and then by the attach worker: a site keeps
/// its counter for the whole capture, and none is handed out twice.
#[derive(Debug, Default)]
pub struct HitSlots {
    next: u32,
}

impl HitSlots {
    /// Gives each of `sites` the next free counter, while there is one.
    pub fn assign(&mut self, sites: &mut [Site]) {
        for site in sites {
            site.hit_slot = (self.next < MAX_COUNTED_SITES).then_some(self.next);
            if self.next == MAX_COUNTED_SITES {
                tracing::warn!(
                    target: crate::profile::NOTE,
                    %site,
                    max = MAX_COUNTED_SITES,
                    "probe sites past this one have no hit count"
                );
            }
            self.next = self.next.saturating_add(1);
        }
    }
}

/// Each site's hits in tracked threads, summed over BPF's per-CPU rows of
/// `site_hits`; None for a site without a counter. Read once the probes are
/// detached, when the counts no longer move.
pub fn read_site_hits(skel: &MemtrailSkel<'_>, sites: &[Site]) -> Vec<Option<u64>> {
    let bss = skel
        .maps
        .bss_data
        .as_deref()
        .expect("the BPF object has a .bss");
    sites
        .iter()
        .map(|site| {
            let slot = usize::try_from(site.hit_slot?).ok()?;
            Some(bss.site_hits.iter().map(|row| row[slot]).sum())
        })
        .collect()
}

/// A path read from `/proc/PID/map_files` or `/proc/PID/exe`, without the
/// ` (deleted)` the kernel appends for an unlinked file.
pub fn strip_deleted(path: PathBuf) -> PathBuf {
    match path.to_str().and_then(|p| p.strip_suffix(" (deleted)")) {
        Some(p) => PathBuf::from(p),
        None => path,
    }
}

/// The key of an image in the BPF `known_images` map (`struct known_id`):
/// its device (kernel encoding) and inode, and the process it is known for
/// (0: every process).
pub fn known_key(id: (u64, u64), tgid: u32) -> [u8; 24] {
    let mut key = [0u8; 24];
    key[..16].copy_from_slice(&image_key(id));
    key[16..20].copy_from_slice(&tgid.to_ne_bytes());
    key
}

/// The C++ runtimes installed in the usual library directories: commands
/// that load them get their `operator new` probed.
pub fn cxx_runtimes() -> Vec<PathBuf> {
    let dirs = [
        "/lib/x86_64-linux-gnu",
        "/usr/lib/x86_64-linux-gnu",
        "/lib64",
        "/usr/lib64",
        "/usr/lib",
    ];
    let mut found: Vec<PathBuf> = Vec::new();
    for dir in dirs {
        for name in ["libstdc++.so.6", "libc++.so.1"] {
            if let Ok(path) = fs::canonicalize(Path::new(dir).join(name)) {
                if !found.contains(&path) {
                    found.push(path);
                }
            }
        }
    }
    found
}

/// Errors finding or attaching allocator probes.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error("cannot read {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path} is not an ELF image")]
    NotElf { path: PathBuf },
    #[error("cannot examine {path}: {reason}")]
    Unexaminable { path: PathBuf, reason: String },
    #[error("examining an image panicked: {message}")]
    Panicked { message: String },
    #[error("cannot parse ELF image {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("no libc mapping found in /proc/self/maps")]
    NoLibc,
    #[error(
        "attaching to {symbol} in {path} conflicts with another tracer's uprobe at the same \
         offset (the kernel log says `ref_ctr_offset mismatch`): stop the other tracer \
         (bpftrace, perf, a USDT-enabled profiler) and retry; a tracer's return probe stays \
         registered after it exits while a process is stopped or blocked inside the probed \
         function, until that function returns"
    )]
    Conflict { path: PathBuf, symbol: String },
    #[error(
        "attaching uprobes to {symbol} in {path} failed (memtrail needs uprobe_multi \
         links, Linux 6.6 or later)"
    )]
    Uprobe {
        path: PathBuf,
        symbol: String,
        #[source]
        source: crate::sys::SysError,
    },
}

/// The reason given for an image skipped as no ELF image.
pub const NOT_ELF: &str = "not an ELF image";

/// ENOTSUPP (a kernel-internal errno that reaches user space): the kernel
/// cannot probe an instruction (x86's `uprobe_init_insn`, `prepare_uprobe`).
const ENOTSUPP: i32 = 524;

impl AttachError {
    /// Why the image should be skipped rather than the capture failed,
    /// when the error comes from what the image holds: not an ELF image
    /// (a JIT's code, a PE image under Wine, data mapped executable), a
    /// malformed or foreign one, or code at a site the kernel cannot
    /// probe. None for errors of memtrail or the system (an unreadable
    /// file, a conflicting tracer, a kernel without uprobe_multi).
    pub fn skip_reason(&self) -> Option<String> {
        match self {
            AttachError::NotElf { .. } => Some(NOT_ELF.to_owned()),
            AttachError::Parse { reason, .. } => Some(format!("malformed ELF image: {reason}")),
            AttachError::Unexaminable { reason, .. } => Some(reason.clone()),
            AttachError::Uprobe { symbol, source, .. }
                if matches!(source.errno(), Some(ENOTSUPP | libc::ENOEXEC)) =>
            {
                Some(format!(
                    "the kernel cannot probe the instruction at one of its sites ({symbol}): \
                     {source}"
                ))
            }
            _ => None,
        }
    }
}

/// Where one probe goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Site {
    pub image: PathBuf,
    pub symbol: String,
    pub role: Role,
    pub kind: Kind,
    pub abi: Abi,
    /// File offset of the probed instruction.
    pub offset: u64,
    /// Offset from the function's entry (non-zero where the probe was moved
    /// past endbr64, a NULL test or a harmless prefix).
    pub skipped: u64,
    /// Whether the kernel emulates the probed instruction (cheap) rather
    /// than single-stepping it.
    pub emulated: bool,
    /// The site's hit counter in BPF (`site_hits`), given by [`HitSlots`]
    /// when it is attached; None before, or past the last counter.
    pub hit_slot: Option<u32>,
}

impl Site {
    /// The site's attach cookie: its kind and argument layout, and for
    /// operator new the flag that tells `alloc_enter` to only capture the
    /// stack; a region marker's is its own (`usdt::marker_cookie`). Each
    /// carries the site's hit counter (`MT_CK_SITE_SHIFT`, 1-based, 0 for
    /// none).
    pub fn cookie(&self) -> u64 {
        let slot = self.hit_slot.map_or(0, |slot| u64::from(slot) + 1)
            << t::mt_cookie_layout::MT_CK_SITE_SHIFT.0;
        slot | match self.role {
            Role::Marker => usdt::marker_cookie(self),
            Role::New | Role::Syscall => {
                let flag = if self.role == Role::New {
                    t::mt_cookie_flags::MT_CK_NEW.0
                } else {
                    t::mt_cookie_flags::MT_CK_SYSCALL.0
                };
                self.abi.cookie(self.kind)
                    | u64::from(flag) << t::mt_cookie_layout::MT_CK_FLAGS_SHIFT.0
            }
            Role::Return(r) => return_cookie(&r),
            _ => self.abi.cookie(self.kind),
        }
    }
}

/// A return site's cookie (enum mt_return_cookie).
fn return_cookie(r: &returns::ReturnSite) -> u64 {
    use t::mt_return_cookie as rc;
    let mut cookie = u64::from(rc::MT_RC_KIND.0)
        | u64::from(r.sp_delta / 8) << rc::MT_RC_DELTA_SHIFT.0
        | u64::from(r.reg) << rc::MT_RC_REG_SHIFT.0;
    if let Some(cond) = r.cond {
        cookie |= 1 << rc::MT_RC_COND_BIT.0
            | u64::from(cond.cc) << rc::MT_RC_CC_SHIFT.0
            | u64::from(cond.taken) << rc::MT_RC_TAKEN_BIT.0;
    }
    cookie
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.image.display())
    }
}

impl Site {
    /// The site's name: its symbol and offset from the entry, and for a
    /// return site (which may sit in code the function jumps to, before
    /// its entry) that it is one.
    pub fn name(&self) -> String {
        match self.role {
            Role::Return(_) => {
                let off = self.skipped as i64;
                let sign = if off < 0 { "-" } else { "+" };
                format!("{} return {sign}{:#x}", self.symbol, off.unsigned_abs())
            }
            Role::Free if self.abi.free_split && self.abi.free_cond.is_none() => {
                let off = self.skipped as i64;
                let sign = if off < 0 { "-" } else { "+" };
                format!("{} slow path {sign}{:#x}", self.symbol, off.unsigned_abs())
            }
            _ => format!("{}+{:#x}", self.symbol, self.skipped),
        }
    }
}

/// The libc this process runs with: the dynamically linked commands we
/// start load the same one.
pub fn libc_path() -> Result<PathBuf, AttachError> {
    let maps = fs::read_to_string("/proc/self/maps").map_err(|source| AttachError::Read {
        path: "/proc/self/maps".into(),
        source,
    })?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libc.so") || n.starts_with("libc-"))
        })
        .map(PathBuf::from)
        .ok_or(AttachError::NoLibc)
}

/// The dynamic loader this process runs with (the one dynamically linked
/// commands use).
pub fn ld_so_path() -> Option<PathBuf> {
    let maps = fs::read_to_string("/proc/self/maps").ok()?;
    maps.lines()
        .filter_map(|line| line.split_whitespace().nth(5))
        .find(|path| {
            Path::new(path)
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("ld-linux"))
        })
        .map(PathBuf::from)
}

/// The allocator sites of `image` for the given API, and its USDT region
/// markers (see [`usdt`]).
///
/// Total on any file a tracked process can map: an image that is not an
/// x86-64 ELF image, or whose headers, symbols or code make no sense, is
/// an error that [`AttachError::skip_reason`] names (the image is then
/// skipped, not the capture failed); sizes, counts and loops are bounded
/// by the file, and a panic in a parser is caught and reported the same
/// way.
pub fn find_sites(image: &Path, api: &[Entry]) -> Result<Vec<Site>, AttachError> {
    let data = crate::sys::map_file(image).map_err(|source| read_error(image, source))?;
    sites_in(image, &data, api)
}

/// The allocator sites of `image` a capture probes: [`find_sites`] over
/// every API, less the `operator new` sites of an image without an
/// allocator of its own (libstdc++, libc++) unless `probe_new`. That
/// operator new only calls malloc, which is probed anyway: one trap less
/// per C++ allocation (issue 22). Its probe is wanted only when stacks are
/// walked by frame pointers (`--unwind fp`, or tables that failed to
/// load): it captures the stack at new's entry for the malloc to take.
/// Stacks from unwind tables start at new's caller without it (its rows
/// are flagged `MT_ROW_ALLOC_WRAPPER`, `unwind/table.rs`), and without
/// stacks (`--stack-depth 0`) it only counted its own hits.
pub fn capture_sites(image: &Path, probe_new: bool) -> Result<Vec<Site>, AttachError> {
    let mut sites = find_sites(image, &api::all())?;
    if !probe_new && !sites.iter().any(|s| s.role == Role::Alloc) {
        sites.retain(|s| s.role != Role::New);
    }
    Ok(sites)
}

/// An image that could not be read: one that is not a regular file, or
/// too large to read, is skipped like a malformed one.
fn read_error(image: &Path, source: io::Error) -> AttachError {
    match source.kind() {
        io::ErrorKind::InvalidInput | io::ErrorKind::FileTooLarge => AttachError::Unexaminable {
            path: image.to_owned(),
            reason: source.to_string(),
        },
        _ => AttachError::Read {
            path: image.to_owned(),
            source,
        },
    }
}

/// [`find_sites`] over the image's bytes, `data`.
pub fn sites_in(image: &Path, data: &[u8], api: &[Entry]) -> Result<Vec<Site>, AttachError> {
    let parse_err = |reason: String| AttachError::Parse {
        path: image.to_owned(),
        reason,
    };
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let elf = Elf::parse(image, data)?;
        search(&elf, image, api)
    }));
    caught.unwrap_or_else(|panic| {
        Err(parse_err(format!(
            "parser panicked: {}",
            panic_text(&*panic)
        )))
    })
}

/// The search of [`find_sites`] in a parsed image.
fn search(elf: &Elf<'_>, image: &Path, api: &[Entry]) -> Result<Vec<Site>, AttachError> {
    let parse_err = |reason: String| AttachError::Parse {
        path: image.to_owned(),
        reason,
    };
    let mut functions = elf.functions(api.iter().map(|e| e.name.as_str()));
    static_image::complete(&elf.file, elf.data, image, api, &mut functions)?;
    let mut sites: Vec<Site> = Vec::new();
    let mut allocs: Vec<(&Entry, u64)> = Vec::new();
    let got_tails = elf.got_tails();
    let frees: Vec<u64> = api
        .iter()
        .filter(|e| e.role == Role::Free)
        .filter_map(|e| functions.get(e.name.as_bytes()).copied())
        .collect();
    let splits = split_frees(elf, &frees);
    for entry in api {
        let (name, kind) = (entry.name.as_str(), entry.kind);
        let Some(&vaddr) = functions.get(name.as_bytes()) else {
            continue;
        };
        let Some(role) = own_role(entry, &sites) else {
            continue;
        };
        if let Some(split) = splits.get(&vaddr).filter(|_| role == Role::Free) {
            if !sites
                .iter()
                .any(|s| s.symbol != name && s.offset == split.fast.vaddr)
            {
                sites.extend(split_sites(elf, image, entry, vaddr, split));
            }
            continue;
        }
        if role == Role::Free
            && tail_target(elf, &got_tails, vaddr)
                .is_some_and(|to| to != vaddr && frees.contains(&to))
        {
            // A tail call of another free (mimalloc's mi_free_size jumps
            // to mi_free, jemalloc's aligned delete to free): its probe
            // sees the call, one record.
            continue;
        }
        let Some(entry_off) = elf.code_offset(vaddr) else {
            return Err(parse_err(format!(
                "{name} at {vaddr:#x} is in no executable segment"
            )));
        };
        if sites.iter().any(|s| s.offset - s.skipped == entry_off) {
            continue; // an alias of a site we have
        }
        // endbr64 only marks an indirect-branch target: the probe can go
        // after it, where the return address is still on top of the stack.
        let mut skipped = 0;
        if elf.bytes_at(entry_off, 4) == Some(&ENDBR64[..]) {
            skipped = 4;
        }
        if role == Role::Free {
            skipped += vaddr
                .checked_add(skipped)
                .and_then(|at| elf.null_test_len(at))
                .unwrap_or(0);
        }
        let mut abi = entry.abi;
        let prefix = elf
            .code_at(entry_off + skipped, HARMLESS_WINDOW)
            .and_then(harmless_prefix);
        if let Some(prefix) = prefix {
            if let Some(moved) = prefix.relocate(role, abi) {
                abi = moved;
                skipped += prefix.len as u64;
            }
        }
        let offset = entry_off + skipped;
        if !elf.is_instruction(offset) {
            return Err(parse_err(format!(
                "{name} at {vaddr:#x}: no instruction at file offset {offset:#x}"
            )));
        }
        let emulated = elf.code_at(offset, 16).is_some_and(is_emulated);
        sites.push(Site {
            image: image.to_owned(),
            symbol: name.to_owned(),
            role,
            kind,
            abi,
            offset,
            skipped,
            emulated,
            hit_slot: None,
        });
        if role == Role::Alloc {
            allocs.push((entry, vaddr));
        }
    }
    add_return_sites(elf, image, &got_tails, &allocs, &mut sites);
    sites.extend(usdt::find_markers(elf, image));
    Ok(sites)
}

/// The frees at `frees` split past their NULL test (see [`free_sites`]).
fn split_frees(elf: &Elf<'_>, frees: &[u64]) -> std::collections::HashMap<u64, free_sites::Split> {
    let candidates: Vec<u64> = frees
        .iter()
        .copied()
        .filter(|&at| {
            let skip = if elf.code_offset(at).and_then(|o| elf.bytes_at(o, 4)) == Some(&ENDBR64[..])
            {
                4
            } else {
                0
            };
            elf.null_test_len(at + skip).is_none()
        })
        .collect();
    if candidates.is_empty() {
        return std::collections::HashMap::new();
    }
    let code = |at: u64| elf.code_offset(at).and_then(|o| elf.code_at(o, 16));
    let emulated = |at: u64| code(at).is_some_and(is_emulated);
    let fdes = elf.fde_ranges();
    let fde_start = |at: u64| fdes.binary_search_by_key(&at, |&(start, _)| start).is_ok();
    let referrers = |targets: &[u64]| elf.referrers(targets);
    free_sites::split(&code, &emulated, &fde_start, &referrers, &candidates)
}

/// The sites of a free split in two (its slow path's with the first free
/// of those sharing it).
fn split_sites(
    elf: &Elf<'_>,
    image: &Path,
    entry: &Entry,
    vaddr: u64,
    split: &free_sites::Split,
) -> Vec<Site> {
    let site = |at: &free_sites::FreeSite| {
        let offset = elf.code_offset(at.vaddr)?;
        Some(Site {
            image: image.to_owned(),
            symbol: entry.name.clone(),
            role: Role::Free,
            kind: entry.kind,
            abi: api::Abi {
                ptr: (at.ptr != 0).then_some(at.ptr),
                sp_adjust: at.sp_adjust,
                free_split: true,
                free_cond: at.cond,
                ..entry.abi
            },
            offset,
            skipped: at.vaddr.wrapping_sub(vaddr),
            emulated: elf.code_at(offset, 16).is_some_and(is_emulated),
            hit_slot: None,
        })
    };
    std::iter::once(&split.fast)
        .chain(split.slow.as_ref())
        .filter_map(site)
        .collect()
}

/// Adds the return sites of the allocating functions `allocs` found in
/// `image` to `sites` (see [`returns`]); an allocator's operator new whose
/// returns cannot all be found goes back to capturing its stack only (no
/// kernel return probe on it: an exception thrown out of it could not
/// unwind).
fn add_return_sites(
    elf: &Elf<'_>,
    image: &Path,
    tails: &std::collections::HashMap<u64, returns::Tail>,
    allocs: &[(&Entry, u64)],
    sites: &mut Vec<Site>,
) {
    if allocs.is_empty() {
        return;
    }
    let ends = elf.function_ends(&allocs.iter().map(|&(_, at)| at).collect::<Vec<_>>());
    let fdes = elf.fde_ranges();
    for &(entry, vaddr) in allocs {
        let end = ends.get(&vaddr).copied();
        let returns = return_sites_of(elf, image, tails, &fdes, entry, vaddr, end);
        if returns.is_empty() && entry.role == Role::New {
            for site in sites.iter_mut().filter(|s| s.symbol == entry.name) {
                site.role = Role::New;
            }
        }
        sites.extend(returns);
    }
}

/// Where the function at `vaddr` goes if it starts with a tail jump
/// (after `endbr64`): the jump's target, through a PLT stub's GOT slot
/// where the image defines the function it names.
fn tail_target(
    elf: &Elf<'_>,
    tails: &std::collections::HashMap<u64, returns::Tail>,
    vaddr: u64,
) -> Option<u64> {
    let code = |at: u64| elf.code_at(elf.code_offset(at)?, 16);
    let decode = |at: u64| Some(Decoder::with_ip(64, code(at)?, at, DecoderOptions::NONE).decode());
    let mut insn = decode(vaddr)?;
    if insn.mnemonic() == Mnemonic::Endbr64 {
        insn = decode(insn.next_ip())?;
    }
    if insn.mnemonic() != Mnemonic::Jmp || insn.op0_kind() == OpKind::Memory {
        return None;
    }
    let to = insn.near_branch_target();
    match returns::stub_slot(&code, to) {
        Some(slot) => match tails.get(&slot) {
            Some(returns::Tail::Jump(at)) => Some(*at),
            _ => None,
        },
        None => Some(to),
    }
}

/// The role `entry` takes in an image whose sites so far are `sites`
/// (the allocator's C API comes first in [`api::all`]): C++ `operator new`
/// and `delete` of an image with an allocator of its own (jemalloc,
/// tcmalloc, mimalloc) call no probed malloc or free, so they allocate and
/// free themselves (issue 41); elsewhere (libstdc++, libc++) new only
/// captures its stack for the malloc it calls, and delete, which calls
/// free, is not probed (None).
fn own_role(entry: &Entry, sites: &[Site]) -> Option<Role> {
    let own_allocator = || sites.iter().any(|s| s.role == Role::Alloc);
    match entry.role {
        Role::New if own_allocator() => Some(Role::Alloc),
        Role::Free if api::is_delete(&entry.name) && !own_allocator() => None,
        role => Some(role),
    }
}

/// The return sites of allocating function `entry` at `vaddr` (see
/// [`returns`]), as sites; none where they cannot all be found (the
/// function then takes a kernel return probe).
fn return_sites_of(
    elf: &Elf<'_>,
    image: &Path,
    tails: &std::collections::HashMap<u64, returns::Tail>,
    fdes: &[(u64, u64)],
    entry: &Entry,
    vaddr: u64,
    end: Option<u64>,
) -> Vec<Site> {
    // MEMTRAIL_RETURN_SITES=0: kernel return probes (tests of their
    // check, and a way back should a return site ever read wrong).
    if std::env::var_os("MEMTRAIL_RETURN_SITES").is_some_and(|v| v == "0") {
        return Vec::new();
    }
    let code = |at: u64| elf.code_offset(at).and_then(|o| elf.code_at(o, 16));
    let emulated = |at: u64| code(at).is_some_and(is_emulated);
    let got = |slot: u64| tails.get(&slot).copied();
    // The function holding an address: its FDE's range, else (the entry's
    // own code without one) its symbol's.
    let function = |at: u64| {
        let i = fdes.partition_point(|&(start, _)| start <= at);
        i.checked_sub(1)
            .map(|i| fdes[i])
            .filter(|&(_, end)| at < end)
            .or_else(|| {
                end.map(|end| (vaddr, end))
                    .filter(|r| (r.0..r.1).contains(&at))
            })
    };
    let found = returns::return_sites(&code, &emulated, &got, &function, vaddr, entry.abi.out_ptr);
    let found = match found {
        Ok(found) => found,
        Err(why) => {
            tracing::debug!(image = %image.display(), function = entry.name, %why,
                "no return sites: a kernel return probe");
            return Vec::new();
        }
    };
    tracing::debug!(image = %image.display(), function = entry.name, sites = found.len(),
        on_ret = found.iter().filter(|r| r.on_ret).count(), "return sites");
    tracing::trace!(function = entry.name, ?found, "return sites");
    let sites: Option<Vec<Site>> = found
        .into_iter()
        .map(|r| {
            Some(Site {
                image: image.to_owned(),
                symbol: entry.name.clone(),
                role: Role::Return(r),
                kind: entry.kind,
                abi: entry.abi,
                offset: elf.code_offset(r.vaddr)?,
                skipped: r.vaddr.wrapping_sub(vaddr),
                emulated: !r.on_ret,
                hit_slot: None,
            })
        })
        .collect();
    sites.unwrap_or_default()
}

struct Elf<'a> {
    file: object::File<'a>,
    data: &'a [u8],
}

/// `p_flags` of an executable segment.
const PF_X: u32 = 1;

impl<'a> Elf<'a> {
    /// `data` as an x86-64 ELF image.
    fn parse(image: &Path, data: &'a [u8]) -> Result<Self, AttachError> {
        if !data.starts_with(b"\x7fELF") {
            return Err(AttachError::NotElf {
                path: image.to_owned(),
            });
        }
        let parse_err = |reason: String| AttachError::Parse {
            path: image.to_owned(),
            reason,
        };
        let file = object::File::parse(data).map_err(|e| parse_err(e.to_string()))?;
        if file.architecture() != object::Architecture::X86_64 || !file.is_64() {
            return Err(parse_err(format!(
                "not an x86-64 image ({:?}, {}-bit)",
                file.architecture(),
                if file.is_64() { 64 } else { 32 }
            )));
        }
        Ok(Self { file, data })
    }

    /// The addresses of the functions named in `names` the image defines,
    /// by name: the dynamic symbol where there is one, else the symbol
    /// table's; the first of a name in each. One pass over each table (a
    /// search per name took 100 ms on cc1's 33 MB).
    fn functions<'n>(
        &self,
        names: impl IntoIterator<Item = &'n str>,
    ) -> std::collections::HashMap<&'n [u8], u64> {
        let wanted: std::collections::HashSet<&'n [u8]> =
            names.into_iter().map(str::as_bytes).collect();
        let mut found = std::collections::HashMap::new();
        // The dynamic table first: a name it defines keeps its address.
        for sym in self.file.dynamic_symbols().chain(self.file.symbols()) {
            if !sym.is_definition() || sym.kind() != object::SymbolKind::Text {
                continue;
            }
            let Ok(name) = sym.name_bytes() else { continue };
            if let Some(&name) = wanted.get(name) {
                found.entry(name).or_insert(sym.address());
            }
        }
        found
    }

    /// The ends (address + size) of the function symbols at `addrs`, from
    /// the dynamic symbols or the symbol table: one pass over each.
    fn function_ends(&self, addrs: &[u64]) -> std::collections::HashMap<u64, u64> {
        let mut ends = std::collections::HashMap::new();
        for sym in self.file.dynamic_symbols().chain(self.file.symbols()) {
            if sym.is_definition()
                && sym.kind() == object::SymbolKind::Text
                && sym.size() > 0
                && addrs.contains(&sym.address())
            {
                if let Some(end) = sym.address().checked_add(sym.size()) {
                    ends.entry(sym.address()).or_insert(end);
                }
            }
        }
        ends
    }

    /// The address ranges of the image's functions as its `.eh_frame`
    /// describes them (one per FDE, sorted): where code a call returns
    /// to ends, stripped images included. Bounded like the unwinder's
    /// reading: entries past a malformed one are left out.
    fn fde_ranges(&self) -> Vec<(u64, u64)> {
        use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
        use object::ObjectSection;
        let Some(section) = self.file.section_by_name(".eh_frame") else {
            return Vec::new();
        };
        let Ok(bytes) = section.data() else {
            return Vec::new();
        };
        let addr_of = |name: &str| self.file.section_by_name(name).map_or(0, |s| s.address());
        let eh = EhFrame::new(bytes, LittleEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame(section.address())
            .set_text(addr_of(".text"))
            .set_got(addr_of(".got"));
        let mut ranges = Vec::new();
        let mut entries = eh.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let Ok(fde) = partial.parse(|eh, bases, offset| eh.cie_from_offset(bases, offset))
            else {
                continue;
            };
            let start = fde.initial_address();
            if let Some(end) = start.checked_add(fde.len()) {
                ranges.push((start, end));
            }
        }
        ranges.sort_unstable();
        ranges
    }

    /// Where jumps through the image's GOT slots go, by slot address, for
    /// the slots [`returns`] can follow: a function the image defines
    /// (not an IFUNC, whose symbol is its resolver), or `memset`, `memcpy`
    /// or `memmove`, which return their first argument (an IFUNC's
    /// IRELATIVE slot names its resolver's address: glibc's own calls).
    fn got_tails(&self) -> std::collections::HashMap<u64, returns::Tail> {
        use object::{ObjectSymbolTable, RelocationTarget, SymbolFlags};
        const FIRST_ARG: [&[u8]; 3] = [b"memset", b"memcpy", b"memmove"];
        const STT_GNU_IFUNC: u8 = 10;
        let mut tails = std::collections::HashMap::new();
        let (Some(relocs), Some(dynsym)) = (
            self.file.dynamic_relocations(),
            self.file.dynamic_symbol_table(),
        ) else {
            return tails;
        };
        let ifunc = |sym: &object::Symbol<'_, '_>| matches!(sym.flags(), SymbolFlags::Elf { st_info, .. } if st_info & 0xf == STT_GNU_IFUNC);
        for (slot, reloc) in relocs {
            let tail = match reloc.target() {
                RelocationTarget::Symbol(index) => {
                    let Ok(sym) = dynsym.symbol_by_index(index) else {
                        continue;
                    };
                    let name = sym.name_bytes().unwrap_or_default();
                    if FIRST_ARG.contains(&name) {
                        returns::Tail::ReturnsFirstArg
                    } else if sym.is_definition()
                        && sym.kind() == object::SymbolKind::Text
                        && !ifunc(&sym)
                    {
                        returns::Tail::Jump(sym.address())
                    } else {
                        continue;
                    }
                }
                RelocationTarget::Absolute => {
                    let resolver = reloc.addend() as u64;
                    let named = self.file.dynamic_symbols().any(|sym| {
                        sym.address() == resolver
                            && FIRST_ARG.contains(&sym.name_bytes().unwrap_or_default())
                    });
                    if !named {
                        continue;
                    }
                    returns::Tail::ReturnsFirstArg
                }
                _ => continue,
            };
            tails.insert(slot, tail);
        }
        tails
    }

    /// The file offset of address `vaddr`, through the loadable segment
    /// that holds it and has it in the file; None outside them (and where
    /// the headers' numbers overflow or point past the end of the file).
    fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.offset_in(vaddr, |_| true)
    }

    /// [`file_offset`](Self::file_offset) through executable segments
    /// only: where a probe may go.
    fn code_offset(&self, vaddr: u64) -> Option<u64> {
        self.offset_in(vaddr, |seg| match seg.flags() {
            object::SegmentFlags::Elf { p_flags } => p_flags & PF_X != 0,
            _ => false,
        })
    }

    fn offset_in(
        &self,
        vaddr: u64,
        keep: impl Fn(&object::Segment<'a, '_>) -> bool,
    ) -> Option<u64> {
        self.file.segments().filter(keep).find_map(|seg| {
            let (start, (file_off, file_len)) = (seg.address(), seg.file_range());
            let into = vaddr.checked_sub(start)?;
            if into >= seg.size() || into >= file_len {
                return None;
            }
            let offset = file_off.checked_add(into)?;
            (offset < self.data.len() as u64).then_some(offset)
        })
    }

    fn bytes_at(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        self.data.get(start..start.checked_add(len)?)
    }

    /// Up to `max` bytes of code at `offset` (fewer at the end of the file).
    fn code_at(&self, offset: u64, max: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let rest = self.data.get(start..)?;
        Some(&rest[..rest.len().min(max)])
    }

    /// Whether a whole, valid x86-64 instruction starts at file offset
    /// `offset` (a probe needs one: the kernel refuses the link otherwise).
    fn is_instruction(&self, offset: u64) -> bool {
        self.code_at(offset, 16).is_some_and(|code| {
            let insn = Decoder::new(64, code, DecoderOptions::NONE).decode();
            !insn.is_invalid()
        })
    }

    /// Length of an opening `test %rdi,%rdi; je <ret>` at `vaddr`: the probe
    /// can go after it without missing any call but free(NULL).
    /// For each of `targets`, the ends of the instructions in executable
    /// segments whose 32-bit displacement (any instruction's: a byte
    /// sequence that is no instruction errs on the safe side) or short
    /// jump reaches it, and u64::MAX where the image holds its address as
    /// an aligned 64-bit word anywhere (a pointer, a relocation's addend, a
    /// symbol's value). A displacement of 0 is left out: it names the
    /// next instruction (padding's zeros end right before a target).
    fn referrers(&self, targets: &[u64]) -> free_sites::Referrers {
        let mut out: std::collections::HashMap<u64, Vec<u64>> = std::collections::HashMap::new();
        for seg in self.file.segments() {
            let object::SegmentFlags::Elf { p_flags } = seg.flags() else {
                continue;
            };
            let Ok(bytes) = seg.data() else { continue };
            if p_flags & PF_X == 0 {
                continue;
            }
            let base = seg.address();
            for (i, w) in bytes.windows(4).enumerate() {
                let end = base + i as u64 + 4;
                let rel = i64::from(i32::from_le_bytes([w[0], w[1], w[2], w[3]]));
                let to = end.wrapping_add_signed(rel);
                if rel != 0 && targets.contains(&to) {
                    out.entry(to).or_default().push(end);
                }
                let short = i > 0 && (bytes[i - 1] == 0xeb || bytes[i - 1] & 0xf0 == 0x70);
                let end = base + i as u64 + 1;
                let to = end.wrapping_add_signed(i64::from(w[0] as i8));
                if short && w[0] != 0 && targets.contains(&to) {
                    out.entry(to).or_default().push(end);
                }
            }
        }
        for w in self.data.chunks_exact(8) {
            let word = u64::from_le_bytes(w.try_into().unwrap_or_default());
            if targets.contains(&word) {
                out.entry(word).or_default().push(u64::MAX);
            }
        }
        out
    }

    fn null_test_len(&self, vaddr: u64) -> Option<u64> {
        let code = self.code_at(self.file_offset(vaddr)?, HARMLESS_WINDOW)?;
        let mut decoder = Decoder::with_ip(64, code, vaddr, DecoderOptions::NONE);
        let test = decoder.decode();
        let is_rdi =
            |i: u32| test.op_kind(i) == OpKind::Register && test.op_register(i) == Register::RDI;
        if test.mnemonic() != Mnemonic::Test || !is_rdi(0) || !is_rdi(1) {
            return None;
        }
        let je = decoder.decode();
        if je.mnemonic() != Mnemonic::Je {
            return None;
        }
        let target = self.code_at(self.file_offset(je.near_branch_target())?, 16)?;
        let ret = Decoder::new(64, target, DecoderOptions::NONE).decode();
        (ret.mnemonic() == Mnemonic::Ret && ret.op_count() == 0).then(|| decoder.position() as u64)
    }
}

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Bytes of code examined for a harmless prefix.
const HARMLESS_WINDOW: usize = 128;
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
struct Prefix {
    len: usize,
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
    fn relocate(&self, role: Role, abi: Abi) -> Option<Abi> {
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
fn harmless_prefix(code: &[u8]) -> Option<Prefix> {
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

/// Whether the kernel emulates the instruction at the start of `code`
/// instead of single-stepping it, by the rules of x86's
/// `arch_uprobe_analyze_insn` (arch/x86/kernel/uprobes.c, Linux 6.x):
/// `branch_setup_xol_ops` takes the kernel's own nops (`x86_nops`: `nop`,
/// `66 90`, and the `nopl`/`nopw` forms it pads code with, up to 8 bytes),
/// `nop` (0x90) whatever its prefixes, `jmp rel8/rel32`, `call rel32` and
/// the conditional jumps (short and near) unless a 0x66 prefix comes with
/// them; `push_setup_xol_ops` takes `push reg` alone or with the REX
/// prefix 0x41 only. Everything else (`ret`, other `nopl` encodings,
/// `sub`, `mov`, ...) is single-stepped out of line, or refused (a
/// 0x2e/0x3e/0x26/0x36 or lock prefix). Linux 6.18 checked on this
/// machine: a single-stepped probe maps the `[uprobes]` page into the
/// process, an emulated one does not (`tests/attach.rs`).
fn is_emulated(code: &[u8]) -> bool {
    /// The kernel's `x86_nops` (`p6_nops`), 2 to 8 bytes long.
    const X86_NOPS: [&[u8]; 7] = [
        &[0x66, 0x90],
        &[0x0f, 0x1f, 0x00],
        &[0x0f, 0x1f, 0x40, 0x00],
        &[0x0f, 0x1f, 0x44, 0x00, 0x00],
        &[0x66, 0x0f, 0x1f, 0x44, 0x00, 0x00],
        &[0x0f, 0x1f, 0x80, 0x00, 0x00, 0x00, 0x00],
        &[0x0f, 0x1f, 0x84, 0x00, 0x00, 0x00, 0x00, 0x00],
    ];
    if X86_NOPS.iter().any(|nop| code.starts_with(nop)) {
        return true;
    }
    const LEGACY: [u8; 11] = [
        0x66, 0x67, 0xf2, 0xf3, 0x2e, 0x3e, 0x26, 0x36, 0x64, 0x65, 0xf0,
    ];
    let mut at = 0;
    while code.get(at).is_some_and(|b| LEGACY.contains(b)) && at < 14 {
        at += 1;
    }
    let legacy = &code[..at];
    if legacy
        .iter()
        .any(|p| matches!(p, 0x2e | 0x3e | 0x26 | 0x36 | 0xf0))
    {
        return false; // is_prefix_bad: refused
    }
    let rex = code.get(at).copied().filter(|b| b & 0xf0 == 0x40);
    let op = &code[(at + usize::from(rex.is_some())).min(code.len())..];
    let no_66 = !legacy.contains(&0x66);
    match op {
        [0x90, ..] => true,
        [0xe8 | 0xe9 | 0xeb, ..] | [0x70..=0x7f, ..] | [0x0f, 0x80..=0x8f, ..] => no_66,
        [0x50..=0x57, ..] => legacy.is_empty() && matches!(rex, None | Some(0x41)),
        _ => false,
    }
}

/// Probe links; dropping them detaches the probes.
///
/// Each detach waits for an RCU grace period in the kernel (~0.1 s here), so
/// the links are dropped in parallel rather than one after the other.
#[derive(Default)]
pub struct Links {
    libbpf: Vec<Link>,
    fds: Vec<OwnedFd>,
}

impl Links {
    pub fn push(&mut self, link: Link) {
        self.libbpf.push(link);
    }

    pub fn push_fd(&mut self, link: OwnedFd) {
        self.fds.push(link);
    }

    pub fn len(&self) -> usize {
        self.libbpf.len() + self.fds.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Moves `other`'s links into `self`.
    pub fn append(&mut self, other: &mut Links) {
        self.libbpf.append(&mut other.libbpf);
        self.fds.append(&mut other.fds);
    }
}

impl Drop for Links {
    fn drop(&mut self) {
        fn spawn_drop<'s, T: Send + 's>(scope: &'s std::thread::Scope<'s, '_>, item: T) {
            // A thread that cannot start drops its link right here.
            if let Err(err) = std::thread::Builder::new().spawn_scoped(scope, move || drop(item)) {
                tracing::debug!(%err, "detaching serially");
            }
        }
        std::thread::scope(|scope| {
            for link in self.libbpf.drain(..) {
                spawn_drop(scope, link);
            }
        });
        // A few hundred at a time: a storm of exits with per-process
        // probes hands over thousands.
        let mut fds = std::mem::take(&mut self.fds);
        while !fds.is_empty() {
            let rest = fds.split_off(fds.len().min(256));
            std::thread::scope(|scope| {
                for fd in fds.drain(..) {
                    spawn_drop(scope, fd);
                }
            });
            fds = rest;
        }
    }
}

/// The programs allocator sites take, as program fds (sendable to the
/// attach worker), and the USDT region markers'.
pub struct AllocPrograms {
    pub sites: SitePrograms,
    pub marker: OwnedFd,
    /// The program of the preload shim's hook ([`shim`]), with
    /// `--preload` only.
    pub shim: Option<ShimProgram>,
}

/// The program the preload shim's hook takes, how, and with which cookie.
pub struct ShimProgram {
    pub prog: OwnedFd,
    /// A session (`alloc_session`, cookie [`shim::HOOK_COOKIE`]: its entry
    /// asks for no return), or an entry (`shim_hook`, without sessions).
    pub kind: UprobeKind,
    pub cookie: u64,
}

/// The programs of allocator sites: one set of `bpf/memtrail.bpf.c`'s two
/// (see [`uprobe_sessions`]).
pub enum SitePrograms {
    /// `alloc_session`: entries and returns, one link per image.
    Session(OwnedFd),
    /// `alloc_enter` (allocating calls, C++ operator new and the libc
    /// syscall wrappers, told apart by the cookie), `alloc_return` and
    /// `free_enter`: a link each per image.
    Split {
        enter: OwnedFd,
        ret: OwnedFd,
        free: OwnedFd,
    },
}

/// The first Linux release with uprobe sessions (`uprobe.session`).
const UPROBE_SESSION: (u32, u32) = (6, 13);

/// Whether allocator sites are probed through one uprobe session program
/// (Linux 6.13 and later, unless `MEMTRAIL_UPROBE_SESSION=0`): one link per
/// image instead of three. The kernel detaches links one after another,
/// each after RCU grace periods of its own: with three links for libc and
/// one for libstdc++, `memtrail run -- true` waited 49-71 ms for its
/// probes to go, with two 39-64 ms (perf/RESULTS.md).
pub fn uprobe_sessions() -> bool {
    std::env::var_os("MEMTRAIL_UPROBE_SESSION").is_none_or(|v| v != "0")
        && crate::sys::kernel_release() >= UPROBE_SESSION
}

impl AllocPrograms {
    /// memtrail's own allocator programs: the session program if
    /// `session`, else the three split ones (whichever set was loaded),
    /// and the preload shim's if `preload` (loaded then only).
    pub fn memtrail(skel: &MemtrailSkel<'_>, session: bool, preload: bool) -> io::Result<Self> {
        let p = &skel.progs;
        let dup = |fd: BorrowedFd<'_>| fd.try_clone_to_owned();
        let sites = if session {
            SitePrograms::Session(dup(p.alloc_session.as_fd())?)
        } else {
            SitePrograms::Split {
                enter: dup(p.alloc_enter.as_fd())?,
                ret: dup(p.alloc_return.as_fd())?,
                free: dup(p.free_enter.as_fd())?,
            }
        };
        Ok(Self {
            sites,
            marker: dup(p.region_marker.as_fd())?,
            shim: match (preload, session) {
                (false, _) => None,
                (true, true) => Some(ShimProgram {
                    prog: dup(p.alloc_session.as_fd())?,
                    kind: UprobeKind::Session,
                    cookie: shim::HOOK_COOKIE,
                }),
                (true, false) => Some(ShimProgram {
                    prog: dup(p.shim_hook.as_fd())?,
                    kind: UprobeKind::Entry,
                    cookie: 0,
                }),
            },
        })
    }
}

/// Attaches `progs` to every site of one image, with one uprobe_multi link
/// per program; each site's attach cookie is its kind and argument layout,
/// and its hit counter, handed out here by `slots`. The links detach when
/// dropped. Probes are system-wide: see [`link_sites`].
pub fn attach_sites(
    progs: &AllocPrograms,
    sites: &mut [Site],
    slots: &mut HitSlots,
    links: &mut Links,
) -> Result<(), AttachError> {
    slots.assign(sites);
    let Some(image) = sites.first().map(|s| s.image.clone()) else {
        return Ok(());
    };
    link_sites(progs, sites, &image, 0, links)
}

/// Attaches `progs` to `sites` (of one image, their hit counters handed
/// out), reaching the file through `path`: in every process with `pid` 0,
/// else only in process `pid`.
pub fn link_sites(
    progs: &AllocPrograms,
    sites: &[Site],
    path: &Path,
    pid: u32,
    links: &mut Links,
) -> Result<(), AttachError> {
    link_sites_with(progs, sites, path, pid, links, 0)
}

/// [`link_sites`], with `bits` or'ed into every site's cookie (the
/// preload shim's, [`shim::SHIM_COOKIE`]).
pub fn link_sites_with(
    progs: &AllocPrograms,
    sites: &[Site],
    path: &Path,
    pid: u32,
    links: &mut Links,
    bits: u64,
) -> Result<(), AttachError> {
    let of_role = |role: Role| {
        sites
            .iter()
            .filter(move |s| s.role == role)
            .collect::<Vec<_>>()
    };
    let (allocs, frees, markers) = (
        of_role(Role::Alloc),
        of_role(Role::Free),
        of_role(Role::Marker),
    );
    // Return sites, once per instruction (a function's tail code shared
    // with another's is read the same way by both).
    let mut at = std::collections::HashSet::new();
    let returns: Vec<&Site> = sites
        .iter()
        .filter(|s| matches!(s.role, Role::Return(_)) && at.insert(s.offset))
        .collect();
    let kret = kernel_returns(sites);
    // Every entry of alloc_enter in one link: allocating calls, their
    // return sites, operator new and the syscall wrappers (entry only;
    // their cookies tell them apart). With sessions, the frees too.
    let mut entries = allocs.clone();
    entries.extend(returns);
    entries.extend(of_role(Role::New));
    entries.extend(of_role(Role::Syscall));
    let groups: Vec<(BorrowedFd<'_>, UprobeKind, Vec<&Site>)> = match &progs.sites {
        SitePrograms::Session(prog) => {
            entries.extend(frees);
            vec![(prog.as_fd(), UprobeKind::Session, entries)]
        }
        SitePrograms::Split { enter, ret, free } => vec![
            (enter.as_fd(), UprobeKind::Entry, entries),
            (ret.as_fd(), UprobeKind::Return, kret.clone()),
            (free.as_fd(), UprobeKind::Entry, frees),
        ],
    };
    let markers = (progs.marker.as_fd(), UprobeKind::Entry, markers);
    let kret_bit = 1u64 << t::mt_cookie_layout::MT_CK_KRET_BIT.0;
    for (prog, kind, group) in groups.into_iter().chain([markers]) {
        if group.is_empty() {
            continue;
        }
        let offsets: Vec<u64> = group.iter().map(|s| s.offset).collect();
        let cookies: Vec<u64> = group
            .iter()
            .map(|s| {
                let kret = kret.iter().any(|k| std::ptr::eq(*k, *s));
                s.cookie() | bits | if kret { kret_bit } else { 0 }
            })
            .collect();
        let link = crate::sys::uprobe_multi(prog, path, &offsets, &cookies, kind, pid)
            .map_err(|err| uprobe_error(&group, err))?;
        links.push_fd(link);
    }
    Ok(())
}

/// The allocating sites of `sites` whose results come through a kernel
/// return probe: those without return sites of their name (see
/// [`returns`]: their code could not be followed to every return).
pub fn kernel_returns(sites: &[Site]) -> Vec<&Site> {
    sites
        .iter()
        .filter(|s| {
            s.role == Role::Alloc
                && !sites.iter().any(|r| {
                    matches!(r.role, Role::Return(_)) && r.symbol == s.symbol && r.image == s.image
                })
        })
        .collect()
}

fn uprobe_error(group: &[&Site], source: crate::sys::SysError) -> AttachError {
    let names = group
        .iter()
        .map(|s| s.symbol.as_str())
        .collect::<Vec<_>>()
        .join(", ");
    let image = group.first().map(|s| s.image.clone()).unwrap_or_default();
    if source.errno() == Some(libc::EINVAL)
        && crate::sys::kernel_log_tail(64 * 1024).contains("ref_ctr_offset mismatch")
    {
        return AttachError::Conflict {
            path: image,
            symbol: names,
        };
    }
    AttachError::Uprobe {
        path: image,
        symbol: names,
        source,
    }
}

impl From<&Site> for ProbeEntry {
    fn from(site: &Site) -> Self {
        Self {
            image: site.image.display().to_string(),
            symbol: match site.role {
                Role::Return(_) => site.name(),
                _ => site.symbol.clone(),
            },
            offset: site.offset,
            emulated: site.emulated,
            hits: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::api::{COUNT_SIZE, REALLOC_N, SIZE0, SIZE1};
    use super::{Abi, HitSlots, MAX_COUNTED_SITES, Role, Site, harmless_prefix, is_emulated};
    use crate::bpf::record::Kind;

    /// Check that hit counters are handed out once each, in order, across
    /// calls (images attached one after another), up to the last one; a
    /// site past it is not counted, and its cookie says so (0 in bits
    /// 48-63) while keeping its kind and layout.
    #[test]
    fn attach_hit_slots_bounded() {
        let site = Site {
            image: "/lib/libc.so.6".into(),
            symbol: "malloc".into(),
            role: Role::Alloc,
            kind: Kind::Malloc,
            abi: SIZE0,
            offset: 0x1000,
            skipped: 0,
            emulated: true,
            hit_slot: None,
        };
        let layout = site.cookie();
        assert_eq!(layout >> 48, 0);
        let mut slots = HitSlots::default();
        let mut first = vec![site.clone(); 3];
        slots.assign(&mut first);
        let got: Vec<_> = first.iter().map(|s| s.hit_slot).collect();
        assert_eq!(got, [Some(0), Some(1), Some(2)]);
        assert_eq!(first[2].cookie(), layout | 3 << 48);
        let mut rest = vec![site.clone(); MAX_COUNTED_SITES as usize];
        slots.assign(&mut rest);
        assert_eq!(
            rest[MAX_COUNTED_SITES as usize - 4].hit_slot,
            Some(MAX_COUNTED_SITES - 1)
        );
        assert_eq!(
            rest[MAX_COUNTED_SITES as usize - 4].cookie(),
            layout | u64::from(MAX_COUNTED_SITES) << 48
        );
        assert!(
            rest[MAX_COUNTED_SITES as usize - 3..]
                .iter()
                .all(|s| s.hit_slot.is_none())
        );
        assert_eq!(rest[MAX_COUNTED_SITES as usize - 1].cookie(), layout);
    }

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

    /// Check the instructions the kernel emulates against x86's
    /// `arch_uprobe_analyze_insn` (issue 22): push, the kernel's nops,
    /// relative jumps and calls; never `ret`, another `nopl` encoding, a
    /// 0x66-prefixed branch or a `push` with another REX prefix.
    #[test]
    fn attach_emulated_instructions_as_the_kernel() {
        let emulated: &[&[u8]] = &[
            &[0x53],
            &[0x41, 0x57],
            &[0x55],
            &[0x90],
            &[0x66, 0x90],
            &[0xe8, 0, 0, 0, 0],
            &[0xe9, 0, 0, 0, 0],
            &[0xeb, 0],
            &[0x74, 0],
            &[0x0f, 0x87, 0, 0, 0, 0],
            &[0xf2, 0xe9, 0, 0, 0, 0], // bnd jmp
        ];
        for code in emulated {
            assert!(is_emulated(code), "{code:02x?}");
        }
        for nop in [
            &[0x0f, 0x1f, 0x44, 0, 0][..],
            &[0x0f, 0x1f, 0x40, 0],
            &[0x66, 0x0f, 0x1f, 0x44, 0, 0],
            &[0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0],
        ] {
            assert!(is_emulated(nop), "{nop:02x?}");
        }
        let stepped: &[&[u8]] = &[
            &[0xc3],
            &[0x0f, 0x1f, 0x44, 0, 8],
            &[0x0f, 0x1f, 0x40, 1],
            &[0x66, 0x2e, 0x0f, 0x1f, 0x84, 0, 0, 0, 0, 0],
            &[0x66, 0xe8, 0, 0],
            &[0x66, 0x74, 0],
            &[0x48, 0x53],
            &[0x66, 0x53],
            &[0x3e, 0x74, 0], // branch hint: refused
            &[0x48, 0x83, 0xec, 0x08],
            &[0xff, 0xe0],
            &[],
        ];
        for code in stepped {
            assert!(!is_emulated(code), "{code:02x?}");
        }
    }
}
