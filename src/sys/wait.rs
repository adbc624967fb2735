//! Waiting for children: how they ended ([`ChildExit`]), any child or one.
//!
//! Through rustix's `wait`/`waitpid`. A wait for any child sees only the
//! children that signal their exit (every process of the tree: reparented
//! orphans signal SIGCHLD), not memtrail's guardian, which signals none and
//! which memtrail reaps itself (`sys::Guardian`); a wait for one child
//! (`__WALL`) sees it whatever its exit signal. EINTR retries; a stop or
//! continue report waits on.

use super::{Pid, SysError, SysResult};

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

/// Waits for any child that signals its exit to end. `Ok(None)` when there
/// are no such children left.
pub fn wait_any() -> SysResult<Option<(Pid, ChildExit)>> {
    loop {
        match rustix::process::wait(rustix::process::WaitOptions::empty()) {
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

/// Waits for child `pid` to end and leaves it unreaped (`waitid`'s
/// `WNOWAIT`): a [`wait_pid`] after it reaps the child at once. ECHILD
/// when `pid` is no child (any more).
pub fn wait_exited(pid: Pid) -> SysResult<()> {
    use rustix::process::{WaitId, WaitIdOptions};
    let pid = pid.to_rustix("waitid")?;
    let opts = WaitIdOptions::EXITED
        | WaitIdOptions::NOWAIT
        | WaitIdOptions::from_bits_retain(WAIT_ALL.bits());
    loop {
        match rustix::process::waitid(WaitId::Pid(pid), opts) {
            Err(rustix::io::Errno::INTR) => {}
            done => return done.map(drop).map_err(SysError::rustix("waitid")),
        }
    }
}
