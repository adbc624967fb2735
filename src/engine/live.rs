//! Counters a running capture publishes for the live status line
//! (`memtrail run` on a terminal): the events poller stores them after
//! each record (plain relaxed stores on its own thread, nothing on the
//! tracked program's side), the pressure coordinator counts pauses, and
//! the CLI's status thread reads them a few times a second.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// See the module docs.
#[derive(Debug, Default)]
pub struct LiveCounters {
    /// Records folded so far.
    pub events: AtomicU64,
    /// Processes seen.
    pub processes: AtomicU64,
    /// The tree's live heap bytes now.
    pub live_bytes: AtomicU64,
    /// The tree's highest live heap bytes so far.
    pub peak_bytes: AtomicU64,
    /// Pressure pauses so far.
    pub pauses: AtomicU64,
}

impl LiveCounters {
    /// Stores the events poller's view after a record.
    pub(crate) fn publish(&self, events: u64, processes: u64, live: u64, peak: u64) {
        self.events.store(events, Relaxed);
        self.processes.store(processes, Relaxed);
        self.live_bytes.store(live, Relaxed);
        self.peak_bytes.store(peak, Relaxed);
    }
}
