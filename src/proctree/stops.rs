//! Stop ownership: the one place that stops and resumes tracked processes.
//!
//! Several parts of memtrail keep processes of the tracked tree stopped, for
//! their own reasons and at overlapping times: the command until its probes
//! are attached ([`Owner::Startup`]), a process BPF stopped at fork or exec
//! until the attach worker has attached to what it maps ([`Owner::Attach`]),
//! the tree while the rings drain under pressure ([`Owner::Pressure`]).
//! [`Stops`] records which owners hold each process and resumes it when the
//! last one lets go.
//!
//! Invariants:
//! - Signals go through a pidfd opened when the process is first held, never
//!   a bare pid: once the process has exited and been reaped, the signal
//!   fails with ESRCH instead of reaching whoever reuses the pid. ESRCH drops
//!   the entry: a process that exits while held wedges nothing.
//! - Nothing else in memtrail sends SIGCONT to a tracked process. A process
//!   gets one SIGCONT each time its owner set becomes empty, sent by the
//!   release that emptied it, under the lock, after checking that no owner
//!   came back meanwhile. Two owners releasing at once give one SIGCONT,
//!   after both.
//! - Ownership is a set, not a count: an owner that holds a process twice
//!   lets go with one release.
//! - A SIGCONT is sent only once the stop that was asked for has been
//!   generated, or after a bounded wait for it (see below).
//! - memtrail never leaves a held process stopped: dropping [`Stops`]
//!   resumes everything it still holds ([`Stops::resume_everything`]).
//!
//! # The late SIGSTOP
//!
//! BPF stops a process with `bpf_send_signal(SIGSTOP)`, which the kernel may
//! generate later (from irq_work) and the process acts on later still, when
//! it next returns to user mode. Generating SIGCONT discards every pending
//! stop signal of the process and its threads and ends a group stop in
//! progress or done (kernel `prepare_signal`), so resuming is safe as soon
//! as the SIGSTOP exists (pending, or some thread already stopped), and
//! unsafe only before: a SIGSTOP generated after our SIGCONT would leave the
//! process stopped with no owner left to resume it.
//!
//! So the release that empties the owner set drops the lock and waits, with
//! short naps and a bounded timeout, until `/proc/PID/task/*/status` shows
//! the process [`StopState::Stopped`] (every thread stopped),
//! [`StopState::Stopping`] (a SIGSTOP pending, or some threads stopped) or
//! [`StopState::Exited`]. Stopping counts because a process can stay
//! there for as long as something else is held: a vfork parent sleeps
//! uninterruptibly, its SIGSTOP pending, until its child execs or exits, and
//! that child may be held too. Then it takes the lock again: if an owner
//! came back meanwhile the process stays stopped ([`Released::Held`]), if
//! another release took over the resume this one stands down
//! ([`Released::Superseded`]), otherwise it sends SIGCONT
//! ([`Released::Resumed`]). When the stop never shows within the timeout
//! the process is resumed anyway, since a process that was never going to
//! stop must not stay held, and the release says so
//! ([`Released::ResumedUnconfirmed`]): a SIGSTOP generated after that would
//! leave the process stopped.
//!
//! /proc is read by pid; the pidfd is checked alive *after* each read, so a
//! state read while the process was alive is that process's.
//!
//! # Stops that are not ours
//!
//! A process someone else stopped (a `kill -STOP`, a terminal's SIGTSTP, a
//! debugger), before memtrail held it or while it did, stays stopped when
//! memtrail lets go (issue 28: `attach --pressure-timeout inf` resumed a
//! process stopped with `kill -STOP`). BPF's `signal_generate` records such
//! stops in the `foreign_stops` map, and a SIGCONT from anyone else clears
//! them ([`Stops::set_foreign_stops`]); the release that empties the owner
//! set sends no SIGCONT to a process in it ([`Released::LeftStopped`]). A
//! stop from elsewhere generated between that look and our SIGCONT is
//! discarded by the SIGCONT (the kernel drops pending stop signals): the
//! release looks again after it and stops the process once more.
//!
//! Limits: [`Stops::hold_stopped`] and [`Stops::stop`] open the pidfd from
//! the pid, so the process must not have been reaped before they run (a
//! process of the tree is reaped by its parent or by memtrail, the
//! subreaper, after it exited). Without the map (a table made for tests), a
//! stop from elsewhere looks like ours and ends with our SIGCONT. The pids
//! are thread-group ids.
//!
//! Locking: one mutex over the table. Calls hold it only for bookkeeping and
//! single signals, never while waiting for a stop; nothing on the ring
//! pollers' path takes it.

