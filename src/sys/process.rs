//! Processes by pid and by pidfd: the [`Pid`] type, pidfds (open, signal,
//! liveness, exit), `kill`, thread states from `/proc`, the PID namespace,
//! and the child-subreaper flag.
//!
//! A pid names whichever process holds it now; a pidfd keeps naming the
//! process it was opened for. Everything that acts on a process more than
//! once goes through a pidfd.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::{Signal, SysError, SysResult};

/// A process or thread id, as memtrail meets them: a `u32` in BPF maps and
/// records, in `/proc` and on the command line.
///
/// A newtype rather than rustix's `Pid`: that one is a signed `NonZeroI32`
/// without `Ord` (the stop table sorts its outcomes by pid), so each `u32`
/// memtrail holds would need a fallible conversion at its call site. Here
/// the conversion happens once, in `Pid::to_rustix`, inside this module:
/// 0 and values above `i32::MAX` (no process can have them) fail with
/// EINVAL, as pidfd_open(0) does, and never reach a call where 0 or a
/// negative number means "my process group" or "any child".
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Debug)]
pub struct Pid(u32);

impl Pid {
    pub const fn new(raw: u32) -> Self {
        Self(raw)
    }

    /// The number, as BPF maps and records hold it.
    pub const fn get(self) -> u32 {
        self.0
    }

    /// rustix's pid, or EINVAL for a number no process can have.
    pub(super) fn to_rustix(self, call: &'static str) -> SysResult<rustix::process::Pid> {
        i32::try_from(self.0)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or(SysError {
                call,
                source: io::Error::from_raw_os_error(libc::EINVAL),
            })
    }

    pub(super) fn from_rustix(pid: rustix::process::Pid) -> Self {
        // rustix's pids from the kernel are positive.
        Self(pid.as_raw_nonzero().get().unsigned_abs())
    }
}

impl From<u32> for Pid {
    fn from(raw: u32) -> Self {
        Self(raw)
    }
}

impl From<Pid> for u32 {
    fn from(pid: Pid) -> Self {
        pid.0
    }
}

impl std::fmt::Display for Pid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Sends `sig` to `pid`.
pub fn kill(pid: Pid, sig: Signal) -> SysResult<()> {
    rustix::process::kill_process(pid.to_rustix("kill")?, sig).map_err(SysError::rustix("kill"))
}

/// Opens a pidfd for process `pid`: a handle that keeps naming that process
/// even after the pid is reused (signals to it fail with ESRCH once it has
/// been reaped). Close-on-exec.
pub fn pidfd_open(pid: Pid) -> SysResult<OwnedFd> {
    const CALL: &str = "pidfd_open";
    rustix::process::pidfd_open(pid.to_rustix(CALL)?, rustix::process::PidfdFlags::empty())
        .map_err(SysError::rustix(CALL))
}

/// Opens a pidfd for thread `tid` (`PIDFD_THREAD`): BPF task storage takes
/// it as the key that names the thread.
pub fn pidfd_open_thread(tid: Pid) -> SysResult<OwnedFd> {
    const CALL: &str = "pidfd_open(PIDFD_THREAD)";
    // PIDFD_THREAD is O_EXCL; rustix has no name for it yet.
    let thread = rustix::process::PidfdFlags::from_bits_retain(libc::O_EXCL as u32);
    rustix::process::pidfd_open(tid.to_rustix(CALL)?, thread).map_err(SysError::rustix(CALL))
}

/// Sends `sig` to the process behind `pidfd`, like kill(2). ESRCH: it has
/// exited and been reaped.
pub fn pidfd_send_signal(pidfd: std::os::fd::BorrowedFd<'_>, sig: Signal) -> SysResult<()> {
    let call = match sig {
        Signal::STOP => "pidfd_send_signal(SIGSTOP)",
        Signal::CONT => "pidfd_send_signal(SIGCONT)",
        _ => "pidfd_send_signal",
    };
    rustix::process::pidfd_send_signal(pidfd, sig).map_err(SysError::rustix(call))
}

