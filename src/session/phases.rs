//! Where a session's start-up and finish go: each phase's wall time, as
//! `debug` events (`memtrail --log debug run ...`), so a slow start names
//! its part (BPF verification, probing, tables, symbolization).

use std::time::Instant;

/// Times consecutive phases of one stage ("start-up", "finish").
pub(crate) struct Phases {
    stage: &'static str,
    began: Instant,
    last: Instant,
}

impl Phases {
    pub(crate) fn new(stage: &'static str) -> Self {
        let now = Instant::now();
        Self {
            stage,
            began: now,
            last: now,
        }
    }

    /// Ends the phase `name`: logs its time and the stage's so far.
    pub(crate) fn done(&mut self, name: &str) {
        let now = Instant::now();
        tracing::debug!(
            ms = format!("{:.1}", (now - self.last).as_secs_f64() * 1e3),
            total_ms = format!("{:.1}", (now - self.began).as_secs_f64() * 1e3),
            "{}: {name}",
            self.stage
        );
        self.last = now;
    }
}
