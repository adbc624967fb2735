//! Starting the command: the identity it runs under ([`Credentials`]), a
//! fork that holds the child before exec ([`fork_held`]) until the parent
//! registered its pid, and why an exec failed.
//!
//! The child between fork and exec makes raw, async-signal-safe libc calls
//! only, on data prepared before the fork; that is why this module keeps
//! libc where the rest of `sys` uses rustix.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};

use super::fd::{pipe, read, write_all};
use super::{Pid, SysError, SysResult, signals};

/// Identity the command runs under when memtrail was started through sudo.
#[derive(Clone, Debug)]
pub struct Credentials {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<libc::gid_t>,
    /// The user's passwd entry, when there is one: login name, home
    /// directory and shell.
    pub user: Option<PasswdEntry>,
}

/// What the command's environment takes from the user's passwd entry.
#[derive(Clone, Debug)]
pub struct PasswdEntry {
    pub name: OsString,
    pub home: OsString,
    pub shell: OsString,
}

impl Credentials {
    /// The passwd entry and supplementary groups of `uid`, for `setgroups`
    /// and the environment of the child.
    ///
    /// Raw libc: getpwuid_r and getgrouplist go through NSS (glibc's name
    /// services), which rustix does not cover.
    pub fn for_user(uid: u32, gid: u32) -> SysResult<Self> {
        use std::os::unix::ffi::OsStrExt;
        let os = |p: *const libc::c_char| {
            if p.is_null() {
                OsString::new()
            } else {
                // SAFETY: a non-NULL field of the passwd entry getpwuid_r
                // filled: a NUL-terminated string in `buf`, alive here.
                OsStr::from_bytes(unsafe { CStr::from_ptr(p) }.to_bytes()).to_owned()
            }
        };
        let mut buf = vec![0 as libc::c_char; 16 * 1024];
        // SAFETY: all-zero is a valid passwd (NULL pointers, zero ids).
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut out = std::ptr::null_mut();
        // SAFETY: getpwuid_r with a buffer we own; the result points into it.
        let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut out) };
        let user = (rc == 0 && !out.is_null()).then(|| PasswdEntry {
            name: os(pwd.pw_name),
            home: os(pwd.pw_dir),
            shell: os(pwd.pw_shell),
        });
        let mut groups = vec![gid];
        if let Some(user) = &user
            && let Ok(name) = CString::new(user.name.as_bytes())
        {
            let mut n: libc::c_int = 256;
            let mut list = vec![0 as libc::gid_t; n as usize];
            // SAFETY: `list` has room for `n` entries; getgrouplist updates n.
            let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, list.as_mut_ptr(), &mut n) };
            if rc >= 0 {
                list.truncate(n as usize);
                groups = list;
            }
        }
        Ok(Self {
            uid,
            gid,
            groups,
            user,
        })
    }
}

impl Credentials {
    /// memtrail's own real ids and supplementary groups (no passwd entry).
    pub fn own() -> Self {
        Self {
            uid: rustix::process::getuid().as_raw(),
            gid: rustix::process::getgid().as_raw(),
            groups: rustix::process::getgroups()
                .map(|groups| groups.into_iter().map(|g| g.as_raw()).collect())
                .unwrap_or_default(),
            user: None,
        }
    }
}

/// Everything the child needs after fork, prepared before it: the child may
/// only make async-signal-safe calls.
pub struct ExecPlan {
    pub path: CString,
    pub argv: Vec<CString>,
    pub creds: Option<Credentials>,
    /// The command's environment (`NAME=value` each); memtrail's own when
    /// `None`.
    pub env: Option<Vec<CString>>,
}

/// A forked child that waits for `release` before it execs.
pub struct HeldChild {
    pub pid: Pid,
    go: OwnedFd,
    err: OwnedFd,
}

/// Forks a child that blocks until [`HeldChild::release`], then execs the
/// plan, so the parent can register its pid before its first instruction.
///
/// Raw libc: rustix has no fork outside its unstable `runtime` API, and the
/// child between fork and exec makes async-signal-safe libc calls only.
pub fn fork_held(plan: &ExecPlan) -> SysResult<HeldChild> {
    let (go_r, go_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let mut argv: Vec<*const libc::c_char> = plan.argv.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    let envp: Option<Vec<*const libc::c_char>> = plan.env.as_ref().map(|env| {
        env.iter()
            .map(|e| e.as_ptr())
            .chain([std::ptr::null()])
            .collect()
    });
    // The child must not run memtrail's handler for the signals it passes
    // on (its copy of the handler would swallow them): they stay blocked
    // in the child until its dispositions are the defaults again.
    let mask = signals::block_forwarded()?;
    // SAFETY: the child only calls async-signal-safe functions (read,
    // sigaction, sigprocmask, setgroups, setgid, setuid, execv(e), write,
    // _exit) on data prepared before the fork, then execs or exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: see above; this branch never returns.
        unsafe {
            child_after_fork(
                plan,
                &argv,
                envp.as_deref(),
                &mask,
                go_r.as_raw_fd(),
                go_w.as_raw_fd(),
                err_w.as_raw_fd(),
            )
        }
    }
    signals::restore_mask(&mask);
    if pid < 0 {
        return Err(SysError::last("fork"));
    }
    drop(go_r);
    drop(err_w);
    Ok(HeldChild {
        // Positive: the parent's return of a successful fork.
        pid: Pid::new(pid.unsigned_abs()),
        go: go_w,
        err: err_r,
    })
}

