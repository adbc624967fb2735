//! How a poller waits when its ring is empty.
//!
//! Spin and yield with [`Backoff`] first (new records usually follow soon),
//! then sleep in short naps: a record that arrives while the poller naps
//! waits at most one nap plus timer slack. After a few empty naps the poller
//! sleeps deeply, if it can: it raises its ring's `sleeping` flag in the BPF
//! program's .bss (producers then submit with `BPF_RB_FORCE_WAKEUP`), checks
//! the ring once more, and blocks on the ring's epoll (and the barrier's
//! eventfd) until the kernel wakes it. Naps keep latency low during bursts;
//! deep sleep keeps an idle poller's CPU use near zero, and it is woken in
//! tens of microseconds.
//!
//! Pacing: while records flow, a poller that just handed records on sleeps
//! until [`BUSY_PACE`] has passed since that look began, then looks again.
//! Each look reads the producer position and the newest records, lines the
//! producers write next: a poller that looks again at once keeps taking them
//! away, and every producer's reserve and commit then misses in its cache
//! (about 20 ns of every allocator probe here); a poller spinning on the
//! other core also slows the tracked program on this VM. Paced, a look takes
//! a batch of records for one round of misses, and the poller uses a few
//! percent of a core instead of all of it (`perf/RESULTS.md`). It adds at
//! most [`BUSY_PACE`] plus timer slack to the delivery latency, and nothing
//! to a barrier's: a raised barrier ends pace sleeps and naps (they wait on
//! the barrier's eventfd, `epoll_pwait2`, where the poller has one). A look that
//! took more than 1/[`FAST_FILL`] of the ring means producers could fill
//! it during a sleep: the poller then looks again at once. Only the
//! high-rate rings are paced (`Pipeline::paced`): attach requests hold a
//! stopped process, and mappings must be resolved before their process
//! exits.
//!
//! Lost wakeups: the poller stores the flag (SeqCst) and then reads the
//! producer position; a producer advances the producer position when it
//! reserves and reads the flag just before it commits. x86 may order the
//! producer's read before its store is visible, so in a window of a few
//! nanoseconds both can miss each other: the poller then sleeps with a
//! record in the ring until its deep sleep times out ([`DEEP_SLEEP`], a
//! bounded delay, never a loss). A full barrier in every producer would
//! close the window at a cost on every record; we take the rare delay.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crossbeam_utils::Backoff;

use crate::bpf::bss::BssWord;

/// Default nap when idle: keeps p99 delivery latency well under 1 ms.
pub const DEFAULT_NAP: Duration = Duration::from_micros(200);

/// Least time between two looks at a ring while records flow (see the
/// module docs).
pub const BUSY_PACE: Duration = Duration::from_micros(300);

/// A look that consumed more than 1/FAST_FILL of the ring is not paced.
pub const FAST_FILL: u64 = 16;

/// Empty naps before a poller sleeps deeply.
pub const NAPS_BEFORE_DEEP_SLEEP: u32 = 5;

/// Longest deep sleep: bounds the delay of a missed wakeup (see above).
pub const DEEP_SLEEP: Duration = Duration::from_millis(10);

/// Raises or lowers a ring's `sleeping` flag.
fn set_flag(flag: &BssWord, on: bool) {
    // SeqCst: ordered before the poller's next read of the producer
    // position (see the module docs).
    flag.get().store(u64::from(on), Ordering::SeqCst);
}

/// Blocking on a ring until producers wake the poller.
pub struct DeepSleep {
    /// The ring's `sleeping` word in the BPF program's .bss.
    flag: BssWord,
    epoll: OwnedFd,
    /// The barrier's kick alone: pace sleeps and naps end when a barrier
    /// is raised (the ring, readable while records wait, would end them at
    /// once).
    kick: OwnedFd,
    /// The longest sleep: [`DEEP_SLEEP`], less where producers write
    /// without waking the poller (the preload shim's rings).
    longest: Duration,
}

