//! The pressure coordinator ([`Coordinator`], one thread): it sees BPF's
//! latch, pauses the tree (a cgroup freeze, or SIGSTOPs through
//! [`Stops`]), drains every pipeline through the epoch barrier, resumes the
//! tree within the timeout, and fails naming what was late
//! ([`PressureError`]). The module's docs say how a pause stays lossless.

use std::collections::HashSet;
use std::fmt;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::PressureTimeout;
use crate::bpf::bss::BssWord;
use crate::engine::Barrier;
use crate::proctree::cgroup::TreeCgroup;
use crate::proctree::stops::{Owner, StopState, Stops};
use crate::profile::PressureStats;
use crate::ring::RingConsumer;
use crate::sys;

/// Longest sleep of the coordinator between two looks at the latch and the
/// end of the tree (it is woken for both).
const LATCH_CHECK_MS: i32 = 100;
/// Why a pressure episode failed.
#[derive(Debug, thiserror::Error)]
pub enum PressureError {
    #[error(
        "a pressure episode did not recover within {timeout:?}: the {pipeline} pipeline did \
         not drain; {fate}"
    )]
    Timeout {
        timeout: Duration,
        pipeline: String,
        fate: Fate,
    },
    #[error(
        "a pressure episode did not recover within {timeout:?}: the tree did not pause \
         ({what}); {fate}"
    )]
    PauseTimeout {
        timeout: Duration,
        what: String,
        fate: Fate,
    },
    #[error(
        "a pressure pause lasted {paused:?}, longer than the {timeout:?} of \
         --pressure-timeout: memtrail could not resume the tree in time (its own threads \
         were late: a loaded machine?); {fate}"
    )]
    ResumeTimeout {
        timeout: Duration,
        paused: Duration,
        fate: Fate,
    },
    #[error("pausing the tree through its cgroup failed")]
    Cgroup(#[from] crate::proctree::cgroup::CgroupError),
    #[error(transparent)]
    Sys(#[from] sys::SysError),
}

/// What became of the tree after a late pressure episode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fate {
    /// Killed (`memtrail run`: memtrail started it).
    Killed,
    /// Resumed and left running; the capture ends (`memtrail attach`).
    Detached,
}

impl fmt::Display for Fate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Killed => "the tracked tree was killed",
            Self::Detached => {
                "memtrail resumed the tracked processes and detached, leaving them running"
            }
        })
    }
}

impl PressureError {
    /// Whether the tree was left running (a detach) rather than killed.
    pub fn detached(&self) -> bool {
        matches!(
            self,
            Self::Timeout {
                fate: Fate::Detached,
                ..
            } | Self::PauseTimeout {
                fate: Fate::Detached,
                ..
            } | Self::ResumeTimeout {
                fate: Fate::Detached,
                ..
            }
        )
    }
}

/// When the latched episode began (`bpf_ktime_get_ns()`, which is
/// `CLOCK_MONOTONIC`) in `pressure_latch`, `None` when no episode is latched.
fn latched_ns(latch: &BssWord) -> Option<u64> {
    // Acquire pairs with the BPF program's compare-and-swap (a full
    // barrier): the producer's submitted records are visible.
    match latch.get().load(Ordering::Acquire) {
        0 => None,
        ns => Some(ns),
    }
}

/// Clears `pressure_latch`: producers may latch again.
fn clear_latch(latch: &BssWord) {
    // Release: the drain before this store happens before producers may
    // latch again.
    latch.get().store(0, Ordering::Release);
}

/// How the coordinator pauses the tree.
pub enum Pause {
    /// Freezing the tree's cgroup; BPF stops a process itself only past a
    /// ring's hard mark and records it in `hard_stops`.
    Freeze {
        cgroup: Arc<TreeCgroup>,
        /// The `hard_stops` map: tgids that stopped themselves.
        hard_stops: OwnedFd,
        /// `hard_stops_unrecorded` in .bss: self-stops `hard_stops` had no
        /// room for.
        unrecorded: BssWord,
    },
    /// SIGSTOP to every process of the tree through pidfds.
    Signal,
}

