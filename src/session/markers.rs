//! USDT region markers of tracked programs, folded on the events poller.
//!
//! A `region_begin` record opens a region on its thread, a `region_end`
//! closes the innermost one: the same per-thread, nested regions as a
//! session's (see the `regions` module, whose code this reuses; the
//! markers keep their own instance, so they never close a session's
//! region or the other way round). Records come on the events ring, so
//! a region counts exactly the heap events its thread made between the
//! markers.
//!
//! Ended regions are merged per name (see [`RegionEntry`]). Threads are
//! keyed by their kernel thread id, unique in the system while the
//! thread lives; a region still open when the capture ends is closed
//! then. An end on a thread with nothing open is counted in
//! `unmatched_ends`.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::regions::{Control, NAME_MAX, Regions};
use crate::bpf::record::{Header, Kind, Mem};
use crate::profile::{HeapCounters, regions::RegionEntry};

pub(crate) struct Markers {
    regions: Regions,
    by_name: BTreeMap<String, RegionEntry>,
    /// Ends without an open region on their thread.
    pub(crate) unmatched_ends: u64,
}

impl Default for Markers {
    fn default() -> Self {
        Self {
            regions: Regions::new(Arc::new(Control::default())),
            by_name: BTreeMap::new(),
            unmatched_ends: 0,
        }
    }
}

impl Markers {
    /// Whether heap records need [`observe`](Self::observe).
    pub(crate) fn active(&self) -> bool {
        self.regions.active()
    }

    /// Accounts one heap record (see `Regions::observe`).
    pub(crate) fn observe(
        &mut self,
        hdr: &Header,
        mem: &Mem,
        before: HeapCounters,
        after: HeapCounters,
    ) {
        self.regions.observe(hdr, mem, before, after);
    }

    /// Folds one marker record.
    pub(crate) fn marker(&mut self, hdr: &Header, name: &[u8]) {
        match hdr.kind {
            Kind::RegionBegin => {
                let mut padded = [0u8; NAME_MAX + 1];
                let len = name.len().min(NAME_MAX);
                padded[..len].copy_from_slice(&name[..len]);
                self.regions.begin(hdr.tid, padded);
                self.entry(&padded).entries += 1;
            }
            Kind::RegionEnd if !self.close(hdr.tid, true) => self.unmatched_ends += 1,
            _ => {}
        }
    }

    /// Closes the innermost region of `tid`; false if it had none.
    fn close(&mut self, tid: u32, exit: bool) -> bool {
        let Some((name, counts)) = self.regions.end(tid) else {
            return false;
        };
        let entry = self.entry(&name);
        entry.counts.merge(&counts);
        entry.exits += u64::from(exit);
        true
    }

    fn entry(&mut self, name: &[u8; NAME_MAX + 1]) -> &mut RegionEntry {
        let len = name.iter().position(|&c| c == 0).unwrap_or(NAME_MAX);
        let name = String::from_utf8_lossy(&name[..len]);
        if !self.by_name.contains_key(&*name) {
            let name = name.clone().into_owned();
            self.by_name.insert(
                name.clone(),
                RegionEntry {
                    name,
                    ..RegionEntry::default()
                },
            );
        }
        self.by_name.get_mut(&*name).expect("inserted above")
    }

    /// Closes what is still open and returns the regions by name.
    pub(crate) fn finish(mut self) -> Vec<RegionEntry> {
        for tid in self.regions.open_threads() {
            while self.close(tid, false) {}
        }
        if self.unmatched_ends > 0 {
            tracing::warn!(
                target: crate::profile::NOTE,
                ends = self.unmatched_ends,
                "region ends without a begin on their thread"
            );
        }
        self.by_name.into_values().collect()
    }
}
