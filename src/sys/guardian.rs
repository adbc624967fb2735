//! The guardian: a process outside memtrail's tree that, once memtrail is
//! gone however it ended, resumes (and thaws) everything memtrail may have
//! left stopped. See [`spawn_guardian`].
//!
//! The double fork and the guardian itself are raw system calls: they run
//! in children of a multithreaded process, where only async-signal-safe
//! calls belong, and rustix has no fork outside its unstable `runtime` API.
//! The parent's side (subreaper flag, reaping the intermediate) uses rustix.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::fd::pipe;
use super::process::{clear_child_subreaper, is_child_subreaper, set_child_subreaper};
use super::{SysError, SysResult};

/// A fork made with the raw system call: no `pthread_atfork` handlers run
/// in a child of a multithreaded process. Returns 0 in the child.
///
/// Raw syscall: rustix has no fork outside its unstable `runtime` API; the
/// guardian's double fork and the guardian itself stay raw system calls
/// (async-signal-safe, no allocation, after a fork of a threaded process).
///
/// # Safety
/// The child may only make async-signal-safe calls until it execs or
/// `_exit`s.
unsafe fn raw_fork() -> libc::c_long {
    // SAFETY: clone with SIGCHLD only and no new stack behaves like fork;
    // the caller restricts what the child does.
    unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::SIGCHLD as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    }
}

/// The tree's cgroup, for the guardian.
pub struct GuardianCgroup<'a> {
    /// `cgroup.freeze`, open for writing.
    pub freeze: std::os::fd::BorrowedFd<'a>,
    /// The cgroup's parent directory.
    pub parent: std::os::fd::BorrowedFd<'a>,
    /// The cgroup's name in `parent`.
    pub name: &'a std::ffi::CStr,
}

/// The guardian's cgroup descriptors and name (raw: used after fork).
type GuardianFds = Option<(libc::c_int, libc::c_int, *const libc::c_char)>;

/// Starts the guardian: a small process that waits for the write end
/// returned here to close — however memtrail ends, SIGKILL included — and
/// then sends SIGCONT, through pidfds, to every process left in the tracked
/// map, so nothing of the tree stays stopped by a pressure pause or an
/// attach hold. With `cgroup`, the tree's cgroup (`cgroup.freeze` open for
/// writing, the cgroup's parent directory and its name), it first thaws the
/// cgroup, then removes it once the tree has left it.
///
/// The guardian is nobody's child that cares (issue 11): memtrail forks an
/// intermediate process, which calls `setsid` and forks the guardian, then
/// exits; memtrail reaps it before returning. The guardian is then an
/// orphan, re-parented to the nearest subreaper above memtrail or to init,
/// never to memtrail's parent unless that parent made itself a subreaper or
/// is its namespace's init (which reap orphans by design), and never to
/// memtrail: its subreaper flag is cleared for the double fork and restored
/// after the reap, so the guardian is neither waited for by memtrail's wait
/// loop nor a member of the tracked tree (the tracked map has no entry for
/// memtrail or its intermediate). Being in a session of its own, the
/// guardian survives a kill of memtrail's process group and a hangup of
/// its terminal. When `spawn_guardian` returns, the guardian is already in
/// that session.
///
/// Returns `None` when memtrail is PID 1 of its PID namespace: every
/// orphan there is re-parented to memtrail itself (so a guardian would be
/// waited for by memtrail, which it waits for), and none is needed: when
/// the namespace's init exits, SIGKILL included, the kernel kills every
/// process of the namespace and of the namespaces below it, which is every
/// process the tree can hold, and a killed process does not stay stopped.
pub fn spawn_guardian(
    tracked_map: std::os::fd::BorrowedFd<'_>,
    cgroup: Option<GuardianCgroup<'_>>,
) -> SysResult<Option<OwnedFd>> {
    if rustix::process::getpid().is_init() {
        return Ok(None);
    }
    let (read_end, write_end) = pipe()?;
    let map_fd = tracked_map.as_raw_fd();
    let read_fd = read_end.as_raw_fd();
    let cg = cgroup.map(|c| (c.freeze.as_raw_fd(), c.parent.as_raw_fd(), c.name.as_ptr()));
    // memtrail may have been exec'd by a process that made itself a
    // subreaper, or made itself one already: the guardian would then be
    // re-parented to memtrail when the intermediate exits.
    let subreaper = is_child_subreaper()?;
    if subreaper {
        clear_child_subreaper()?;
    }
    // SAFETY: the child only makes raw system calls (async-signal-safe)
    // and ends with _exit.
    let pid = unsafe { raw_fork() };
    if pid == 0 {
        // SAFETY: in the child; see above.
        unsafe { guardian_intermediate(read_fd, map_fd, cg) }
    }
    let forked = if pid < 0 {
        Err(SysError::last("fork (guardian)"))
    } else {
        let pid = rustix::process::Pid::from_raw(pid as libc::pid_t);
        reap_intermediate(pid.expect("the parent sees the child's pid, never 0"))
    };
    // The intermediate's exit re-parented the guardian before the reap
    // returned: being a subreaper again cannot make it memtrail's child.
    if subreaper {
        set_child_subreaper()?;
    }
    forked?;
    drop(read_end);
    Ok(Some(write_end))
}