/// Checks that the process behind `pidfd` still exists (signal 0), like
/// `kill(pid, 0)`. ESRCH: it has exited and been reaped.
///
/// A raw syscall: rustix's `Signal` cannot be 0.
pub fn pidfd_check_alive(pidfd: std::os::fd::BorrowedFd<'_>) -> SysResult<()> {
    // SAFETY: a descriptor, signal 0, no siginfo (NULL) and no flags.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            0,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if ret < 0 {
        return Err(SysError::last("pidfd_send_signal(0)"));
    }
    Ok(())
}

/// Waits until the process behind `pidfd` has exited (it need not be a
/// child).
pub fn wait_pidfd(pidfd: std::os::fd::BorrowedFd<'_>) -> SysResult<()> {
    let mut fds = [rustix::event::PollFd::new(
        &pidfd,
        rustix::event::PollFlags::IN,
    )];
    loop {
        match rustix::event::poll(&mut fds, None) {
            Err(rustix::io::Errno::INTR) => {}
            done => return done.map(drop).map_err(SysError::rustix("poll(pidfd)")),
        }
    }
}

/// The scheduler states of a process's threads, from
/// `/proc/PID/task/*/status`, for telling whether it is stopped.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ThreadStates {
    /// Threads listed (an exited, unreaped leader included).
    pub threads: usize,
    /// Threads in a group stop (`T`) or a ptrace stop (`t`).
    pub stopped: usize,
    /// Threads that exited and are not reaped yet (`Z`, `X`).
    pub dead: usize,
    /// Threads running or runnable (`R`).
    pub running: usize,
    /// A SIGSTOP is generated but not yet dequeued: pending for the process
    /// (`ShdPnd`) or for one of its threads (`SigPnd`).
    pub stop_pending: bool,
}

/// Reads the states of every thread of process `pid`. A thread that exits
/// while being read is left out. Fails with ENOENT when `/proc/PID` is gone.
///
/// A pid names whichever process holds it now: pair this with a pidfd
/// liveness check made *after* it ([`pidfd_check_alive`]) to
/// know the states are those of the process the pidfd names.
pub fn thread_states(pid: Pid) -> SysResult<ThreadStates> {
    const CALL: &str = "read(/proc/PID/task/*/status)";
    let fail = |source: io::Error| SysError { call: CALL, source };
    let mut states = ThreadStates::default();
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).map_err(fail)?;
    for task in tasks {
        let task = task.map_err(fail)?;
        let status = match std::fs::read(task.path().join("status")) {
            Ok(status) => status,
            // The thread exited and was reaped since the listing.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOENT | libc::ESRCH)) => continue,
            Err(e) => return Err(fail(e)),
        };
        states.threads += 1;
        let stop_bit = 1u64 << (libc::SIGSTOP - 1);
        for line in status.split(|&b| b == b'\n') {
            if let Some(state) = line.strip_prefix(b"State:") {
                match state.trim_ascii_start().first() {
                    Some(b'T' | b't') => states.stopped += 1,
                    Some(b'Z' | b'X') => states.dead += 1,
                    Some(b'R') => states.running += 1,
                    _ => {}
                }
            } else if let Some(mask) = line
                .strip_prefix(b"SigPnd:")
                .or_else(|| line.strip_prefix(b"ShdPnd:"))
            {
                let mask = std::str::from_utf8(mask.trim_ascii())
                    .ok()
                    .and_then(|m| u64::from_str_radix(m, 16).ok())
                    .ok_or_else(|| {
                        fail(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "pending-signal mask is not hexadecimal",
                        ))
                    })?;
                states.stop_pending |= mask & stop_bit != 0;
            }
        }
    }
    Ok(states)
}

/// The inode of the initial PID namespace (`PROC_PID_INIT_INO`).
pub const INIT_PID_NS_INO: u32 = 0xEFFF_FFFC;

/// The inode of memtrail's PID namespace (`/proc/self/ns/pid`), if
/// readable.
pub fn pid_namespace() -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata("/proc/self/ns/pid").ok()?;
    u32::try_from(md.ino()).ok()
}

