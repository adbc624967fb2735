//! Signal dispositions, masks and signalfd, for memtrail's own threads.
//!
//! Raw libc for the dispositions, masks and the signalfd itself: rustix has
//! sigaction and sigprocmask only in its unstable `runtime` API, and no
//! signalfd. Reading the signalfd goes through rustix.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use super::{SysError, SysResult, check};

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