/// The pressure coordinator (runs on its own thread).
pub struct Coordinator {
    /// `pressure_latch` in .bss (see check_pressure in the BPF).
    pub latch: BssWord,
    pub tracked_map: OwnedFd,
    pub stops: Arc<Stops>,
    pub barrier: Arc<Barrier>,
    /// Pipeline names, by barrier index, for error messages.
    pub pipelines: Vec<&'static str>,
    pub timeout: PressureTimeout,
    pub pause: Pause,
    /// The `pressure_wake` ring, which the latching producer writes to with
    /// a forced wakeup.
    pub wake: RingConsumer,
    /// An epoll set over `wake` and `done_fd`.
    pub wake_epoll: OwnedFd,
    /// Set when the tree has exited, then `done_fd` signalled.
    pub done: Arc<AtomicBool>,
    /// Whether a late episode kills the tree (a command memtrail started)
    /// or resumes it and gives up (a process memtrail attached to, which
    /// it must never kill).
    pub kill_on_failure: bool,
    /// Counts pauses for the live status line.
    pub live: Option<std::sync::Arc<crate::engine::live::LiveCounters>>,
    /// Test-only: a late freeze or a late release.
    pub fault: PressureFault,
}

/// Test-only faults of the coordinator (`MEMTRAIL_FAULT`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PressureFault {
    #[default]
    None,
    /// `late-pause`: pause the tree only once none of its threads runs
    /// (each busy one stopped itself at a mark; or after
    /// [`LATE_PAUSE_MAX`]), as a coordinator that gets no CPU would: the
    /// path that keeps a capture lossless when the pause comes late.
    LatePause,
    /// `late-release`: wait out the timeout after the drain, before the
    /// release: a coordinator too slow to resume the tree in time.
    LateRelease,
}

/// The longest a `late-pause` coordinator waits for the tree to stop itself.
pub const LATE_PAUSE_MAX: Duration = Duration::from_secs(2);

/// The `Instant` of a `CLOCK_MONOTONIC` reading in nanoseconds (`Instant` is
/// that clock on Linux).
fn instant_of(ns: u64) -> Instant {
    let (now, now_ns) = (Instant::now(), sys::monotonic_ns());
    now.checked_sub(Duration::from_nanos(now_ns.saturating_sub(ns)))
        .unwrap_or(now)
}

impl Coordinator {
    /// Runs until `done`; returns the episodes' statistics.
    pub fn run(mut self) -> Result<PressureStats, PressureError> {
        if let Err(err) = sys::set_thread_realtime() {
            tracing::debug!(%err, "the pressure coordinator runs at normal priority");
        }
        let mut stats = PressureStats::default();
        let mut unrecorded_seen = 0;
        loop {
            // Consume the wakeups first: the ring's epoll is level
            // triggered, so a latch set after this look still wakes us.
            self.wake.poll(|_| {});
            let Some(latched) = latched_ns(&self.latch) else {
                if self.done.load(Ordering::Acquire) {
                    return Ok(stats);
                }
                // The timeout only guards against a missed `done` signal.
                sys::epoll_wait(self.wake_epoll.as_fd(), LATCH_CHECK_MS);
                continue;
            };
            // The pause counts from the latch: no process of the tree is
            // stopped or frozen before it.
            let began = instant_of(latched);
            let resumed = self.episode(began, &mut unrecorded_seen)?;
            let pause = resumed.saturating_duration_since(began).as_nanos() as u64;
            stats.episodes += 1;
            if let Some(live) = &self.live {
                live.pauses
                    .store(stats.episodes, std::sync::atomic::Ordering::Relaxed);
            }
            stats.total_pause_ns += pause;
            stats.longest_pause_ns = stats.longest_pause_ns.max(pause);
        }
    }

    fn deadline(&self, began: Instant) -> Option<Instant> {
        match self.timeout {
            PressureTimeout::After(d) => Some(began + d),
            _ => None,
        }
    }

