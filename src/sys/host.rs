//! The host: capabilities, the kernel log, the monotonic clock and
//! file identities as BPF programs see them.

use std::io;
use std::path::Path;

/// Whether this process has `cap` in its effective set.
pub fn has_capability(cap: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|eff| eff & (1u64 << cap) != 0)
}

/// Recent kernel log lines (needs CAP_SYSLOG); empty when unreadable.
///
/// Raw libc: rustix has no klogctl (syslog(2)).
pub fn kernel_log_tail(max_bytes: usize) -> String {
    const SYSLOG_ACTION_READ_ALL: libc::c_int = 3;
    let mut buf = vec![0u8; max_bytes];
    // SAFETY: klogctl writes at most `buf.len()` bytes into `buf`.
    let n = unsafe {
        libc::klogctl(
            SYSLOG_ACTION_READ_ALL,
            buf.as_mut_ptr().cast(),
            buf.len() as libc::c_int,
        )
    };
    if n <= 0 {
        return String::new();
    }
    buf.truncate(n as usize);
    String::from_utf8_lossy(&buf).into_owned()
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `bpf_ktime_get_ns`.
pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A file's identity, what makes two paths the same file: its device and
/// inode, the device in the kernel's own encoding ([`kernel_dev`]), which
/// BPF programs see in `s_dev`. One encoding for every identity, so one
/// taken from a path equals the one BPF reports for the same file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId {
    /// The device, major << 20 | minor.
    pub dev: u64,
    pub ino: u64,
}

impl FileId {
    /// The identity of the file `md` describes.
    pub fn of(md: &std::fs::Metadata) -> Self {
        use std::os::unix::fs::MetadataExt;
        Self {
            dev: kernel_dev(md.dev()),
            ino: md.ino(),
        }
    }

    /// The identity of the file `stat` describes.
    pub fn of_stat(stat: &rustix::fs::Stat) -> Self {
        Self {
            dev: kernel_dev(stat.st_dev),
            ino: stat.st_ino,
        }
    }
}

/// The identity of the file at `path` (following symlinks) as the kernel's
/// BPF programs see it.
pub fn kernel_file_id(path: &Path) -> io::Result<FileId> {
    let md = std::fs::metadata(path)?;
    Ok(FileId::of(&md))
}

/// A device number (`st_dev`) in the kernel's own encoding, which BPF
/// programs see in `s_dev`: major << 20 | minor.
pub fn kernel_dev(st_dev: u64) -> u64 {
    u64::from(libc::major(st_dev)) << 20 | u64::from(libc::minor(st_dev))
}

/// The running kernel's major and minor release (uname), (0, 0) if unread.
pub fn kernel_release() -> (u32, u32) {
    let uname = rustix::system::uname();
    let release = uname.release().to_string_lossy();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    (parts.next().unwrap_or(0), parts.next().unwrap_or(0))
}

/// Waits for an RCU grace period (`membarrier(MEMBARRIER_CMD_GLOBAL)`, which
/// is `synchronize_rcu()` in the kernel): every BPF program running when it
/// was called (uprobes and tracepoints run under `rcu_read_lock`) has
/// returned when it returns. False when this kernel cannot promise that:
/// the command is missing (nohz_full CPUs refuse it), or one CPU is online
/// (the kernel then skips the wait, and a preemptible kernel may have
/// preempted a program inside its read-side section).
pub fn rcu_grace_period() -> bool {
    const MEMBARRIER_CMD_QUERY: libc::c_long = 0;
    const MEMBARRIER_CMD_GLOBAL: libc::c_long = 1;
    // SAFETY: membarrier takes two integers and touches no memory of ours.
    let supported = unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0) };
    if supported < 0 || supported & MEMBARRIER_CMD_GLOBAL == 0 {
        return false;
    }
    // SAFETY: sysconf reads a system value.
    if unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } < 2 {
        return false;
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0 }
}

/// Whether this process is dumpable (`PR_GET_DUMPABLE` 1): its
/// `/proc/PID/fd` is its user's, not root's (a set-user-ID or set-group-ID
/// start, or a change of ids, clears it).
pub fn dumpable() -> bool {
    rustix::process::dumpable_behavior()
        .is_ok_and(|d| d == rustix::process::DumpableBehavior::Dumpable)
}
