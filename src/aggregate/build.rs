//! The profile document built from the aggregator's state.

use super::Aggregator;
use crate::profile::{
    ExitInfo, HeapCounters, LostEvents, PROFILE_FORMAT, PROFILE_VERSION, ProbeEntry, ProcessEntry,
    Profile, wait_status_code,
};

impl Profile {
    /// Builds the document; times become relative to `start_ns`, when
    /// the command was started.
    pub fn build(
        agg: &Aggregator,
        command: Vec<String>,
        exit: ExitInfo,
        (start_ns, end_ns): (u64, u64),
        lost_events: LostEvents,
        probes: Vec<ProbeEntry>,
    ) -> Self {
        let rel = |ts: u64| ts.saturating_sub(start_ns);
        let mut totals = agg.totals();
        totals.peak_live_at_ns = rel(totals.peak_live_at_ns);
        Self {
            format: PROFILE_FORMAT.to_owned(),
            version: PROFILE_VERSION,
            command,
            exit,
            attached: false,
            duration_ns: rel(end_ns),
            totals,
            mappings: agg.mapping_totals(),
            processes: agg
                .processes()
                .map(|p| ProcessEntry {
                    pid: p.pid,
                    ppid: p.ppid,
                    exe: p.exe.clone(),
                    exit_code: p.exit_status.map(wait_status_code),
                    start_ns: rel(p.start_ns),
                    end_ns: p.end_ns.map(rel),
                    heap: HeapCounters {
                        peak_live_at_ns: rel(p.heap.peak_live_at_ns),
                        ..p.heap
                    },
                    mappings: p.maps,
                })
                .collect(),
            lost_events,
            probe_scope: Default::default(),
            event_rings: 1,
            probes,
            skipped_images: Vec::new(),
            stacks: Vec::new(),
            pressure: Default::default(),
            unwind: Default::default(),
            timeline: agg.timeline(start_ns).unwrap_or_default(),
            regions: Vec::new(),
        }
    }
}