/// Waits for the guardian's intermediate process; its exit code is 0 or
/// the errno of the call that failed in it.
fn reap_intermediate(pid: rustix::process::Pid) -> SysResult<()> {
    let status = loop {
        match rustix::process::waitpid(Some(pid), rustix::process::WaitOptions::empty()) {
            Ok(Some((_, status))) => break status,
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            // SIGCHLD ignored (a disposition inherited from memtrail's
            // parent): the kernel reaped the intermediate once it exited,
            // and its status is lost. The guardian most likely runs.
            Err(rustix::io::Errno::CHILD) => return Ok(()),
            Err(errno) => return Err(SysError::rustix("waitpid (guardian)")(errno)),
        }
    };
    match status.exit_status() {
        Some(0) => Ok(()),
        Some(errno) => Err(SysError {
            call: "fork (guardian)",
            source: io::Error::from_raw_os_error(errno),
        }),
        None => Err(SysError {
            call: "fork (guardian)",
            source: io::Error::other(format!(
                "the guardian's intermediate process was killed by signal {}",
                status.terminating_signal().unwrap_or(0)
            )),
        }),
    }
}

/// # Safety
/// Only in the freshly forked intermediate process: raw system calls,
/// never returns.
unsafe fn guardian_intermediate(read_fd: libc::c_int, map_fd: libc::c_int, cg: GuardianFds) -> ! {
    // SAFETY: plain system calls; the guardian branch never returns.
    unsafe {
        // A new session and process group, which the guardian inherits: it
        // is out of memtrail's process group before memtrail goes on, and,
        // not a session leader, can never acquire a controlling terminal.
        if libc::setsid() < 0 {
            libc::_exit(*libc::__errno_location());
        }
        match raw_fork() {
            0 => guardian_main(read_fd, map_fd, cg),
            pid if pid < 0 => libc::_exit(*libc::__errno_location()),
            _ => libc::_exit(0),
        }
    }
}

/// # Safety
/// Only in the freshly forked guardian: raw system calls, never returns.
unsafe fn guardian_main(read_fd: libc::c_int, map_fd: libc::c_int, cg: GuardianFds) -> ! {
    // SAFETY: plain system calls on integers and local buffers.
    unsafe {
        for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Keep only the pipe (fd 3), the tracked map (fd 4) and the
        // cgroup's freeze file and parent (fds 5, 6): holding memtrail's
        // other BPF objects would keep them alive. Each is first copied
        // above the targets, so no dup2 closes one not yet moved.
        let high = |fd: libc::c_int| libc::fcntl(fd, libc::F_DUPFD, 64);
        let (pipe, map) = (high(read_fd), high(map_fd));
        let (freeze, parent) = match cg {
            Some((freeze, parent, _)) => (high(freeze), high(parent)),
            None => (-1, -1),
        };
        if pipe < 0 || map < 0 || libc::dup2(pipe, 3) < 0 || libc::dup2(map, 4) < 0 {
            libc::_exit(1);
        }
        if cg.is_some()
            && (freeze < 0 || parent < 0 || libc::dup2(freeze, 5) < 0 || libc::dup2(parent, 6) < 0)
        {
            libc::_exit(1);
        }
        libc::syscall(libc::SYS_close_range, 7u32, u32::MAX, 0u32);
        for fd in 0..3 {
            libc::close(fd);
        }
        let mut byte = 0u8;
        while libc::read(3, (&raw mut byte).cast(), 1) != 0 {
            if *libc::__errno_location() != libc::EINTR {
                break;
            }
        }
        // Thaw first: a frozen process would not act on SIGCONT, and a
        // process held frozen is as stuck as a stopped one.
        if cg.is_some() {
            libc::write(5, b"0".as_ptr().cast(), 1);
        }
        let mut prev = 0u32;
        let mut first = true;
        loop {
            let mut next = 0u32;
            let prev_ptr = if first {
                std::ptr::null()
            } else {
                (&raw const prev).cast::<libc::c_void>()
            };
            if libbpf_sys::bpf_map_get_next_key(4, prev_ptr, (&raw mut next).cast()) != 0 {
                break;
            }
            let pidfd = libc::syscall(libc::SYS_pidfd_open, next as libc::pid_t, 0) as libc::c_int;
            if pidfd >= 0 {
                libc::syscall(
                    libc::SYS_pidfd_send_signal,
                    pidfd,
                    libc::SIGCONT,
                    std::ptr::null::<libc::siginfo_t>(),
                    0,
                );
                libc::close(pidfd);
            }
            prev = next;
            first = false;
        }
        // The cgroup can go once the tree has left it (rmdir fails with
        // EBUSY until then).
        if let Some((_, _, name)) = cg {
            while libc::unlinkat(6, name, libc::AT_REMOVEDIR) < 0
                && *libc::__errno_location() == libc::EBUSY
            {
                let nap = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: 100_000_000,
                };
                libc::nanosleep(&nap, std::ptr::null_mut());
            }
        }
        libc::_exit(0)
    }
}
