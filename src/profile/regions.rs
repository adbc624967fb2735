//! Per-region metrics of USDT region markers (`include/memtrail_usdt.h`),
//! as the profile's `regions` section, the summary and the bench results
//! carry them. Folded by the session's region markers; schema in
//! docs/profile.md.

use serde::{Deserialize, Serialize};

/// One region name's metrics, over every entry of it on every thread of
/// every process of the tree.
///
/// Counts, bytes and what was live at an entry's end are added up over
/// the entries; `peak_live_bytes` is the largest peak of one entry (the
/// entries of different threads are not assumed to overlap in time).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionEntry {
    pub name: String,
    /// Times a thread entered the region (`MEMTRAIL_REGION_BEGIN`).
    pub entries: u64,
    /// Times it left (`MEMTRAIL_REGION_END`); an entry still open when the
    /// capture ended (its thread exited inside it) is closed then and not
    /// counted here.
    pub exits: u64,
    /// Its counts over every ended entry: summed, but for
    /// `peak_live_bytes`, the largest peak of one entry.
    #[serde(flatten)]
    pub counts: crate::profile::regions::RegionCounts,
}

/// Counts of one region (see the module docs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RegionCounts {
    pub allocations: u64,
    pub frees: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    /// Most bytes of blocks allocated in the region live at once.
    pub peak_live_bytes: u64,
    /// Blocks allocated in the region and still live at its end.
    pub live_allocations: u64,
    pub live_bytes: u64,
}

impl RegionCounts {
    /// Folds another entry's counts of the same region in: counts and
    /// bytes add up, the peak is the larger one (entries of different
    /// threads are not assumed to overlap in time).
    pub(crate) fn merge(&mut self, c: &RegionCounts) {
        self.allocations += c.allocations;
        self.frees += c.frees;
        self.allocated_bytes += c.allocated_bytes;
        self.freed_bytes += c.freed_bytes;
        self.peak_live_bytes = self.peak_live_bytes.max(c.peak_live_bytes);
        self.live_allocations += c.live_allocations;
        self.live_bytes += c.live_bytes;
    }
}
