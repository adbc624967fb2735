//! Finding allocator entry points in an image and attaching the probes.
//!
//! An allocator site is a (file, offset) where a probe goes, with the kind
//! of call the BPF side reports (the attach cookie). Several symbols can name
//! one address (glibc's `free`/`cfree`, `memalign`/`aligned_alloc`): a site is
//! attached once per address, under the first name in [`api::libc`] order.
//!
//! Probe placement matters for cost: the kernel emulates some first
//! instructions (push, nop, jumps) at ~0.4 µs a hit, and single-steps the
//! others (test, cmp, mov) at ~14 µs. Where semantics allow we move the probe
//! to an emulated instruction — glibc's `free` opens with
//! `test %rdi,%rdi; je <ret>`, which only skips free(NULL), so its probe goes
//! right after the jump; and a probe moves past leading instructions that
//! cannot change what the programs read (flags-only tests and compares, a
//! constant into a register that holds no argument) when that lands it on
//! an emulated one: libstdc++'s `operator new` opens with
//! `test %rdi,%rdi; mov $1,%eax; push %rbx`, glibc's `valloc` with
//! `cmpb $0,hook(%rip); push %rbx`, its `memalign` with
//! `cmpb $0,hook(%rip); je` (the probe goes on the jump, which every call
//! reaches, never past it); jemalloc's and tcmalloc's `malloc` likewise.
//! A prefix may move an argument to another argument register (mimalloc's
//! `malloc` copies its size from rdi to rsi, then loads its heap into rdi):
//! the site's [`Abi`] then names where the argument is at the probe. Sites
//! that still single-step are reported.
//!
//! Probes are system-wide (every process mapping the file hits them); the
//! BPF programs filter on the tracked-process map.

pub mod api;
pub mod cache;
pub mod usdt;
pub mod worker;

use std::fmt;
use std::fs;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use libbpf_rs::Link;
use object::{Object, ObjectSegment, ObjectSymbol};

pub use api::{Abi, Entry, Role};

use crate::record::Kind;
use crate::skel::memtrail::MemtrailSkel;

/// A path read from `/proc/PID/map_files` or `/proc/PID/exe`, without the
/// ` (deleted)` the kernel appends for an unlinked file.
pub fn strip_deleted(path: PathBuf) -> PathBuf {
    match path.to_str().and_then(|p| p.strip_suffix(" (deleted)")) {
        Some(p) => PathBuf::from(p),
        None => path,
    }
}

/// The key of an image in the BPF `known_images` map (`struct image_id`):
/// its device (kernel encoding) and inode.
pub fn image_key((dev, ino): (u64, u64)) -> [u8; 16] {
    let mut key = [0u8; 16];
    key[..8].copy_from_slice(&dev.to_ne_bytes());
    key[8..].copy_from_slice(&ino.to_ne_bytes());
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
    #[error("cannot parse ELF image {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("no libc mapping found in /proc/self/maps")]
    NoLibc,
    #[error(
        "attaching to {symbol} in {path} conflicts with another tracer's uprobe at the same \
         offset (the kernel log says `ref_ctr_offset mismatch`): stop the other tracer \
         (bpftrace, perf, a USDT-enabled profiler) and retry"
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
}

