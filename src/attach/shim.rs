//! The preload shim (`memtrail run --preload`, issue 22): an in-process
//! path that cuts the kernel entries per allocation from three a pair
//! (malloc's entry and return, free's entry) to none on its ring path (the
//! thread writes its records to a ring of memtrail's shared memory,
//! `crate::ring::shim`, walking its stack with libunwind), and to one on its
//! hook path, where it cannot: a thread's frees wait in its buffer (up to
//! 32, not yet freed) and go with its next allocation's hook as one record
//! of frees.
//!
//! The shim's sources (`preload/*.c`, over `bpf/memtrail.h`), built by
//! build.rs into one object and embedded here, are written at start-up into a sealed memfd that memtrail keeps open; the
//! command gets `LD_PRELOAD=/proc/<memtrail>/fd/<n>` (nothing on disk), or,
//! when it may not open memtrail's descriptors (run as another user under
//! sudo, or memtrail holding capabilities it lacks), `/proc/<keeper>/fd/3`:
//! the same memfd, held by a process of that user's for the capture
//! (`crate::sys::ShimKeeper`; the same inode, so its hook is probed the
//! same). The shim interposes glibc's allocator API and calls `memtrail_hook` (a
//! 5-byte nop the kernel optimizes a uprobe on) with each record; BPF's
//! `alloc_session` (`shim_hook` without uprobe sessions) makes the uprobe
//! mode's records from it.
//!
//! Exactness: a process that maps the shim gets the hook, and no probe on
//! libc's functions the shim interposes ([`super::per_process`] decides per
//! image request, from the process's mappings: ld.so maps `LD_PRELOAD`
//! objects before the program's libraries, and the probes made before it
//! did, on the executable, are made again). Other allocators keep their
//! probes, which make no record while the shim's real call runs
//! (`SHIM_COOKIE`). A process that does not map it (a
//! static binary, a set-user-ID program, which ignores `LD_PRELOAD`, an
//! environment cleared, a preload refused because the shim's path is not
//! openable after a later change of user) keeps the uprobes.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::sys::FileId;

/// The shim, as built for this binary.
const SHIM: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/memtrail_preload.so"));

/// The hook's symbol in the shim.
const HOOK: &str = "memtrail_hook";

/// What the shim interposes (`preload/interpose.c`): in a process
/// with the shim, every call of these by name goes through it.
pub const INTERPOSED: [&str; 10] = [
    "malloc",
    "free",
    "calloc",
    "realloc",
    "reallocarray",
    "posix_memalign",
    "aligned_alloc",
    "memalign",
    "valloc",
    "pvalloc",
];

/// The cookie bit of the probes of a process with the shim
/// (`MT_CK_SHIM_BIT`): a probed call made inside the shim's real allocator
/// call is that call's own, and makes no record.
pub const SHIM_COOKIE: u64 =
    1 << crate::bpf::skel::memtrail::types::mt_cookie_layout::MT_CK_SHIM_BIT.0;

/// The hook's cookie where `alloc_session` serves it (`MT_CK_SHIM_HOOK`).
pub const HOOK_COOKIE: u64 =
    crate::bpf::skel::memtrail::types::mt_cookie_layout::MT_CK_SHIM_HOOK.0 as u64;

/// The shim, in a sealed memfd of memtrail's for the capture.
#[derive(Debug)]
pub struct Shim {
    file: OwnedFd,
    /// The process that holds it for a command of another user.
    keeper: Option<crate::sys::ShimKeeper>,
    /// Its kernel identity, as BPF's image requests name it.
    pub id: FileId,
    /// The file offset of `memtrail_hook`.
    pub hook_offset: u64,
}

