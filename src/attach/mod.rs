//! Finding allocator entry points in an image and attaching the probes.
//!
//! An allocator site is a (file, offset) where a probe goes, with the kind
//! of call the BPF side reports (the attach cookie). Several symbols can name
//! one address (glibc's `free`/`cfree`, `memalign`/`aligned_alloc`): a site is
//! attached once per address, under the first name in [`api::libc`] order.
//!
//! The files: [`elf_sites`] finds an image's sites (reading it through
//! [`elf`]), [`prologue`] decides where on an entry its probe goes (onto
//! an instruction the kernel emulates, [`emulated`]), [`links`] attaches
//! the probes and hands out their hit counters.
//!
//! Probes are per process where the kernel allows ([`per_process`]), else
//! system-wide (every process mapping the file hits them); the BPF programs
//! filter on the tracked-process map either way.

pub mod api;
pub mod cache;
mod elf;
mod elf_sites;
mod emulated;
pub mod free_sites;
mod links;
pub mod per_process;
pub mod place;
mod prologue;
pub mod returns;
pub mod shim;
pub mod static_image;
pub mod usdt;
pub mod worker;

use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

pub use api::{Abi, Entry, Role};
pub use elf_sites::{capture_sites, find_sites, sites_in};
pub use links::{
    AllocPrograms, HitSlots, Links, MAX_COUNTED_SITES, ShimProgram, SitePrograms, attach_sites,
    kernel_returns, link_sites, link_sites_with, read_site_hits, uprobe_sessions,
};

use crate::bpf::record::Kind;
use crate::bpf::skel::memtrail::types as t;
use crate::profile::ProbeEntry;
use crate::sys::image_key;

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
pub fn known_key(id: crate::sys::FileId, tgid: u32) -> [u8; 24] {
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