use std::collections::HashMap;
use std::collections::hash_map::Entry as Slot;
use std::fmt;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use crate::engine::idle::IdleWait;
use crate::sys::{self, Pid, Signal, SysError};

/// How long a release waits for a stop to land before resuming anyway.
/// A SIGSTOP lands within microseconds of being generated by BPF; a thread
/// in uninterruptible sleep acts on it when it wakes, but counts as
/// [`StopState::Stopping`] (pending) meanwhile.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(1);

/// Nap between two looks at /proc once spinning is over.
const NAP: Duration = Duration::from_micros(100);

/// Who holds a process stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Owner {
    /// The command, until its probes are attached.
    Startup = 0,
    /// A process BPF stopped at fork or exec, until the attach worker has
    /// attached its probes.
    Attach = 1,
    /// A process paused while the rings drain.
    Pressure = 2,
}

impl Owner {
    pub const ALL: [Self; 3] = [Self::Startup, Self::Attach, Self::Pressure];

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of owners.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Owners(
    /// Bit `1 << owner as u8` set for each owner in the set.
    u8,
);

impl Owners {
    pub const NONE: Self = Self(0);

    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub const fn contains(self, owner: Owner) -> bool {
        self.0 & owner.bit() != 0
    }

    #[must_use]
    pub const fn with(self, owner: Owner) -> Self {
        Self(self.0 | owner.bit())
    }

    #[must_use]
    pub const fn without(self, owner: Owner) -> Self {
        Self(self.0 & !owner.bit())
    }

    pub fn iter(self) -> impl Iterator<Item = Owner> {
        Owner::ALL.into_iter().filter(move |&o| self.contains(o))
    }
}

impl From<Owner> for Owners {
    fn from(owner: Owner) -> Self {
        Self::NONE.with(owner)
    }
}

impl FromIterator<Owner> for Owners {
    fn from_iter<I: IntoIterator<Item = Owner>>(owners: I) -> Self {
        owners.into_iter().fold(Self::NONE, Self::with)
    }
}

impl fmt::Debug for Owners {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.iter()).finish()
    }
}

/// Where a process stands, as /proc shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopState {
    /// No thread stopped and no SIGSTOP pending: resuming now could come
    /// before a late SIGSTOP.
    Running,
    /// A SIGSTOP is pending or some threads are stopped: a group stop is
    /// under way and a SIGCONT now would cancel it.
    Stopping,
    /// Every live thread is stopped (`T`) or ptrace-stopped (`t`).
    Stopped,
    /// Every thread has exited, or the process has been reaped.
    Exited,
}

/// What taking ownership did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Taken {
    /// The process is held; these are its owners now.
    Held(Owners),
    /// The process has exited and been reaped; nothing is held.
    Exited,
}

/// What a release did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Released {
    /// Other owners hold the process (some may have come back while this
    /// release waited for the stop): it stays stopped.
    Held(Owners),
    /// This release resumed the process after seeing its stop.
    Resumed,
    /// This release resumed the process without having seen it stop within
    /// the timeout: a SIGSTOP generated from now on would leave it stopped.
    ResumedUnconfirmed,
    /// While this release waited, an owner took the process and another
    /// release (or [`Stops::resume_everything`]) took over resuming it.
    Superseded,
    /// The process has exited; its entry is gone.
    Exited,
    /// The owner did not hold the process: never held, already released, or
    /// forgotten because it exited.
    NotHeld,
    /// The last owner let go, but someone else stopped the process (see
    /// the module docs): it stays stopped for them to resume.
    LeftStopped,
}