impl DeepSleep {
    /// Sleeps on `rings` (the ring maps' fds) and `kick` (an eventfd the
    /// barrier signals).
    pub fn new(
        flag: BssWord,
        rings: &[BorrowedFd<'_>],
        kick: BorrowedFd<'_>,
    ) -> std::io::Result<Self> {
        let fds: Vec<_> = rings
            .iter()
            .map(|&ring| (ring, false))
            .chain([(kick, true)])
            .collect();
        let epoll = crate::sys::epoll_for(&fds).map_err(|e| e.source)?;
        let kick = crate::sys::epoll_for(&[(kick, true)]).map_err(|e| e.source)?;
        Ok(Self {
            flag,
            epoll,
            kick,
            longest: DEEP_SLEEP,
        })
    }

    /// Sleeps at most `longest` at a time.
    pub fn at_most(mut self, longest: Duration) -> Self {
        self.longest = self.longest.min(longest);
        self
    }

    /// Sleeps `timeout`, or less if a barrier is raised meanwhile (or was
    /// since the last wait: the kick is edge-triggered, so an old edge ends
    /// one wait early, never a later one late).
    fn nap(&self, timeout: Duration) {
        crate::sys::epoll_wait_for(self.kick.as_fd(), timeout);
    }

    /// Raises the flag; sleeps unless `still_idle` (checked after raising
    /// it) says there is work; lowers the flag. Returns whether it slept.
    fn sleep(&self, still_idle: impl FnOnce() -> bool) -> bool {
        set_flag(&self.flag, true);
        let idle = still_idle();
        if idle {
            crate::sys::epoll_wait(self.epoll.as_fd(), self.longest.as_millis().max(1) as i32);
        }
        set_flag(&self.flag, false);
        idle
    }
}

/// Idle strategy of one poller thread.
pub struct IdleWait {
    backoff: Backoff,
    /// When the last look at the ring began (see [`IdleWait::pace`]).
    busy_since: Option<Instant>,
    nap: Duration,
    empty_naps: u32,
    naps_before_deep: u32,
    deep: Option<DeepSleep>,
}

impl IdleWait {
    pub fn new(nap: Duration) -> Self {
        Self {
            backoff: Backoff::new(),
            busy_since: None,
            nap,
            empty_naps: 0,
            naps_before_deep: NAPS_BEFORE_DEEP_SLEEP,
            deep: None,
        }
    }

    /// Sleeps deeply after [`NAPS_BEFORE_DEEP_SLEEP`] empty naps.
    pub fn with_deep_sleep(mut self, deep: DeepSleep) -> Self {
        self.deep = Some(deep);
        self
    }

    /// Sleeps deeply after `naps` empty naps instead (0: as soon as the
    /// spinning and yielding is over).
    pub fn naps_before_deep_sleep(mut self, naps: u32) -> Self {
        self.naps_before_deep = naps;
        self
    }

    /// Work was found: the next idle period starts with spinning again.
    pub fn reset(&mut self) {
        self.backoff.reset();
        self.empty_naps = 0;
    }

    /// Called before each look at a ring of `ring_size` bytes, with the
    /// bytes the previous look consumed. After a look that consumed some,
    /// but not more than 1/[`FAST_FILL`] of the ring, sleeps until
    /// [`BUSY_PACE`] has passed since that look began, unless `barrier`
    /// says a barrier waits (checked before, and the sleep ends when one is
    /// raised: a snapshot does not wait out the pace).
    pub fn pace(&mut self, consumed: u64, ring_size: u64, barrier: impl FnOnce() -> bool) {
        if consumed > 0 && consumed <= ring_size / FAST_FILL && !barrier() {
            if let Some(left) = self
                .busy_since
                .and_then(|since| BUSY_PACE.checked_sub(since.elapsed()))
            {
                self.sleep(left);
            }
        }
        self.busy_since = Some(Instant::now());
    }

    /// Sleeps `timeout`, cut short by a barrier where the poller has its
    /// kick.
    fn sleep(&self, timeout: Duration) {
        match &self.deep {
            Some(deep) => deep.nap(timeout),
            None => std::thread::sleep(timeout),
        }
    }

    /// Nothing to do: spin, yield, nap, then (with deep sleep) block until
    /// woken. `still_idle` re-checks for work once producers would wake us.
    pub fn idle_until(&mut self, still_idle: impl FnOnce() -> bool) {
        if !self.backoff.is_completed() {
            self.backoff.snooze();
            return;
        }
        if let Some(deep) = &self.deep {
            if self.empty_naps >= self.naps_before_deep && deep.sleep(still_idle) {
                return;
            }
        }
        self.sleep(self.nap);
        self.empty_naps += 1;
    }

    /// Nothing to do: spin, yield, then nap (no deep sleep).
    pub fn idle(&mut self) {
        if self.backoff.is_completed() {
            std::thread::sleep(self.nap);
        } else {
            self.backoff.snooze();
        }
    }
}

impl Default for IdleWait {
    fn default() -> Self {
        Self::new(DEFAULT_NAP)
    }
}
