//! The shim's keeper (issue 40): a process of the command's user that
//! holds the preload shim's memfd, so that a command run as another user
//! than memtrail's (under sudo) can open the shim as
//! `/proc/<keeper>/fd/3`. See [`ShimKeeper::spawn`].
//!
//! ld.so opens an `LD_PRELOAD` entry by path, and a memfd has none but
//! `/proc/<holder>/fd/<n>`, which the kernel lets a process open only if it
//! may read the holder like a debugger (`ptrace_may_access`, read mode:
//! same uid and gid, no capability the opener lacks, the holder dumpable).
//! memtrail (root, or holding capabilities) fails that for the invoking
//! user, or for its own user when it runs with file capabilities; the
//! keeper passes it: its real, effective and saved
//! ids are the user's, it has no capabilities and it is dumpable again. Nothing is written to disk, and nothing outlives the
//! capture: the keeper waits on memtrail's pidfd and exits when memtrail
//! does, SIGKILL included; memtrail kills and reaps it at the end.
//!
//! What the user can reach through it: the shim's bytes (read-only,
//! sealed; memtrail's binary holds them anyway), the keeper's environment
//! and command line (memtrail's, which the command gets too) and, where
//! the user may attach a debugger to its own processes (no Yama, or its
//! `ptrace_scope` 0), the keeper's memory: a copy of memtrail's at start,
//! before the command ran. It holds no other descriptor (all closed), is
//! in a session of its own and ignores the signals a terminal sends.
//!
//! Like the guardian, it is a raw fork with no exit signal (only
//! async-signal-safe calls in the child of a multithreaded process; no
//! wait for any child sees it).

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use super::fd::{pipe, read};
use super::guardian::{raw_fork_silent, reap_silent};
use super::spawn::Credentials;
use super::{Pid, SysError, SysResult};

/// The descriptor the keeper holds the shim at.
const SHIM_FD: libc::c_int = 3;
/// memtrail's pidfd in the keeper.
const MEMTRAIL_FD: libc::c_int = 4;
/// The keeper's end of the pipe it reports on.
const READY_FD: libc::c_int = 5;
/// The keeper's command name.
const KEEPER_NAME: &std::ffi::CStr = c"mt-shim-keeper";
/// The byte the keeper writes once it holds the shim as the user.
const READY: u8 = b'k';

/// capset's header (`struct __user_cap_header_struct`).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

/// capset's sets, one of two 32-bit halves (`struct __user_cap_data_struct`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// `_LINUX_CAPABILITY_VERSION_3`: two [`CapData`].
const CAP_VERSION_3: u32 = 0x2008_0522;

/// A running keeper (see the module docs). Dropping it kills and reaps it.
#[derive(Debug)]
pub struct ShimKeeper {
    pid: Pid,
    pidfd: Option<OwnedFd>,
}

/// What the keeper's child uses after the fork, prepared before it.
struct Raw<'a> {
    shim: libc::c_int,
    memtrail: libc::c_int,
    ready: libc::c_int,
    creds: &'a Credentials,
    /// Whether the ids change (else the groups stay memtrail's: setgroups
    /// needs CAP_SETGID, which memtrail run with file capabilities lacks).
    switch: bool,
}

impl ShimKeeper {
    /// Starts a keeper holding `shim` as the user of `creds`; returns once
    /// it does (its `/proc/PID/fd/3` is then open to that user).
    pub fn spawn(shim: BorrowedFd<'_>, creds: &Credentials) -> SysResult<Self> {
        let memtrail = super::pidfd_open(Pid::new(std::process::id()))?;
        let (ready_r, ready_w) = pipe()?;
        let raw = Raw {
            shim: shim.as_raw_fd(),
            memtrail: memtrail.as_raw_fd(),
            ready: ready_w.as_raw_fd(),
            creds,
            switch: creds.uid != rustix::process::geteuid().as_raw()
                || creds.gid != rustix::process::getegid().as_raw(),
        };
        // SAFETY: the child only makes raw system calls (async-signal-safe)
        // on `raw`, prepared before the fork, and ends with _exit.
        let pid = unsafe { raw_fork_silent() };
        if pid == 0 {
            // SAFETY: in the child; see above.
            unsafe { keeper_main(&raw) }
        }
        if pid < 0 {
            return Err(SysError::last("clone (shim keeper)"));
        }
        drop(ready_w);
        let pid = Pid::new(pid as u32);
        let keeper = Self {
            pid,
            pidfd: super::pidfd_open(pid).ok(),
        };
        let mut msg = [0u8; 5];
        let n = read(&ready_r, &mut msg)?;
        if n == 1 && msg[0] == READY {
            return Ok(keeper);
        }
        let (call, errno) = match (n, msg[0]) {
            (5, stage) => (
                match stage {
                    1 => "setgroups (shim keeper)",
                    2 => "setresgid (shim keeper)",
                    3 => "setresuid (shim keeper)",
                    4 => "capset (shim keeper)",
                    _ => "prctl(PR_SET_DUMPABLE) (shim keeper)",
                },
                i32::from_ne_bytes([msg[1], msg[2], msg[3], msg[4]]),
            ),
            _ => ("dup2 (shim keeper)", libc::EIO),
        };
        Err(SysError {
            call,
            source: std::io::Error::from_raw_os_error(errno),
        })
    }

