//! How a poller waits when its ring is empty.
//!
//! Spin and yield with [`Backoff`] first (new records usually follow soon),
//! then sleep in short naps. A nap bounds delivery latency: a record that
//! arrives while the poller sleeps waits at most one nap plus timer slack.
//! The nap is short enough for the 1 ms latency target and long enough that
//! an idle poller costs a small fraction of a core.

use std::time::Duration;

use crossbeam_utils::Backoff;

/// Default nap when idle: keeps p99 delivery latency well under 1 ms.
pub const DEFAULT_NAP: Duration = Duration::from_micros(200);

/// Idle strategy of one poller thread.
pub struct IdleWait {
    backoff: Backoff,
    nap: Duration,
}

impl IdleWait {
    pub fn new(nap: Duration) -> Self {
        Self {
            backoff: Backoff::new(),
            nap,
        }
    }

    /// Work was found: the next idle period starts with spinning again.
    pub fn reset(&mut self) {
        self.backoff.reset();
    }

    /// Nothing to do: spin, yield, then nap.
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
