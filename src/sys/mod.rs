//! The only place that issues raw system calls.
//!
//! Each wrapper names its call in the error and keeps the `io::Error` as the
//! source. Callers above this module see safe functions only.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

pub mod signals;

/// A failed system call: its name and the OS error.
#[derive(Debug, thiserror::Error)]
#[error("{call} failed")]
pub struct SysError {
    pub call: &'static str,
    #[source]
    pub source: io::Error,
}

impl SysError {
    fn last(call: &'static str) -> Self {
        Self {
            call,
            source: io::Error::last_os_error(),
        }
    }

    /// Wraps the error rustix returned for `call`.
    fn rustix(call: &'static str) -> impl FnOnce(rustix::io::Errno) -> Self {
        move |errno| Self {
            call,
            source: errno.into(),
        }
    }

    /// The OS error number.
    pub fn errno(&self) -> Option<i32> {
        self.source.raw_os_error()
    }
}

pub type SysResult<T> = Result<T, SysError>;

pub use rustix::process::Signal;

/// A process or thread id, as memtrail meets them: a `u32` in BPF maps and
/// records, in `/proc` and on the command line.
///
/// A newtype rather than rustix's `Pid`: that one is a signed `NonZeroI32`
/// without `Ord` (the stop table sorts its outcomes by pid), so each `u32`
/// memtrail holds would need a fallible conversion at its call site. Here
/// the conversion happens once, in [`Pid::to_rustix`], inside this module:
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
    fn to_rustix(self, call: &'static str) -> SysResult<rustix::process::Pid> {
        i32::try_from(self.0)
            .ok()
            .and_then(rustix::process::Pid::from_raw)
            .ok_or(SysError {
                call,
                source: io::Error::from_raw_os_error(libc::EINVAL),
            })
    }

    fn from_rustix(pid: rustix::process::Pid) -> Self {
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

fn check(call: &'static str, ret: libc::c_int) -> SysResult<libc::c_int> {
    if ret < 0 {
        Err(SysError::last(call))
    } else {
        Ok(ret)
    }
}

/// Makes this process the reaper of its orphaned descendants, so that every
/// process of the tracked tree is eventually waited for by us.
pub fn set_child_subreaper() -> SysResult<()> {
    // Any non-zero value sets the flag; rustix passes the pid's number.
    rustix::process::set_child_subreaper(Some(rustix::process::getpid()))
        .map_err(SysError::rustix("prctl(PR_SET_CHILD_SUBREAPER)"))
}

/// How a waited-for child ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChildExit {
    Exited(i32),
    Signaled(i32),
}

impl ChildExit {
    /// The shell's convention: the exit code, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Self::Exited(code) => code,
            Self::Signaled(sig) => 128 + sig,
        }
    }
}

/// `waitpid`'s `__WALL`: wait for every kind of child, clone children too.
const WAIT_ALL: rustix::process::WaitOptions =
    rustix::process::WaitOptions::from_bits_retain(libc::__WALL as u32);

impl ChildExit {
    /// How the child ended, or `None` for a stop or continue report.
    fn from_status(status: rustix::process::WaitStatus) -> Option<Self> {
        status
            .exit_status()
            .map(Self::Exited)
            .or_else(|| status.terminating_signal().map(Self::Signaled))
    }
}

/// Waits for any child to end. `Ok(None)` when there are no children left.
pub fn wait_any() -> SysResult<Option<(Pid, ChildExit)>> {
    loop {
        match rustix::process::wait(WAIT_ALL) {
            Ok(Some((pid, status))) => {
                if let Some(exit) = ChildExit::from_status(status) {
                    return Ok(Some((Pid::from_rustix(pid), exit)));
                }
            }
            // Only with WNOHANG, which we do not pass.
            Ok(None) => {}
            Err(rustix::io::Errno::INTR) => {}
            Err(rustix::io::Errno::CHILD) => return Ok(None),
            Err(errno) => return Err(SysError::rustix("waitpid")(errno)),
        }
    }
}

/// Sends `sig` to `pid`.
pub fn kill(pid: Pid, sig: Signal) -> SysResult<()> {
    rustix::process::kill_process(pid.to_rustix("kill")?, sig).map_err(SysError::rustix("kill"))
}

/// A pipe whose ends are closed on exec.
pub fn pipe() -> SysResult<(OwnedFd, OwnedFd)> {
    rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC).map_err(SysError::rustix("pipe2"))
}

/// Reads into `buf`, retrying on EINTR. Returns the bytes read (0 at EOF).
pub fn read(fd: &OwnedFd, buf: &mut [u8]) -> SysResult<usize> {
    loop {
        match rustix::io::read(fd, &mut *buf) {
            Err(rustix::io::Errno::INTR) => {}
            done => return done.map_err(SysError::rustix("read")),
        }
    }
}