    fn timeout_duration(&self) -> Duration {
        match self.timeout {
            PressureTimeout::After(d) => d,
            _ => Duration::ZERO,
        }
    }

    /// One episode, from its latch (`began`) to the resume; returns when
    /// the tree was resumed.
    fn episode(&self, began: Instant, unrecorded_seen: &mut u64) -> Result<Instant, PressureError> {
        let deadline = self.deadline(began);
        if self.fault == PressureFault::LatePause {
            self.wait_for_self_stops();
        }
        match &self.pause {
            Pause::Freeze { .. } => self.freeze_tree(began, deadline, unrecorded_seen)?,
            Pause::Signal => self.stop_tree(deadline)?,
        }
        let epoch = self.barrier.raise();
        let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        if !self.barrier.wait(epoch, remaining) {
            let lagging = self.barrier.lagging(epoch);
            let pipeline = lagging
                .iter()
                .map(|&i| self.pipelines.get(i).copied().unwrap_or("?"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(self.fail(PressureError::Timeout {
                timeout: self.timeout_duration(),
                pipeline,
                fate: self.fate(),
            }));
        }
        tracing::debug!(drained_after = ?began.elapsed(), "pipelines drained");
        if self.fault == PressureFault::LateRelease {
            std::thread::sleep(self.timeout_duration());
        }
        // The last look before the resume: a release past the deadline
        // would make the pause longer than the timeout.
        self.check_deadline(began, deadline)?;
        clear_latch(&self.latch);
        // SIGCONT first: while frozen, it discards a self-stop not yet
        // acted on, which the parent then never sees. Frozen, every
        // self-stop has been generated: nothing to wait for.
        let _ = match self.pause {
            Pause::Freeze { .. } => self.stops.release_all_generated(Owner::Pressure),
            Pause::Signal => self.stops.release_all(Owner::Pressure),
        };
        if let Pause::Freeze { cgroup, .. } = &self.pause {
            cgroup.thaw()?;
        }
        // Resuming took time too: a pause that ended past the deadline
        // fails the capture, as one that would have.
        self.check_deadline(began, deadline)?;
        Ok(Instant::now())
    }

    /// Fails the episode (killing the tree) if `deadline` has passed.
    fn check_deadline(
        &self,
        began: Instant,
        deadline: Option<Instant>,
    ) -> Result<(), PressureError> {
        match deadline {
            Some(d) if Instant::now() > d => Err(self.fail(PressureError::ResumeTimeout {
                timeout: self.timeout_duration(),
                paused: began.elapsed(),
                fate: self.fate(),
            })),
            _ => Ok(()),
        }
    }

    /// Freezes the tree's cgroup (waiting until the deadline) and holds the
    /// processes that stopped themselves at a hard mark.
    fn freeze_tree(
        &self,
        began: Instant,
        deadline: Option<Instant>,
        unrecorded_seen: &mut u64,
    ) -> Result<(), PressureError> {
        let Pause::Freeze {
            cgroup,
            hard_stops,
            unrecorded,
        } = &self.pause
        else {
            return Ok(());
        };
        let frozen = cgroup
            .freeze()
            .and_then(|()| cgroup.wait_frozen(deadline))
            .map_err(|e| self.fail(e.into()))?;
        if !frozen {
            let what = format!(
                "its cgroup {} was not frozen in time",
                cgroup.path().display()
            );
            return Err(self.fail(PressureError::PauseTimeout {
                timeout: self.timeout_duration(),
                what,
                fate: self.fate(),
            }));
        }
        // Frozen: no thread of the tree runs a BPF program now, so the
        // self-stops are all recorded.
        let pids = sys::bpf_map_u32_keys(hard_stops.as_fd())?;
        tracing::debug!(
            frozen_after = ?began.elapsed(),
            self_stopped = pids.len(),
            "tree frozen"
        );
        for &pid in &pids {
            if let Err(err) = self.stops.hold_stopped(pid.into(), Owner::Pressure) {
                tracing::debug!(pid, %err, "could not hold a self-stopped process");
            }
            let _ = sys::bpf_map_delete(hard_stops.as_fd(), &pid.to_ne_bytes());
        }
        // Relaxed: a counter read after the tree is paused, which the
        // cgroup file read (a syscall) orders after the BPF writes.
        let unrecorded = unrecorded.get().load(Ordering::Relaxed);
        if unrecorded != *unrecorded_seen {
            *unrecorded_seen = unrecorded;
            self.hold_stopping()?;
        }
        Ok(())
    }

    /// `late-pause`: waits until no thread of the tree runs, the tree is
    /// done, or [`LATE_PAUSE_MAX`] passed.
    fn wait_for_self_stops(&self) {
        let until = Instant::now() + LATE_PAUSE_MAX;
        while Instant::now() < until && !self.done.load(Ordering::Acquire) {
            let pids = sys::bpf_map_u32_keys(self.tracked_map.as_fd()).unwrap_or_default();
            let running = pids
                .into_iter()
                .any(|pid| sys::thread_states(pid.into()).is_ok_and(|t| t.running > 0));
            if !running {
                return;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
    }

    /// Holds every process of the tree that is stopped or has a stop
    /// pending (self-stops `hard_stops` had no room for).
    fn hold_stopping(&self) -> Result<(), PressureError> {
        for pid in sys::bpf_map_u32_keys(self.tracked_map.as_fd())? {
            let states = sys::thread_states(pid.into());
            if states.is_ok_and(|t| t.stop_pending || t.stopped > 0) {
                let _ = self.stops.hold_stopped(pid.into(), Owner::Pressure);
            }
        }
        Ok(())
    }

    /// Stops every process of the tree through pidfds, waiting for each
    /// stop until the episode's deadline. A fork made before its parent
    /// stopped adds a pid, so scan until no new one appears.
    fn stop_tree(&self, deadline: Option<Instant>) -> Result<(), PressureError> {
        let mut held: HashSet<u32> = HashSet::new();
        loop {
            let pids = sys::bpf_map_u32_keys(self.tracked_map.as_fd())?;
            let new: Vec<u32> = pids.into_iter().filter(|p| !held.contains(p)).collect();
            if new.is_empty() {
                return Ok(());
            }
            for pid in new {
                if let Err(err) = self.stops.stop(pid.into(), Owner::Pressure) {
                    tracing::debug!(pid, %err, "could not stop a tracked process");
                }
                held.insert(pid);
            }
            for &pid in &held {
                let state = self.stops.wait_stopped_until(pid.into(), deadline);
                if deadline.is_some_and(|d| Instant::now() >= d)
                    && !matches!(state, Ok(Some(StopState::Stopped | StopState::Exited)))
                {
                    return Err(self.fail(PressureError::PauseTimeout {
                        timeout: self.timeout_duration(),
                        what: format!("process {pid} did not stop in time"),
                        fate: self.fate(),
                    }));
                }
            }
        }
    }

    fn fate(&self) -> Fate {
        if self.kill_on_failure {
            Fate::Killed
        } else {
            Fate::Detached
        }
    }

    /// Kills the tree (unless [`kill_on_failure`](Self::kill_on_failure)
    /// is off) and lets go of it after a late episode.
    fn fail(&self, err: PressureError) -> PressureError {
        if self.kill_on_failure {
            self.kill_tree();
        }
        let _ = self.stops.release_all(Owner::Pressure);
        if let Pause::Freeze { cgroup, .. } = &self.pause {
            // SIGKILL reaches frozen tasks; thawing lets them die at once.
            let _ = cgroup.thaw();
        }
        err
    }

    fn kill_tree(&self) {
        let mut pids = sys::bpf_map_u32_keys(self.tracked_map.as_fd()).unwrap_or_default();
        if let Pause::Freeze { cgroup, .. } = &self.pause {
            pids.extend(cgroup.pids().unwrap_or_default());
        }
        for pid in pids {
            if let Ok(fd) = sys::pidfd_open(pid.into()) {
                let _ = sys::pidfd_send_signal(fd.as_fd(), sys::Signal::KILL);
            }
        }
    }
}