impl Site {
    /// The site's attach cookie: its kind and argument layout, and for
    /// operator new the flag that tells `alloc_enter` to only capture the
    /// stack; a region marker's is its own (`usdt::marker_cookie`).
    pub fn cookie(&self) -> u64 {
        match self.role {
            Role::Marker => usdt::marker_cookie(self),
            Role::New | Role::Syscall => {
                use crate::skel::memtrail::types::{mt_cookie_flags, mt_cookie_layout};
                let flag = if self.role == Role::New {
                    mt_cookie_flags::MT_CK_NEW.0
                } else {
                    mt_cookie_flags::MT_CK_SYSCALL.0
                };
                self.abi.cookie(self.kind)
                    | u64::from(flag) << mt_cookie_layout::MT_CK_FLAGS_SHIFT.0
            }
            _ => self.abi.cookie(self.kind),
        }
    }
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}+{:#x} ({})",
            self.symbol,
            self.skipped,
            self.image.display()
        )
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
pub fn find_sites(image: &Path, api: &[Entry]) -> Result<Vec<Site>, AttachError> {
    let data = fs::read(image).map_err(|source| AttachError::Read {
        path: image.to_owned(),
        source,
    })?;
    let parse_err = |reason: String| AttachError::Parse {
        path: image.to_owned(),
        reason,
    };
    let file = object::File::parse(&*data).map_err(|e| parse_err(e.to_string()))?;
    let elf = Elf {
        file: &file,
        data: &data,
    };
    let mut sites: Vec<Site> = Vec::new();
    for entry in api {
        let (name, kind) = (entry.name.as_str(), entry.kind);
        let Some(vaddr) = elf.function(name) else {
            continue;
        };
        let Some(entry_off) = elf.file_offset(vaddr) else {
            return Err(parse_err(format!(
                "{name} at {vaddr:#x} is in no loadable segment"
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
        if entry.role == Role::Free {
            skipped += elf.null_test_len(vaddr + skipped).unwrap_or(0);
        }
        let mut abi = entry.abi;
        let prefix = elf
            .bytes_at(entry_off + skipped, HARMLESS_WINDOW)
            .and_then(harmless_prefix);
        if let Some(prefix) = prefix {
            if let Some(moved) = prefix.relocate(entry.role, abi) {
                abi = moved;
                skipped += prefix.len as u64;
            }
        }
        let offset = entry_off + skipped;
        let emulated = elf.bytes_at(offset, 4).is_some_and(is_emulated);
        sites.push(Site {
            image: image.to_owned(),
            symbol: name.to_owned(),
            role: entry.role,
            kind,
            abi,
            offset,
            skipped,
            emulated,
        });
    }
    sites.extend(usdt::find_markers(&elf, image));
    Ok(sites)
}

struct Elf<'a> {
    file: &'a object::File<'a>,
    data: &'a [u8],
}

impl Elf<'_> {
    /// Address of the defined function `name` (dynamic symbols first, then
    /// the static table), preferring the default version of a symbol.
    fn function(&self, name: &str) -> Option<u64> {
        let matches = |sym: &object::Symbol<'_, '_>| {
            sym.is_definition()
                && sym.kind() == object::SymbolKind::Text
                && sym.name().is_ok_and(|n| n == name)
        };
        self.file
            .dynamic_symbols()
            .find(|s| matches(s))
            .or_else(|| self.file.symbols().find(|s| matches(s)))
            .map(|s| s.address())
    }

    fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.file.segments().find_map(|seg| {
            let (start, len) = (seg.address(), seg.size());
            let (file_off, file_len) = seg.file_range();
            (vaddr >= start && vaddr < start + len && vaddr - start < file_len)
                .then(|| file_off + (vaddr - start))
        })
    }

    fn bytes_at(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        self.data.get(start..start.checked_add(len)?)
    }

    /// Length of an opening `test %rdi,%rdi; je <ret>` at `vaddr`: the probe
    /// can go after it without missing any call but free(NULL).
    fn null_test_len(&self, vaddr: u64) -> Option<u64> {
        let code = self.bytes_at(self.file_offset(vaddr)?, 9)?;
        if code[..3] != [0x48, 0x85, 0xff] {
            return None;
        }
        let (len, rel) = match code[3] {
            0x74 => (5u64, i64::from(code[4] as i8)),
            0x0f if code[4] == 0x84 => (
                9u64,
                i64::from(i32::from_le_bytes(code[5..9].try_into().ok()?)),
            ),
            _ => return None,
        };
        let target = (vaddr + len).checked_add_signed(rel)?;
        let ret = self.bytes_at(self.file_offset(target)?, 2)?;
        (ret[0] == 0xc3 || ret == [0xf3, 0xc3]).then_some(len)
    }
}

const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// Bytes of code examined for a harmless prefix.
const HARMLESS_WINDOW: usize = 32;
/// Instructions a harmless prefix may have.
const HARMLESS_MAX: usize = 4;
/// The stack pointer, in ModRM numbering.
const RSP: u8 = 4;
/// The registers the programs read arguments 0, 1 and 2 from (rdi, rsi,
/// rdx), in ModRM numbering.
const ARG_REGS: [u8; 3] = [7, 6, 2];

/// Instructions at a function's start that a probe may be moved past: up
/// to [`HARMLESS_MAX`] of them, each one that every call executes (no
/// branch) and that writes neither the stack pointer nor memory, followed
/// by an instruction the kernel emulates. The probe then sees the stack of
/// the function's entry (the return address on top, which the uretprobe
/// replaces) and, in `holds`, where the entry's registers went.
#[derive(Debug, PartialEq, Eq)]
struct Prefix {
    len: usize,
    /// For each register (ModRM numbering, rax to rdi), which register's
    /// value at entry it holds after the prefix; None once overwritten.
    holds: [Option<u8>; 8],
}

impl Prefix {
    /// `abi` with each argument taken from where the prefix left it; None
    /// if the probe's program needs an argument the prefix overwrote.
    /// free's program reads its pointer from rdi; operator new's reads no
    /// argument.
    fn relocate(&self, role: Role, abi: Abi) -> Option<Abi> {
        let holds = |reg: u8, arg: u8| self.holds[usize::from(reg)] == Some(arg);
        let find = |i: u8| -> Option<u8> {
            let arg = *ARG_REGS.get(usize::from(i))?;
            std::iter::once(i)
                .chain(0..3)
                .find(|&j| holds(ARG_REGS[usize::from(j)], arg))
        };
        // Some(None) for an argument the ABI does not have.
        let find_opt = |i: Option<u8>| match i {
            None => Some(None),
            Some(i) => find(i).map(Some),
        };
        match role {
            Role::New | Role::Syscall | Role::Marker => Some(abi),
            Role::Free => holds(ARG_REGS[0], ARG_REGS[0]).then_some(abi),
            Role::Alloc => Some(Abi {
                size: find(abi.size)?,
                count: find_opt(abi.count)?,
                ptr: find_opt(abi.ptr)?,
                ..abi
            }),
        }
    }
}

/// Finds the harmless prefix at the start of `code`, if there is one.
/// Only forms seen at allocator entries are decoded; anything else ends
/// the search.
fn harmless_prefix(code: &[u8]) -> Option<Prefix> {
    let mut holds: [Option<u8>; 8] = std::array::from_fn(|r| Some(r as u8));
    let mut at = 0;
    for _ in 0..HARMLESS_MAX {
        if code.get(at..).is_some_and(is_emulated) {
            break;
        }
        let (len, dst, src) = decode_harmless(&code[at..])?;
        if let Some(dst) = dst {
            if dst == RSP {
                return None;
            }
            holds[usize::from(dst)] = src.and_then(|src| holds[usize::from(src)]);
        }
        at += len;
    }
    (at > 0 && code.get(at..).is_some_and(is_emulated)).then_some(Prefix { len: at, holds })
}

/// One instruction a harmless prefix may have: its length, the register
/// it writes (ModRM numbering) and, for a register-to-register move, the
/// register it copies.
fn decode_harmless(code: &[u8]) -> Option<(usize, Option<u8>, Option<u8>)> {
    let reg = |modrm: u8| (modrm >> 3) & 7;
    let rm = |modrm: u8| modrm & 7;
    let direct = |modrm: u8| modrm >> 6 == 3;
    Some(match *code {
        // test / cmp between registers: flags only.
        [0x48, 0x85 | 0x39 | 0x3b, m, ..] if direct(m) => (3, None, None),
        [0x85 | 0x39 | 0x3b, m, ..] if direct(m) => (2, None, None),
        // cmp $imm32 / $imm8, r64 (/7): flags only.
        [0x48, 0x81, m, _, _, _, _, ..] if m >> 3 == 0x1f => (7, None, None),
        [0x48, 0x83, m, _, ..] if m >> 3 == 0x1f => (4, None, None),
        // cmpb $imm8, disp32(%rip): reads memory, writes flags.
        [0x80, 0x3d, _, _, _, _, _, ..] => (7, None, None),
        // mov $imm32, r32 (zero-extends into r64).
        [op @ 0xb8..=0xbf, _, _, _, _, ..] => (5, Some(op - 0xb8), None),
        // xor r32, r32 (31: into r/m; 33: into reg).
        [0x31, m, ..] if direct(m) => (2, Some(rm(m)), None),
        [0x33, m, ..] if direct(m) => (2, Some(reg(m)), None),
        // mov r64, r64 (89: into r/m; 8b: into reg).
        [0x48, 0x89, m, ..] if direct(m) => (3, Some(rm(m)), Some(reg(m))),
        [0x48, 0x8b, m, ..] if direct(m) => (3, Some(reg(m)), Some(rm(m))),
        // mov disp32(%rip), r64: reads memory.
        [0x48, 0x8b, m, _, _, _, _, ..] if m & 0xc7 == 0x05 => (7, Some(reg(m)), None),
        // mov %fs:(reg), r64 (a thread-local load): reads memory.
        [0x64, 0x48, 0x8b, m, ..] if m >> 6 == 0 && !matches!(rm(m), 4 | 5) => {
            (4, Some(reg(m)), None)
        }
        _ => return None,
    })
}

/// Whether the kernel emulates this first instruction instead of
/// single-stepping it (x86_64: push, nop, relative jumps and calls, ret).
fn is_emulated(code: &[u8]) -> bool {
    match code {
        [0x50..=0x57, ..] | [0x41, 0x50..=0x57, ..] => true, // push reg
        [0x90, ..] | [0x66, 0x90, ..] | [0x0f, 0x1f, ..] => true, // nop
        [0xe8 | 0xe9 | 0xeb | 0xc3, ..] | [0x70..=0x7f, ..] => true,
        [0x0f, 0x80..=0x8f, ..] => true,
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
            for fd in self.fds.drain(..) {
                spawn_drop(scope, fd);
            }
        });
    }
}