/// Makes this process the reaper of its orphaned descendants, so that every
/// process of the tracked tree is eventually waited for by us.
pub fn set_child_subreaper() -> SysResult<()> {
    // Any non-zero value sets the flag; rustix passes the pid's number.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(SysError::rustix("prctl(PR_SET_CHILD_SUBREAPER)"))
}

/// The calling thread's id.
pub fn gettid() -> Pid {
    Pid(rustix::thread::gettid().as_raw_nonzero().get() as u32)
}

/// Sets the nice value of thread `tid` of this process (Linux keeps one
/// per thread): 19 lets every other runnable thread go first; back to 0
/// needs `CAP_SYS_NICE`, which root has.
pub fn set_thread_nice(tid: Pid, nice: i32) -> SysResult<()> {
    const CALL: &str = "setpriority(PRIO_PROCESS, tid)";
    rustix::process::setpriority_process(Some(tid.to_rustix(CALL)?), nice)
        .map_err(SysError::rustix(CALL))
}

/// Makes the calling thread real-time: `SCHED_FIFO` at priority 1, the
/// lowest, above every normal thread (with `SCHED_RESET_ON_FORK`: nothing
/// it starts inherits it). Needs `CAP_SYS_NICE` or an `RLIMIT_RTPRIO`;
/// fails with EPERM otherwise.
pub fn set_thread_realtime() -> SysResult<()> {
    let param = libc::sched_param { sched_priority: 1 };
    // SAFETY: pid 0 is the calling thread; `param` is a valid sched_param
    // that outlives the call. Raw call: rustix has no sched_setscheduler.
    let rc = unsafe {
        libc::sched_setscheduler(0, libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK, &param)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(SysError::last("sched_setscheduler(SCHED_FIFO)"))
    }
}

/// Stops the calling process (a SIGSTOP to itself) until a SIGCONT: a
/// test's fault hook (`MEMTRAIL_FAULT=stop-after-outputs`).
pub fn stop_self() {
    let _ = rustix::process::kill_process(rustix::process::getpid(), Signal::STOP);
}

/// The most of a process's `/proc/PID/maps` memtrail reads: 64 MiB. A
/// tracked process's mappings are its own doing (issue 40: everything a
/// tracked process gives memtrail is bounded): the kernel's default
/// `vm.max_map_count` (65,530) of names of up to 4 KiB make ~270 MB; 64
/// MiB holds 65,530 lines of ~1 KiB.
pub const MAX_MAPS_BYTES: u64 = 64 << 20;

/// `/proc/PID/maps` at `path` (a `maps` file of a process's directory in
/// `/proc`), at most [`MAX_MAPS_BYTES`] of it, cut at its last whole line
/// when longer; a name that is not UTF-8 is read lossily (one mapping's
/// odd name does not hide the process's others).
pub fn read_maps(path: &std::path::Path) -> io::Result<String> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_MAPS_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_MAPS_BYTES {
        let end = bytes
            .iter()
            .rposition(|&b| b == b'\n')
            .map_or(0, |at| at + 1);
        bytes.truncate(end.min(MAX_MAPS_BYTES as usize));
    }
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Check that a maps file is read up to its cap, cut at a whole line,
    /// a name that is not UTF-8 read lossily (issue 40).
    #[test]
    fn read_maps_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("maps");
        let line = format!("{}\n", "7f00-7f01 r-xp 0 0:1 2 /x".repeat(40));
        let n = (MAX_MAPS_BYTES as usize / line.len()) + 10;
        let mut text = line.repeat(n).into_bytes();
        text.extend_from_slice(b"1-2 r-xp 0 0:1 2 /\xff\n");
        std::fs::write(&path, &text).expect("write");
        let read = read_maps(&path).expect("read");
        assert!(read.len() as u64 <= MAX_MAPS_BYTES);
        assert!(read.ends_with('\n'));
        assert_eq!(read.len() % line.len(), 0);
        std::fs::write(&path, b"a /ok\nb /\xff\n").expect("write");
        assert_eq!(read_maps(&path).expect("read"), "a /ok\nb /\u{fffd}\n");
    }
}