/// The shim could not be prepared.
#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    #[error("writing the preload shim into a memfd")]
    Memfd(#[source] crate::sys::SysError),
    #[error("reading the preload shim's memfd")]
    Stat(#[source] std::io::Error),
    #[error("the preload shim has no {HOOK}")]
    NoHook,
    #[error("holding the preload shim for the command's user")]
    Keeper(#[source] crate::sys::SysError),
}

impl Shim {
    /// Writes the shim into a sealed memfd.
    pub fn new() -> Result<Self, ShimError> {
        let hook_offset = hook_offset(SHIM).ok_or(ShimError::NoHook)?;
        let file =
            crate::sys::sealed_memfd("memtrail_preload.so", SHIM).map_err(ShimError::Memfd)?;
        let md = std::fs::metadata(Self::fd_path(&file)).map_err(ShimError::Stat)?;
        Ok(Self {
            id: FileId::of(&md),
            file,
            keeper: None,
            hook_offset,
        })
    }

    fn fd_path(file: &OwnedFd) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
    }

    /// The path memtrail probes it through.
    pub fn probe_path(&self) -> PathBuf {
        Self::fd_path(&self.file)
    }

    /// Makes the shim openable by the command, running as `creds`' user
    /// (memtrail's own without them), when memtrail's own descriptors are
    /// not, through a keeper of that user's ([`crate::sys::ShimKeeper`]):
    /// under sudo (another uid than memtrail's); when memtrail is not root
    /// (it holds capabilities the command does not, and the kernel lets a
    /// process open another's descriptors only if it has every capability
    /// that one has); when memtrail is not dumpable (a set-user-ID start).
    pub fn serve(&mut self, creds: Option<&crate::sys::Credentials>) -> Result<(), ShimError> {
        if self.keeper.is_some() {
            return Ok(());
        }
        let own;
        let creds = match creds {
            Some(creds) if creds.uid != rustix::process::geteuid().as_raw() => creds,
            _ if !rustix::process::geteuid().is_root() || !crate::sys::dumpable() => {
                own = crate::sys::Credentials::own();
                &own
            }
            _ => return Ok(()),
        };
        let keeper =
            crate::sys::ShimKeeper::spawn(self.file.as_fd(), creds).map_err(ShimError::Keeper)?;
        self.keeper = Some(keeper);
        Ok(())
    }

    /// The `LD_PRELOAD` entry that names it for other processes while
    /// memtrail runs.
    pub fn preload_path(&self) -> PathBuf {
        if let Some(keeper) = &self.keeper {
            return keeper.shim_path();
        }
        Path::new("/proc")
            .join(std::process::id().to_string())
            .join("fd")
            .join(self.file.as_raw_fd().to_string())
    }

    /// Whether image `id` is process `pid`'s executable (`/proc/PID/exe`).
    pub fn is_executable(pid: u32, id: FileId) -> bool {
        std::fs::metadata(format!("/proc/{pid}/exe")).is_ok_and(|md| FileId::of(&md) == id)
    }

    /// Whether process `pid` maps the shim now (false if its mappings
    /// cannot be read).
    pub fn mapped_by(&self, pid: u32) -> bool {
        let Ok(maps) = std::fs::read_to_string(format!("/proc/{pid}/maps")) else {
            return false;
        };
        let ino = self.id.ino.to_string();
        maps.lines().any(|line| {
            // start-end perms offset dev inode path
            let mut fields = line.split_ascii_whitespace();
            let dev = fields.nth(3);
            let inode = fields.next();
            inode == Some(ino.as_str()) && dev.is_some_and(|d| self.dev_matches(d))
        })
    }

    /// Whether a `/proc/PID/maps` device (`major:minor` in hex) is the
    /// shim's.
    fn dev_matches(&self, dev: &str) -> bool {
        let Some((major, minor)) = dev.split_once(':') else {
            return false;
        };
        let (Ok(major), Ok(minor)) = (
            u64::from_str_radix(major, 16),
            u64::from_str_radix(minor, 16),
        ) else {
            return false;
        };
        major << 20 | minor == self.id.dev
    }
}

/// The file offset of the hook in the shim's image.
fn hook_offset(data: &[u8]) -> Option<u64> {
    let file = object::File::parse(data).ok()?;
    let addr = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.name() == Ok(HOOK))?
        .address();
    file.segments().find_map(|seg| {
        let (offset, size) = seg.file_range();
        let start = seg.address();
        (addr >= start && addr < start + size).then(|| addr - start + offset)
    })
}

#[cfg(test)]
mod tests {
    use super::{SHIM, hook_offset};