/// The programs allocator sites take, as program fds (sendable to the
/// attach worker): entry of allocating calls, of C++ operator new and of
/// the libc syscall wrappers (told apart by the cookie), return of allocating calls, entry of frees, USDT
/// region markers.
pub struct AllocPrograms {
    pub enter: OwnedFd,
    pub ret: OwnedFd,
    pub free: OwnedFd,
    pub marker: OwnedFd,
}

impl AllocPrograms {
    /// memtrail's own allocator programs.
    pub fn memtrail(skel: &MemtrailSkel<'_>) -> io::Result<Self> {
        let p = &skel.progs;
        Ok(Self {
            enter: p.alloc_enter.as_fd().try_clone_to_owned()?,
            ret: p.alloc_return.as_fd().try_clone_to_owned()?,
            free: p.free_enter.as_fd().try_clone_to_owned()?,
            marker: p.region_marker.as_fd().try_clone_to_owned()?,
        })
    }
}

/// Attaches `progs` to every site of one image, with one uprobe_multi link
/// per program; each site's attach cookie is its kind and argument layout.
/// The links detach when dropped.
pub fn attach_sites(
    progs: &AllocPrograms,
    sites: &[Site],
    links: &mut Links,
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
    // operator new and the syscall wrappers: entry only, one link.
    let mut news = of_role(Role::New);
    news.extend(of_role(Role::Syscall));
    let groups: [(BorrowedFd<'_>, bool, &[&Site]); 5] = [
        (progs.enter.as_fd(), false, &allocs),
        (progs.ret.as_fd(), true, &allocs),
        (progs.free.as_fd(), false, &frees),
        (progs.enter.as_fd(), false, &news),
        (progs.marker.as_fd(), false, &markers),
    ];
    for (prog, retprobe, group) in groups {
        let Some(first) = group.first() else {
            continue;
        };
        let offsets: Vec<u64> = group.iter().map(|s| s.offset).collect();
        let cookies: Vec<u64> = group.iter().map(|s| s.cookie()).collect();
        let link = crate::sys::uprobe_multi(prog, &first.image, &offsets, &cookies, retprobe)
            .map_err(|err| uprobe_error(group, err))?;
        links.push_fd(link);
    }
    Ok(())
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

#[cfg(test)]
mod tests {
    use super::api::{COUNT_SIZE, REALLOC_N, SIZE0, SIZE1};
    use super::{Role, harmless_prefix};

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
        // reallocarray: mov %rsi,%rax; mul %rdx (not decoded).
        assert_eq!(len(&[0x48, 0x89, 0xf0, 0x48, 0xf7, 0xe2, 0x48]), 0);
        // operator new(nothrow): sub $8,%rsp moves the stack.
        assert_eq!(len(&[0x48, 0x83, 0xec, 0x08, 0xe8]), 0);
        // mov %rax,%rsp writes the stack pointer.
        assert_eq!(len(&[0x48, 0x89, 0xc4, 0x53]), 0);
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
        // The same prefix cannot serve a free: rdi no longer holds the
        // pointer.
        assert_eq!(p.relocate(Role::Free, SIZE0), None);
        assert_eq!(p.relocate(Role::New, SIZE0), Some(SIZE0));
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
        assert_eq!(p.relocate(Role::Alloc, COUNT_SIZE), None);
        // Unmoved arguments stay where they were.
        let p = harmless_prefix(&[0x48, 0x85, 0xff, 0x53]).expect("a prefix");
        assert_eq!(p.relocate(Role::Alloc, REALLOC_N), Some(REALLOC_N));
    }
}