/// Errors stopping or resuming a process.
#[derive(Debug, thiserror::Error)]
pub enum StopsError {
    #[error("stopping or resuming process {pid}")]
    Sys {
        pid: Pid,
        #[source]
        source: SysError,
    },
}

/// The stop owners of every held process. Shared between threads by
/// reference (`&Stops` is enough for every call).
pub struct Stops {
    table: Mutex<Table>,
    /// How long a release waits for the stop to land.
    timeout: Duration,
    /// BPF's `foreign_stops` map: processes someone else stopped.
    foreign: std::sync::OnceLock<OwnedFd>,
}

#[derive(Default)]
struct Table {
    entries: HashMap<Pid, Entry>,
    /// Source of resume tickets. Never reused, so a ticket names one resume
    /// even across entries of the same pid.
    next_ticket: u64,
}

struct Entry {
    /// Opened when the process was first held; shared with a release
    /// waiting for the stop outside the lock.
    pidfd: Arc<OwnedFd>,
    owners: Owners,
    /// Set when `owners` became empty: the ticket of the release that will
    /// resume the process. Cleared when an owner comes back. Only the
    /// holder of the current ticket sends SIGCONT.
    resume: Option<u64>,
}

/// A release's right to resume a process whose owner set it emptied.
struct Claim {
    pid: Pid,
    ticket: u64,
    pidfd: Arc<OwnedFd>,
}

/// One result per process of a call that releases several.
pub type Outcomes = Vec<(Pid, Result<Released, StopsError>)>;

impl Table {
    /// Hands the resume of `pid`, whose owner set is empty, to the caller.
    fn claim(&mut self, pid: Pid, entry_pidfd: Arc<OwnedFd>) -> Claim {
        let ticket = self.next_ticket;
        self.next_ticket += 1;
        if let Some(entry) = self.entries.get_mut(&pid) {
            entry.resume = Some(ticket);
        }
        Claim {
            pid,
            ticket,
            pidfd: entry_pidfd,
        }
    }

    /// Whether `claim` still has the right to resume its process.
    fn is_current(&self, claim: &Claim) -> bool {
        self.entries
            .get(&claim.pid)
            .is_some_and(|e| e.resume == Some(claim.ticket))
    }

    /// Resumes the process of `claim` unless an owner came back or another
    /// release took over, given what was last seen of it.
    fn finish(
        &mut self,
        claim: Claim,
        seen: Result<StopState, SysError>,
        foreign: Option<BorrowedFd<'_>>,
    ) -> Result<Released, StopsError> {
        let pid = claim.pid;
        match self.entries.get(&pid) {
            // Forgotten while we waited: it exited.
            None => return Ok(Released::Exited),
            Some(e) if e.resume != Some(claim.ticket) => {
                return Ok(if e.owners.is_empty() {
                    Released::Superseded
                } else {
                    Released::Held(e.owners)
                });
            }
            Some(_) => {}
        }
        self.entries.remove(&pid);
        let stopped_by_others =
            || foreign.is_some_and(|map| sys::bpf_map_contains(map, &pid.get().to_ne_bytes(), 1));
        if !matches!(seen, Ok(StopState::Exited)) && stopped_by_others() {
            return Ok(Released::LeftStopped);
        }
        let confirmed = match seen {
            Ok(StopState::Exited) => return Ok(Released::Exited),
            Ok(StopState::Running) => false,
            Ok(StopState::Stopping | StopState::Stopped) => true,
            Err(source) => {
                // Still resume: never leave a process stopped.
                let _ = sys::pidfd_send_signal(claim.pidfd.as_fd(), Signal::CONT);
                return Err(StopsError::Sys { pid, source });
            }
        };
        let sent = sys::pidfd_send_signal(claim.pidfd.as_fd(), Signal::CONT);
        // A stop from elsewhere made since the look above was discarded by
        // this SIGCONT: make it again, on its sender's behalf.
        if sent.is_ok() && stopped_by_others() {
            let _ = sys::pidfd_send_signal(claim.pidfd.as_fd(), Signal::STOP);
            return Ok(Released::LeftStopped);
        }
        match sent {
            Ok(()) if confirmed => Ok(Released::Resumed),
            Ok(()) => Ok(Released::ResumedUnconfirmed),
            Err(e) if e.errno() == Some(libc::ESRCH) => Ok(Released::Exited),
            Err(source) => Err(StopsError::Sys { pid, source }),
        }
    }
}