/// # Safety
/// Must run in a freshly forked child: it only makes async-signal-safe calls
/// and never returns.
unsafe fn child_after_fork(
    plan: &ExecPlan,
    argv: &[*const libc::c_char],
    envp: Option<&[*const libc::c_char]>,
    mask: &libc::sigset_t,
    go: libc::c_int,
    go_w: libc::c_int,
    err: libc::c_int,
) -> ! {
    let fail = |stage: u8| -> ! {
        let errno = io::Error::last_os_error().raw_os_error().unwrap_or(0);
        let mut msg = [0u8; 5];
        msg[0] = stage;
        msg[1..].copy_from_slice(&errno.to_ne_bytes());
        // SAFETY: write and _exit are async-signal-safe.
        unsafe {
            libc::write(err, msg.as_ptr().cast(), msg.len());
            libc::_exit(127)
        }
    };
    let mut byte = 0u8;
    // Its copy of the pipe's write end goes, so that the parent's is the
    // last: a parent that drops it unreleased (a failed start) ends the
    // wait below with EOF instead of leaving it blocked for ever.
    // SAFETY: close is async-signal-safe; the fd is this process's copy.
    unsafe { libc::close(go_w) };
    // SAFETY: reading one byte into a local.
    if unsafe { libc::read(go, (&raw mut byte).cast(), 1) } != 1 {
        // The parent went away before releasing us.
        // SAFETY: _exit is async-signal-safe.
        unsafe { libc::_exit(127) }
    }
    // memtrail ignores SIGINT/SIGQUIT (and Rust SIGPIPE) and catches the
    // signals it passes on; the command gets the defaults back, then the
    // signal mask memtrail had (a signal passed on meanwhile is delivered
    // now, with its default action).
    for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGPIPE]
        .into_iter()
        .chain(signals::FORWARDED)
    {
        // SAFETY: signal() with SIG_DFL is async-signal-safe in practice
        // (a single rt_sigaction call in glibc).
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    signals::restore_mask(mask);
    if let Some(creds) = &plan.creds {
        // SAFETY: plain syscalls on prepared data.
        unsafe {
            if libc::setgroups(creds.groups.len(), creds.groups.as_ptr()) != 0 {
                fail(1);
            }
            if libc::setgid(creds.gid) != 0 {
                fail(1);
            }
            if libc::setuid(creds.uid) != 0 {
                fail(1);
            }
        }
    }
    match envp {
        // SAFETY: path, argv and envp are NUL-terminated and argv and envp
        // end with NULL.
        Some(envp) => unsafe { libc::execve(plan.path.as_ptr(), argv.as_ptr(), envp.as_ptr()) },
        // SAFETY: path and argv are NUL-terminated and argv ends with NULL.
        None => unsafe { libc::execv(plan.path.as_ptr(), argv.as_ptr()) },
    };
    fail(2)
}

/// Why a held child did not start its command.
#[derive(Debug, thiserror::Error)]
pub enum ExecFailure {
    #[error("could not switch to the invoking user's identity")]
    Credentials(#[source] io::Error),
    #[error("execve failed")]
    Exec(#[source] io::Error),
    #[error(transparent)]
    Sys(#[from] SysError),
}

impl HeldChild {
    /// Lets the child exec, and waits until the exec either happened or
    /// failed.
    pub fn release(self) -> Result<Pid, ExecFailure> {
        write_all(&self.go, &[1])?;
        let mut msg = [0u8; 5];
        let n = read(&self.err, &mut msg)?;
        if n == 0 {
            // The close-on-exec error pipe closed: the exec happened.
            return Ok(self.pid);
        }
        let errno = i32::from_ne_bytes(msg[1..5].try_into().expect("4 bytes"));
        let err = io::Error::from_raw_os_error(errno);
        Err(match msg[0] {
            1 => ExecFailure::Credentials(err),
            _ => ExecFailure::Exec(err),
        })
    }
}