/// Writes all of `buf`.
pub fn write_all(fd: &OwnedFd, mut buf: &[u8]) -> SysResult<()> {
    while !buf.is_empty() {
        match rustix::io::write(fd, buf) {
            Ok(n) => buf = &buf[n..],
            Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(SysError::rustix("write")(errno)),
        }
    }
    Ok(())
}

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

/// Sets the disposition of `sig` to ignore.
///
/// Raw libc: rustix has sigaction only in its unstable `runtime` API.
pub fn ignore_signal(sig: i32) -> SysResult<()> {
    // SAFETY: installs SIG_IGN; no handler code runs.
    if unsafe { libc::signal(sig, libc::SIG_IGN) } == libc::SIG_ERR {
        return Err(SysError::last("signal"));
    }
    Ok(())
}

/// Mounts tracefs at /sys/kernel/tracing when it is not mounted yet:
/// libbpf resolves syscall tracepoint ids through it.
pub fn ensure_tracefs() -> SysResult<()> {
    let probe = Path::new("/sys/kernel/tracing/events");
    match std::fs::metadata(probe) {
        Ok(_) => return Ok(()),
        // Mounted, but not ours to search (mode 0700, root's).
        Err(err) if err.kind() == io::ErrorKind::PermissionDenied => {
            return Err(SysError {
                call: "stat(/sys/kernel/tracing/events)",
                source: err,
            });
        }
        Err(_) => {}
    }
    rustix::mount::mount(
        "tracefs",
        "/sys/kernel/tracing",
        "tracefs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .map_err(SysError::rustix("mount(tracefs)"))
}

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

/// Attaches the BPF program `prog` to `offsets` of the file at `path` in
/// every process, as one uprobe_multi link (uretprobes with `retprobe`),
/// each offset with its BPF cookie. Closing the returned fd detaches.
///
/// A raw `BPF_LINK_CREATE` rather than libbpf-rs's
/// `ProgramMut::attach_uprobe_multi_with_opts`: that one needs the
/// skeleton's program object, which is `!Send` and lives on the session's
/// thread, while links are made on the attach worker, which holds only
/// program fds (sendable, dup'ed); and its link owns the program borrow,
/// where memtrail keeps links as plain fds it can close from any thread.
pub fn uprobe_multi(
    prog: std::os::fd::BorrowedFd<'_>,
    path: &Path,
    offsets: &[u64],
    cookies: &[u64],
    retprobe: bool,
) -> SysResult<OwnedFd> {
    use std::os::unix::ffi::OsStrExt;
    assert_eq!(offsets.len(), cookies.len(), "one cookie per offset");
    let path = CString::new(path.as_os_str().as_bytes()).map_err(|_| SysError {
        call: "bpf(BPF_LINK_CREATE)",
        source: io::Error::new(io::ErrorKind::InvalidInput, "NUL in path"),
    })?;
    let offsets: Vec<libc::c_ulong> = offsets.iter().map(|&o| o as libc::c_ulong).collect();
    // SAFETY: an all-zero bpf_link_create_opts is its documented default.
    let mut opts: libbpf_sys::bpf_link_create_opts = unsafe { std::mem::zeroed() };
    opts.sz = std::mem::size_of::<libbpf_sys::bpf_link_create_opts>() as _;
    opts.__bindgen_anon_1.uprobe_multi =
        libbpf_sys::bpf_link_create_opts__bindgen_ty_1__bindgen_ty_3 {
            flags: if retprobe {
                libbpf_sys::BPF_F_UPROBE_MULTI_RETURN
            } else {
                0
            },
            cnt: offsets.len() as u32,
            path: path.as_ptr(),
            offsets: offsets.as_ptr(),
            ref_ctr_offsets: std::ptr::null(),
            cookies: cookies.as_ptr(),
            pid: 0,
            __bindgen_padding_0: [0; 4],
        };
    // SAFETY: every pointer in opts points to live data of `cnt` entries
    // (or the NUL-terminated path) for the duration of the call.
    let fd = unsafe {
        libbpf_sys::bpf_link_create(
            prog.as_raw_fd(),
            0,
            libbpf_sys::BPF_TRACE_UPROBE_MULTI,
            &opts,
        )
    };
    if fd < 0 {
        return Err(SysError {
            call: "bpf(BPF_LINK_CREATE, uprobe_multi)",
            source: io::Error::from_raw_os_error(-fd),
        });
    }
    // SAFETY: bpf_link_create returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Updates `key` to `value` in the BPF map behind `map`.
pub fn bpf_map_update(map: std::os::fd::BorrowedFd<'_>, key: &[u8], value: &[u8]) -> SysResult<()> {
    // SAFETY: key and value are valid for the map's key and value sizes,
    // which the caller matches; the kernel copies them.
    let ret = unsafe {
        libbpf_sys::bpf_map_update_elem(
            map.as_raw_fd(),
            key.as_ptr().cast(),
            value.as_ptr().cast(),
            libbpf_sys::BPF_ANY.into(),
        )
    };
    if ret < 0 {
        return Err(SysError {
            call: "bpf(BPF_MAP_UPDATE_ELEM)",
            source: io::Error::from_raw_os_error(-ret),
        });
    }
    Ok(())
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

/// Deletes `key` from a BPF map (a missing key is not an error).
pub fn bpf_map_delete(map: std::os::fd::BorrowedFd<'_>, key: &[u8]) -> SysResult<()> {
    // SAFETY: key is valid for the map's key size, which the caller
    // matches; the kernel copies it.
    let ret = unsafe { libbpf_sys::bpf_map_delete_elem(map.as_raw_fd(), key.as_ptr().cast()) };
    if ret < 0 && -ret != libc::ENOENT {
        return Err(SysError {
            call: "bpf(BPF_MAP_DELETE_ELEM)",
            source: io::Error::from_raw_os_error(-ret),
        });
    }
    Ok(())
}

/// A file's identity as the kernel's BPF programs see it: (`s_dev` in the
/// kernel's encoding, major << 20 | minor, inode).
pub fn kernel_file_id(path: &Path) -> io::Result<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let md = std::fs::metadata(path)?;
    let dev = md.dev();
    Ok((
        u64::from(libc::major(dev)) << 20 | u64::from(libc::minor(dev)),
        md.ino(),
    ))
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

/// Waits for child `pid` to end (and reaps it).
pub fn wait_pid(pid: Pid) -> SysResult<ChildExit> {
    let pid = pid.to_rustix("waitpid")?;
    loop {
        match rustix::process::waitpid(Some(pid), WAIT_ALL) {
            Ok(Some((_, status))) => {
                if let Some(exit) = ChildExit::from_status(status) {
                    return Ok(exit);
                }
            }
            Ok(None) | Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(SysError::rustix("waitpid")(errno)),
        }
    }
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

/// Keys of a BPF hash map whose keys are `u32` (the tracked-process map).
pub fn bpf_map_u32_keys(map: std::os::fd::BorrowedFd<'_>) -> SysResult<Vec<u32>> {
    let mut keys = Vec::new();
    let mut prev: Option<u32> = None;
    loop {
        let mut next = 0u32;
        let prev_ptr = prev.as_ref().map_or(std::ptr::null(), |p| {
            std::ptr::from_ref(p).cast::<libc::c_void>()
        });
        // SAFETY: key pointers are valid u32s (or NULL for the first key),
        // the map's key size.
        let ret = unsafe {
            libbpf_sys::bpf_map_get_next_key(map.as_raw_fd(), prev_ptr, (&raw mut next).cast())
        };
        if ret == -libc::ENOENT {
            return Ok(keys);
        }
        if ret < 0 {
            return Err(SysError {
                call: "bpf(BPF_MAP_GET_NEXT_KEY)",
                source: io::Error::from_raw_os_error(-ret),
            });
        }
        keys.push(next);
        prev = Some(next);
    }
}

/// Whether this process is a child subreaper (`PR_GET_CHILD_SUBREAPER`).
fn is_child_subreaper() -> SysResult<bool> {
    rustix::process::child_subreaper()
        .map(|flag| flag.is_some())
        .map_err(SysError::rustix("prctl(PR_GET_CHILD_SUBREAPER)"))
}

/// Clears this process's child-subreaper flag.
fn clear_child_subreaper() -> SysResult<()> {
    rustix::process::set_child_subreaper(None)
        .map_err(SysError::rustix("prctl(PR_SET_CHILD_SUBREAPER, 0)"))
}

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

/// A non-blocking, close-on-exec eventfd.
pub fn eventfd() -> SysResult<OwnedFd> {
    use rustix::event::EventfdFlags;
    rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
        .map_err(SysError::rustix("eventfd"))
}

/// Adds 1 to an eventfd's counter, waking its waiters.
pub fn eventfd_signal(fd: std::os::fd::BorrowedFd<'_>) {
    // A full counter (EAGAIN) already means "signalled".
    let _ = rustix::io::write(fd, &1u64.to_ne_bytes());
}

/// An epoll instance waiting for input on `fds`; `edge[i]` makes fd i
/// edge-triggered (for an eventfd shared by several waiters, never read).
pub fn epoll_for(fds: &[(std::os::fd::BorrowedFd<'_>, bool)]) -> SysResult<OwnedFd> {
    use rustix::event::epoll;
    let ep =
        epoll::create(epoll::CreateFlags::CLOEXEC).map_err(SysError::rustix("epoll_create1"))?;
    for (i, (fd, edge)) in fds.iter().enumerate() {
        let mut flags = epoll::EventFlags::IN;
        if *edge {
            flags |= epoll::EventFlags::ET;
        }
        epoll::add(&ep, fd, epoll::EventData::new_u64(i as u64), flags)
            .map_err(SysError::rustix("epoll_ctl"))?;
    }
    Ok(ep)
}

/// Waits on an epoll instance for at most `timeout`, to the nanosecond:
/// with rustix's `linux_5_11` feature, its `epoll::wait` is always
/// epoll_pwait2 (without it, timeouts are rounded up to milliseconds).
/// EINTR is a wakeup. Where the kernel lacks epoll_pwait2 (before 5.11),
/// sleeps `timeout` instead.
pub fn epoll_wait_for(ep: std::os::fd::BorrowedFd<'_>, timeout: std::time::Duration) {
    let ts = rustix::event::Timespec {
        tv_sec: timeout.as_secs() as rustix::event::Secs,
        tv_nsec: timeout.subsec_nanos().into(),
    };
    let mut events = [std::mem::MaybeUninit::uninit(); 4];
    if let Err(rustix::io::Errno::NOSYS) = rustix::event::epoll::wait(ep, &mut events, Some(&ts)) {
        std::thread::sleep(timeout);
    }
}

/// Waits on an epoll instance for at most `timeout_ms` (forever when
/// negative); EINTR is a wakeup.
pub fn epoll_wait(ep: std::os::fd::BorrowedFd<'_>, timeout_ms: i32) {
    match u64::try_from(timeout_ms) {
        Ok(ms) => epoll_wait_for(ep, std::time::Duration::from_millis(ms)),
        Err(_) => {
            let mut events = [std::mem::MaybeUninit::uninit(); 4];
            let _ = rustix::event::epoll::wait(ep, &mut events, None);
        }
    }
}

/// Blocks `signals` in the calling thread (threads it starts from now on
/// inherit the mask), so that only a [`signalfd`] receives them.
///
/// Raw libc: rustix has sigprocmask only in its unstable `runtime` API.
pub fn block_signals(signals: &[i32]) -> SysResult<()> {
    // SAFETY: a sigset_t initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &sig in signals {
            libc::sigaddset(&mut set, sig);
        }
        let ret = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if ret != 0 {
            return Err(SysError {
                call: "pthread_sigmask",
                source: io::Error::from_raw_os_error(ret),
            });
        }
    }
    Ok(())
}

/// A non-blocking, close-on-exec signalfd for `signals` (which must be
/// blocked: see [`block_signals`]).
///
/// Raw libc: rustix has no signalfd.
pub fn signalfd(signals: &[i32]) -> SysResult<OwnedFd> {
    // SAFETY: a sigset_t initialised by sigemptyset before use; signalfd
    // copies it.
    let fd = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &sig in signals {
            libc::sigaddset(&mut set, sig);
        }
        libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK)
    };
    let fd = check("signalfd", fd)?;
    // SAFETY: signalfd returned a new descriptor that we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Reads one signal from a signalfd; None when none is pending.
pub fn read_signal(fd: std::os::fd::BorrowedFd<'_>) -> SysResult<Option<i32>> {
    // A signalfd_siginfo, whose first field is `ssi_signo: u32`.
    let mut info = [0u8; std::mem::size_of::<libc::signalfd_siginfo>()];
    match rustix::io::read(fd, &mut info) {
        Ok(n) if n == info.len() => {
            let signo = u32::from_ne_bytes(info[..4].try_into().expect("4 bytes"));
            Ok(Some(signo as i32))
        }
        Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(None),
        Err(errno) => Err(SysError::rustix("read(signalfd)")(errno)),
    }
}

/// Waits until one of `fds` is readable, or `timeout` has passed: the
/// index of the first readable one, or None at the timeout. EINTR waits
/// again for what is left of the timeout.
pub fn poll_readable(
    fds: &[std::os::fd::BorrowedFd<'_>],
    timeout: Option<std::time::Duration>,
) -> SysResult<Option<usize>> {
    use rustix::event::{PollFd, PollFlags, Timespec};
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    let mut pfds: Vec<PollFd<'_>> = fds
        .iter()
        .map(|fd| PollFd::new(fd, PollFlags::IN))
        .collect();
    loop {
        let left = deadline.map(|d| {
            let left = d.saturating_duration_since(std::time::Instant::now());
            Timespec {
                tv_sec: left.as_secs() as rustix::event::Secs,
                tv_nsec: left.subsec_nanos().into(),
            }
        });
        match rustix::event::poll(&mut pfds, left.as_ref()) {
            Ok(0) => {
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    return Ok(None);
                }
            }
            Ok(_) => return Ok(pfds.iter().position(|p| !p.revents().is_empty())),
            Err(rustix::io::Errno::INTR) => {}
            Err(errno) => return Err(SysError::rustix("poll")(errno)),
        }
    }
}