    /// The path the user opens the shim by.
    pub fn shim_path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/fd/{SHIM_FD}", self.pid))
    }
}

impl Drop for ShimKeeper {
    fn drop(&mut self) {
        if let Some(fd) = &self.pidfd {
            let _ = super::pidfd_send_signal(fd.as_fd(), super::Signal::KILL);
        } else {
            let _ = super::kill(self.pid, super::Signal::KILL);
        }
        reap_silent(self.pid);
    }
}

/// # Safety
/// Only in the freshly forked keeper: raw system calls, never returns.
unsafe fn keeper_main(raw: &Raw<'_>) -> ! {
    // SAFETY: plain system calls on integers, local buffers and the
    // credentials prepared before the fork.
    unsafe {
        // Out of memtrail's session and process group: a terminal's ^C
        // goes to memtrail and the command, not to it.
        libc::setsid();
        for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
            libc::signal(sig, libc::SIG_IGN);
        }
        // Named for what it is in `ps` (its command line stays memtrail's).
        libc::prctl(libc::PR_SET_NAME, KEEPER_NAME.as_ptr(), 0, 0, 0);
        // Its descriptors at fixed numbers, above all three first (none of
        // them is overwritten on the way), every other one closed: it
        // keeps no probe, map or pipe of memtrail's alive.
        let above = raw.shim.max(raw.memtrail).max(raw.ready).max(READY_FD) + 1;
        let moved = [
            libc::dup2(raw.shim, above),
            libc::dup2(raw.memtrail, above + 1),
            libc::dup2(raw.ready, above + 2),
        ];
        if moved.contains(&-1) {
            libc::_exit(1);
        }
        libc::dup2(moved[0], SHIM_FD);
        libc::dup2(moved[1], MEMTRAIL_FD);
        libc::dup2(moved[2], READY_FD);
        libc::syscall(libc::SYS_close_range, 0u32, 2u32, 0u32);
        libc::syscall(libc::SYS_close_range, (READY_FD + 1) as u32, u32::MAX, 0u32);
        let creds = raw.creds;
        let fail = |stage: u8| -> ! {
            let errno = *libc::__errno_location();
            let mut msg = [stage, 0, 0, 0, 0];
            msg[1..].copy_from_slice(&errno.to_ne_bytes());
            libc::write(READY_FD, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        };
        // The system calls themselves, for this thread alone: glibc's
        // wrappers signal every thread they know of to change theirs too,
        // and in this child of a multithreaded memtrail they wait for
        // threads that are not there (the keeper hung in setgroups).
        let groups = creds.groups.as_ptr();
        if raw.switch && libc::syscall(libc::SYS_setgroups, creds.groups.len(), groups) != 0 {
            fail(1);
        }
        let gid = creds.gid;
        if raw.switch && libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0 {
            fail(2);
        }
        // All three uids non-zero: the kernel clears every capability set.
        let uid = creds.uid;
        if raw.switch && libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0 {
            fail(3);
        }
        // No capability left either where the uid did not change (memtrail
        // given file capabilities, the command run as its own user).
        let mut header = CapHeader {
            version: CAP_VERSION_3,
            pid: 0,
        };
        let none = [CapData::default(); 2];
        if libc::syscall(libc::SYS_capset, &raw mut header, none.as_ptr()) != 0 {
            fail(4);
        }
        // The change of ids made it undumpable: /proc/PID/fd would be
        // root's and closed to the user.
        if libc::prctl(libc::PR_SET_DUMPABLE, 1, 0, 0, 0) != 0 {
            fail(5);
        }
        libc::write(READY_FD, [READY].as_ptr().cast(), 1);
        libc::close(READY_FD);
        let mut fds = [libc::pollfd {
            fd: MEMTRAIL_FD,
            events: libc::POLLIN,
            revents: 0,
        }];
        // Readable once memtrail has exited.
        while libc::poll(fds.as_mut_ptr(), 1, -1) < 0 && *libc::__errno_location() == libc::EINTR {}
        libc::_exit(0)
    }
}