/// Reads where process `pid` (named by `pidfd`) stands.
fn observe(pid: Pid, pidfd: &OwnedFd) -> Result<StopState, SysError> {
    let threads = sys::thread_states(pid);
    // After the read: alive now means alive during the read, so `pid` named
    // the pidfd's process throughout.
    match sys::pidfd_check_alive(pidfd.as_fd()) {
        Ok(()) => {}
        Err(e) if e.errno() == Some(libc::ESRCH) => return Ok(StopState::Exited),
        Err(e) => return Err(e),
    }
    let t = threads?;
    Ok(if t.dead == t.threads {
        StopState::Exited
    } else if t.stopped + t.dead == t.threads {
        StopState::Stopped
    } else if t.stop_pending || t.stopped > 0 {
        StopState::Stopping
    } else {
        StopState::Running
    })
}

impl Stops {
    /// An empty table; releases wait up to [`DEFAULT_TIMEOUT`] for a stop.
    pub fn new() -> Self {
        Self::with_timeout(DEFAULT_TIMEOUT)
    }

    /// An empty table whose releases wait up to `timeout` for a stop.
    pub fn with_timeout(timeout: Duration) -> Self {
        Self {
            table: Mutex::new(Table::default()),
            timeout,
            foreign: std::sync::OnceLock::new(),
        }
    }

    /// Gives the table BPF's `foreign_stops` map (u32 pid -> u8): a process
    /// in it stays stopped when its last owner lets go (see the module
    /// docs). Set once; a second map is ignored.
    pub fn set_foreign_stops(&self, map: OwnedFd) {
        let _ = self.foreign.set(map);
    }

