//! Signals sent to memtrail that are meant for the command: SIGTERM, SIGHUP,
//! SIGUSR1 and SIGUSR2.
//!
//! [`catch`] installs one handler for the four before memtrail creates
//! anything, so none of them kills memtrail halfway (with its outputs open
//! and the tree possibly paused). The handler records the signal and, once a
//! [`Forward`] names the command's root process, passes it on through a
//! pidfd (`pidfd_send_signal`, async-signal-safe, and never a recycled pid).
//! The capture reads [`termination`] before starting the command, to give
//! up cleanly; the CLI reports [`notes`] afterwards. The handler writes
//! nothing itself.
//!
//! State (bit `n` stands for signal `n`):
//! - `RECEIVED`: every signal caught.
//! - `UNSENT`: caught and not passed on yet. A signal is passed on at most
//!   once: whoever takes its bit out of `UNSENT` with a swap sends it (the
//!   handler when a target is set, [`Forward::new`] for those caught
//!   before).
//! - `SENT`, `MISSED`: passed on; or caught with no command to pass it to
//!   after it had started (it had exited, or the send failed).
//! - `TARGET`: the root's pidfd, or -1. `IN_HANDLER` counts handlers that may
//!   still use a `TARGET` they read; dropping a [`Forward`] clears `TARGET`,
//!   waits for `IN_HANDLER` to reach 0 and only then closes the pidfd, so no
//!   handler sends through a descriptor number already reused.

use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, AtomicUsize, Ordering::SeqCst};

use super::{SysError, SysResult};

/// The signals memtrail passes on to the command.
pub const FORWARDED: [i32; 4] = [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2];

/// Of [`FORWARDED`], those that end the capture when they come before the
/// command started.
const TERMINATING: [i32; 2] = [libc::SIGTERM, libc::SIGHUP];

static RECEIVED: AtomicU64 = AtomicU64::new(0);
static UNSENT: AtomicU64 = AtomicU64::new(0);
static SENT: AtomicU64 = AtomicU64::new(0);
static MISSED: AtomicU64 = AtomicU64::new(0);
static TARGET: AtomicI32 = AtomicI32::new(-1);
static STARTED: AtomicBool = AtomicBool::new(false);
static IN_HANDLER: AtomicUsize = AtomicUsize::new(0);

const fn bit(sig: i32) -> u64 {
    1 << sig
}

/// Sends every signal in `UNSENT` through `pidfd`. Async-signal-safe.
///
/// A raw syscall rather than rustix's `pidfd_send_signal`: this runs in a
/// signal handler, on a descriptor number held in an atomic, where only
/// async-signal-safe calls on raw integers belong.
fn send_unsent(pidfd: i32) {
    let bits = UNSENT.swap(0, SeqCst);
    for sig in FORWARDED {
        if bits & bit(sig) == 0 {
            continue;
        }
        // SAFETY: pidfd_send_signal takes integers and a NULL siginfo.
        let ret = unsafe {
            libc::syscall(
                libc::SYS_pidfd_send_signal,
                pidfd,
                sig,
                std::ptr::null::<libc::siginfo_t>(),
                0u32,
            )
        };
        if ret == 0 {
            SENT.fetch_or(bit(sig), SeqCst);
        } else {
            MISSED.fetch_or(bit(sig), SeqCst);
        }
    }
}