    /// Check that the shim's list of C++ operator news (whose frames its
    /// ring path leaves out, `operator_new` in preload/stack.c)
    /// is the unwind tables' (`OPERATOR_NEW`, flagged for BPF's walk): the
    /// two walks must skip the same frames.
    #[test]
    fn shim_skips_the_operator_news_the_tables_flag() {
        let source = include_str!("../../preload/stack.c");
        let start = source
            .find("static const char *const operator_new[] = {")
            .expect("the shim's operator_new list");
        let list = &source[start..start + source[start..].find("};").expect("its end")];
        let names: Vec<&str> = list.split('"').skip(1).step_by(2).collect();
        assert_eq!(names, crate::unwind::table::OPERATOR_NEW);
    }

    /// The names a C source defines: macros, struct/enum/union tags and
    /// enumerators (comments left out).
    fn c_definitions(source: &str) -> std::collections::BTreeSet<String> {
        let comments = regex::Regex::new(r"(?s)/\*.*?\*/|//[^\n]*").unwrap();
        let code = comments.replace_all(source, " ");
        let tag =
            regex::Regex::new(r"#\s*define\s+(\w+)|\b(?:struct|enum|union)\s+(\w+)\s*\{").unwrap();
        let enums = regex::Regex::new(r"\benum\b[^{;]*\{([^}]*)\}").unwrap();
        let item = regex::Regex::new(r"^\s*(\w+)").unwrap();
        let mut names: std::collections::BTreeSet<String> = tag
            .captures_iter(&code)
            .filter_map(|c| c.get(1).or(c.get(2)))
            .map(|m| m.as_str().to_owned())
            .collect();
        for body in enums.captures_iter(&code) {
            names.extend(
                body[1]
                    .split(',')
                    .filter_map(|i| item.captures(i))
                    .map(|c| c[1].to_owned()),
            );
        }
        names
    }

    /// Check that the shim and the BPF program share one definition of
    /// each record layout, kind and constant (issue 42): the shim's
    /// sources include bpf/memtrail.h (which includes memtrail_shim.h) and
    /// define none of its names again, nor one name in two files; nor does
    /// any other BPF source.
    #[test]
    fn shim_defines_nothing_the_shared_header_does() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let read = |p: &std::path::Path| std::fs::read_to_string(p).expect("readable source");
        let header: std::collections::BTreeSet<String> = ["memtrail.h", "memtrail_shim.h"]
            .iter()
            .flat_map(|h| c_definitions(&read(&root.join("bpf").join(h))))
            .collect();
        for name in ["MT_MALLOC", "mt_py_offsets", "MT_PY_FRAME", "MT_SHIM_HELLO"] {
            assert!(header.contains(name), "the header parse found {name}");
        }
        let copy = "enum { MT_MALLOC = 1, X };\n#define MT_PY_FRAME 1\nstruct mt_py_offsets {};";
        assert_eq!(c_definitions(copy).intersection(&header).count(), 3);
        let mut seen = std::collections::BTreeMap::new();
        for entry in std::fs::read_dir(root.join("preload")).expect("preload/") {
            let path = entry.expect("preload/ entry").path();
            let source = read(&path);
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            for name in c_definitions(&source) {
                assert!(!header.contains(&name), "{file} defines {name} again");
                if let Some(other) = seen.insert(name.clone(), file.clone()) {
                    panic!("{name} is defined in {other} and {file}");
                }
            }
        }
        assert!(seen.len() > 50, "the shim's definitions were read");
        // BPF's parts (the unity build's files) take them from the header too.
        let mut parts = 0;
        for entry in std::fs::read_dir(root.join("bpf")).expect("bpf/") {
            let path = entry.expect("bpf/ entry").path();
            let file = path.file_name().unwrap().to_string_lossy().into_owned();
            if ["memtrail.h", "memtrail_shim.h", "vmlinux_min.h"].contains(&file.as_str()) {
                continue;
            }
            parts += 1;
            for name in c_definitions(&read(&path)) {
                assert!(!header.contains(&name), "bpf/{file} defines {name} again");
            }
        }
        assert!(parts > 5, "the BPF parts were read");
        let shim = read(&root.join("preload/shim.h"));
        assert!(shim.contains("#include \"memtrail.h\""));
    }

    /// Check that the embedded shim's hook starts with the 5-byte nop the
    /// kernel optimizes a uprobe on (`0f 1f 44 00 00`), then `ret`.
    #[test]
    fn shim_hook_is_a_five_byte_nop() {
        let at = hook_offset(SHIM).expect("the hook's offset") as usize;
        assert_eq!(&SHIM[at..at + 6], &[0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3]);
    }
}