    /// Bookkeeping stays consistent if a holder panicked: every update under
    /// the lock is a single map or field write.
    fn lock(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Makes `owner` hold process `pid`, which something else (BPF's
    /// `bpf_send_signal(SIGSTOP)`) has stopped or is about to stop. Sends
    /// nothing; the process is not resumed before `owner` releases it, even
    /// when a release by another owner is under way.
    pub fn hold_stopped(&self, pid: Pid, owner: Owner) -> Result<Taken, StopsError> {
        self.take(pid, owner, false)
    }

    /// Sends SIGSTOP to process `pid` and makes `owner` hold it. Returns
    /// once the signal is generated, before the process has stopped: see
    /// [`Stops::wait_stopped`].
    pub fn stop(&self, pid: Pid, owner: Owner) -> Result<Taken, StopsError> {
        self.take(pid, owner, true)
    }

    fn take(&self, pid: Pid, owner: Owner, send_stop: bool) -> Result<Taken, StopsError> {
        let mut table = self.lock();
        let entry = match table.entries.entry(pid) {
            Slot::Occupied(slot) => slot.into_mut(),
            Slot::Vacant(slot) => match sys::pidfd_open(pid) {
                Ok(pidfd) => slot.insert(Entry {
                    pidfd: Arc::new(pidfd),
                    owners: Owners::NONE,
                    resume: None,
                }),
                Err(e) if e.errno() == Some(libc::ESRCH) => return Ok(Taken::Exited),
                Err(source) => return Err(StopsError::Sys { pid, source }),
            },
        };
        if send_stop {
            if let Err(e) = sys::pidfd_send_signal(entry.pidfd.as_fd(), Signal::STOP) {
                let gone = e.errno() == Some(libc::ESRCH);
                // Drop the entry if the process is gone, or if it is the one
                // this call just made; otherwise its owners keep it.
                if gone || (entry.owners.is_empty() && entry.resume.is_none()) {
                    table.entries.remove(&pid);
                }
                return if gone {
                    Ok(Taken::Exited)
                } else {
                    Err(StopsError::Sys { pid, source: e })
                };
            }
        }
        entry.owners = entry.owners.with(owner);
        // A release waiting to resume it stands down.
        entry.resume = None;
        Ok(Taken::Held(entry.owners))
    }

    /// Drops `owner`'s hold on process `pid`. The last owner's release
    /// waits (without the lock, up to the timeout) until the stop has
    /// landed, then sends SIGCONT: see the module docs.
    pub fn release(&self, pid: Pid, owner: Owner) -> Result<Released, StopsError> {
        let claim = {
            let mut table = self.lock();
            let Some(entry) = table.entries.get_mut(&pid) else {
                return Ok(Released::NotHeld);
            };
            if !entry.owners.contains(owner) {
                return Ok(Released::NotHeld);
            }
            entry.owners = entry.owners.without(owner);
            if !entry.owners.is_empty() {
                return Ok(Released::Held(entry.owners));
            }
            let pidfd = Arc::clone(&entry.pidfd);
            table.claim(pid, pidfd)
        };
        self.resume(vec![claim], self.timeout)
            .pop()
            .map_or(Ok(Released::NotHeld), |(_, result)| result)
    }

    /// Drops `owner`'s hold on every process it holds, as [`Stops::release`]
    /// does, waiting for all their stops at once. One result per process, by
    /// pid.
    pub fn release_all(&self, owner: Owner) -> Outcomes {
        self.release_all_within(owner, self.timeout)
    }

    /// [`Stops::release_all`] for holds whose stops are known to have been
    /// generated already (the pressure coordinator's, once the tree is
    /// frozen: a BPF self-stop is generated before its program returns), so
    /// a process not seen stopped was resumed by someone else and need not
    /// be waited for.
    pub fn release_all_generated(&self, owner: Owner) -> Outcomes {
        self.release_all_within(owner, Duration::ZERO)
    }

    fn release_all_within(&self, owner: Owner, timeout: Duration) -> Outcomes {
        let mut outcomes = Outcomes::new();
        let mut claims = Vec::new();
        {
            let mut table = self.lock();
            let pids: Vec<Pid> = table
                .entries
                .iter()
                .filter(|(_, e)| e.owners.contains(owner))
                .map(|(&pid, _)| pid)
                .collect();
            for pid in pids {
                let Some(entry) = table.entries.get_mut(&pid) else {
                    continue;
                };
                entry.owners = entry.owners.without(owner);
                if entry.owners.is_empty() {
                    let pidfd = Arc::clone(&entry.pidfd);
                    claims.push(table.claim(pid, pidfd));
                } else {
                    outcomes.push((pid, Ok(Released::Held(entry.owners))));
                }
            }
        }
        outcomes.extend(self.resume(claims, timeout));
        outcomes.sort_by_key(|&(pid, _)| pid);
        outcomes
    }

    /// Releases every owner of every held process, and takes over resumes
    /// other releases are waiting on. For exit paths; [`Drop`] calls it.
    /// One result per process, by pid.
    pub fn resume_everything(&self) -> Outcomes {
        let claims: Vec<Claim> = {
            let mut table = self.lock();
            let held: Vec<(Pid, Arc<OwnedFd>)> = table
                .entries
                .iter_mut()
                .map(|(&pid, e)| {
                    e.owners = Owners::NONE;
                    (pid, Arc::clone(&e.pidfd))
                })
                .collect();
            held.into_iter()
                .map(|(pid, pidfd)| table.claim(pid, pidfd))
                .collect()
        };
        let mut outcomes = self.resume(claims, self.timeout);
        outcomes.sort_by_key(|&(pid, _)| pid);
        outcomes
    }

    /// Waits until each claimed process is safe to resume (or the timeout
    /// passed, or the claim lapsed), then finishes every claim under the
    /// lock.
    fn resume(&self, claims: Vec<Claim>, timeout: Duration) -> Outcomes {
        if claims.is_empty() {
            return Outcomes::new();
        }
        let deadline = Instant::now() + timeout;
        let mut seen: Vec<Result<StopState, SysError>> =
            claims.iter().map(|_| Ok(StopState::Running)).collect();
        let mut waiting: Vec<usize> = (0..claims.len()).collect();
        let mut idle = IdleWait::new(NAP);
        loop {
            {
                // A claim lapses when an owner comes back or another
                // release takes over: no need to wait for its stop.
                let table = self.lock();
                waiting.retain(|&i| table.is_current(&claims[i]));
            }
            waiting.retain(|&i| {
                let claim = &claims[i];
                seen[i] = observe(claim.pid, &claim.pidfd);
                matches!(seen[i], Ok(StopState::Running))
            });
            if waiting.is_empty() || Instant::now() >= deadline {
                break;
            }
            idle.idle();
        }
        let foreign = self.foreign.get().map(AsFd::as_fd);
        let mut table = self.lock();
        claims
            .into_iter()
            .zip(seen)
            .map(|(claim, seen)| (claim.pid, table.finish(claim, seen, foreign)))
            .collect()
    }

    /// Drops the entry of process `pid`, which has exited, without
    /// signaling it. Returns the owners that held it. A release waiting on
    /// it reports [`Released::Exited`].
    pub fn forget(&self, pid: Pid) -> Owners {
        self.lock()
            .entries
            .remove(&pid)
            .map_or(Owners::NONE, |e| e.owners)
    }

    /// The owners holding process `pid` (none when it is not held).
    pub fn held(&self, pid: Pid) -> Owners {
        self.lock()
            .entries
            .get(&pid)
            .map_or(Owners::NONE, |e| e.owners)
    }

    /// Whether a release has emptied the owners of `pid` and is waiting for
    /// its stop before resuming it.
    pub fn is_resuming(&self, pid: Pid) -> bool {
        self.lock()
            .entries
            .get(&pid)
            .is_some_and(|e| e.resume.is_some())
    }

    /// Where held process `pid` stands now; `None` when it is not held.
    pub fn state(&self, pid: Pid) -> Result<Option<StopState>, StopsError> {
        let Some(pidfd) = self.pidfd(pid) else {
            return Ok(None);
        };
        observe(pid, &pidfd)
            .map(Some)
            .map_err(|source| StopsError::Sys { pid, source })
    }

    /// Waits (up to the timeout) until held process `pid` is
    /// [`StopState::Stopped`] or [`StopState::Exited`]; returns the state
    /// last seen, `None` when it is not held.
    pub fn wait_stopped(&self, pid: Pid) -> Result<Option<StopState>, StopsError> {
        self.wait_stopped_until(pid, None)
    }

    /// [`Stops::wait_stopped`], giving up at `deadline` when that comes
    /// before the timeout.
    pub fn wait_stopped_until(
        &self,
        pid: Pid,
        deadline: Option<Instant>,
    ) -> Result<Option<StopState>, StopsError> {
        let Some(pidfd) = self.pidfd(pid) else {
            return Ok(None);
        };
        let timeout = Instant::now() + self.timeout;
        let deadline = deadline.map_or(timeout, |d| d.min(timeout));
        let mut idle = IdleWait::new(NAP);
        loop {
            let state = observe(pid, &pidfd).map_err(|source| StopsError::Sys { pid, source })?;
            if matches!(state, StopState::Stopped | StopState::Exited) || Instant::now() >= deadline
            {
                return Ok(Some(state));
            }
            idle.idle();
        }
    }

    fn pidfd(&self, pid: Pid) -> Option<Arc<OwnedFd>> {
        self.lock().entries.get(&pid).map(|e| Arc::clone(&e.pidfd))
    }
}

impl Default for Stops {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Stops {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let table = self.lock();
        f.debug_map()
            .entries(table.entries.iter().map(|(pid, e)| (pid, e.owners)))
            .finish()
    }
}

impl Drop for Stops {
    /// Resumes every process still held, so that no exit path leaves one
    /// stopped.
    fn drop(&mut self) {
        for (pid, outcome) in self.resume_everything() {
            let pid = pid.get();
            match outcome {
                Ok(Released::ResumedUnconfirmed) => {
                    tracing::warn!(pid, "resumed a held process never seen stopped");
                }
                Err(e) => {
                    tracing::warn!(
                        pid,
                        error = &e as &(dyn std::error::Error + 'static),
                        "could not resume a held process"
                    );
                }
                Ok(_) => {}
            }
        }
    }
}