extern "C" fn on_signal(sig: libc::c_int) {
    // SAFETY: errno is thread-local; the handler restores what it changes.
    let errno = unsafe { *libc::__errno_location() };
    RECEIVED.fetch_or(bit(sig), SeqCst);
    UNSENT.fetch_or(bit(sig), SeqCst);
    IN_HANDLER.fetch_add(1, SeqCst);
    let fd = TARGET.load(SeqCst);
    if fd >= 0 {
        send_unsent(fd);
    } else if STARTED.load(SeqCst) {
        // After the command's end: nothing to pass it to. (A signal caught
        // between STARTED and TARGET is still sent by Forward::new.)
        MISSED.fetch_or(bit(sig), SeqCst);
    }
    IN_HANDLER.fetch_sub(1, SeqCst);
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Installs the handler for [`FORWARDED`] (idempotent). SA_RESTART keeps
/// blocking calls going.
///
/// Raw libc: rustix has sigaction only in its unstable `runtime` API.
pub fn catch() -> SysResult<()> {
    for sig in FORWARDED {
        // SAFETY: a zeroed sigaction with a handler that only makes
        // async-signal-safe calls (atomics, pidfd_send_signal).
        unsafe {
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_signal as *const () as usize;
            act.sa_flags = libc::SA_RESTART;
            libc::sigemptyset(&mut act.sa_mask);
            if libc::sigaction(sig, &act, std::ptr::null_mut()) != 0 {
                return Err(SysError::last("sigaction"));
            }
        }
    }
    Ok(())
}

/// The first terminating signal (SIGTERM, SIGHUP) caught so far.
pub fn termination() -> Option<i32> {
    let received = RECEIVED.load(SeqCst);
    TERMINATING.into_iter().find(|&s| received & bit(s) != 0)
}

/// Passes caught signals on to a process while it lives.
pub struct Forward {
    pidfd: Option<OwnedFd>,
}

impl Forward {
    /// Passes signals on to `pid`, from now until dropped. SIGTERM and
    /// SIGHUP caught before are passed on now; SIGUSR1 and SIGUSR2 caught
    /// before are dropped (they were meant for a command not yet running).
    pub fn new(pid: super::Pid) -> SysResult<Self> {
        let pidfd = super::pidfd_open(pid)?;
        UNSENT.fetch_and(!(bit(libc::SIGUSR1) | bit(libc::SIGUSR2)), SeqCst);
        STARTED.store(true, SeqCst);
        TARGET.store(pidfd.as_raw_fd(), SeqCst);
        send_unsent(pidfd.as_raw_fd());
        Ok(Self { pidfd: Some(pidfd) })
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        TARGET.store(-1, SeqCst);
        // A handler that read the pidfd before the store is counted in
        // IN_HANDLER (its increment comes before its read).
        while IN_HANDLER.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
        drop(self.pidfd.take());
    }
}

/// What became of a caught signal.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Passed on to the command.
    Sent,
    /// Caught before the command started.
    Early,
    /// Caught once the command had exited.
    Late,
}

/// Every caught signal and its fate, in [`FORWARDED`] order.
pub fn notes() -> Vec<(i32, Fate)> {
    let (received, sent, missed) = (
        RECEIVED.load(SeqCst),
        SENT.load(SeqCst),
        MISSED.load(SeqCst),
    );
    FORWARDED
        .into_iter()
        .filter(|&s| received & bit(s) != 0)
        .map(|s| {
            let fate = if sent & bit(s) != 0 {
                Fate::Sent
            } else if missed & bit(s) != 0 {
                Fate::Late
            } else {
                Fate::Early
            };
            (s, fate)
        })
        .collect()
}

/// The signal's name, as `kill -l` gives it with its SIG prefix.
pub fn name(sig: i32) -> String {
    match sig {
        libc::SIGTERM => "SIGTERM".into(),
        libc::SIGHUP => "SIGHUP".into(),
        libc::SIGUSR1 => "SIGUSR1".into(),
        libc::SIGUSR2 => "SIGUSR2".into(),
        n => format!("signal {n}"),
    }
}

/// Blocks [`FORWARDED`] in the calling thread; returns the previous mask.
/// Around a fork, so the child never runs memtrail's handler.
///
/// Raw libc (here and in [`restore_mask`], which the forked child calls):
/// rustix has sigprocmask only in its unstable `runtime` API.
pub fn block_forwarded() -> SysResult<libc::sigset_t> {
    // SAFETY: sigset_t values initialised by sigemptyset before use.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in FORWARDED {
            libc::sigaddset(&mut set, sig);
        }
        let ret = libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        if ret != 0 {
            return Err(SysError {
                call: "pthread_sigmask",
                source: std::io::Error::from_raw_os_error(ret),
            });
        }
        Ok(old)
    }
}

/// Restores a mask [`block_forwarded`] returned. Async-signal-safe.
pub fn restore_mask(old: &libc::sigset_t) {
    // SAFETY: `old` is a mask pthread_sigmask filled in; sigprocmask is one
    // rt_sigprocmask call on the calling thread.
    unsafe { libc::sigprocmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}
