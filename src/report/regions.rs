//! Per-region metrics of USDT region markers (`include/memtrail_usdt.h`),
//! as the profile's `regions` section, the summary and the bench results
//! carry them. Folded by `crate::session::markers`; schema in
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
    /// Successful allocating calls in the region (realloc included).
    pub allocations: u64,
    pub frees: u64,
    pub allocated_bytes: u64,
    pub freed_bytes: u64,
    /// The most bytes allocated in one entry of the region live at once.
    pub peak_live_bytes: u64,
    /// Blocks allocated in the region still live at its end, summed.
    pub live_allocations: u64,
    pub live_bytes: u64,
}

impl RegionEntry {
    /// Folds one ended entry's counts in.
    pub(crate) fn add(&mut self, c: &crate::session::RegionCounts) {
        self.allocations += c.allocations;
        self.frees += c.frees;
        self.allocated_bytes += c.allocated_bytes;
        self.freed_bytes += c.freed_bytes;
        self.peak_live_bytes = self.peak_live_bytes.max(c.peak_live_bytes);
        self.live_allocations += c.live_allocations;
        self.live_bytes += c.live_bytes;
    }
}

/// Regions shown in the summary; the profile lists every one.
const REGIONS_SHOWN: usize = 20;

/// The summary's table of regions, by name (nothing without markers).
pub(crate) fn write_regions(
    w: &mut impl std::io::Write,
    regions: &[RegionEntry],
) -> std::io::Result<()> {
    if regions.is_empty() {
        return Ok(());
    }
    let human = super::human_bytes;
    writeln!(
        w,
        "  {:<20} {:>8} {:>10} {:>10} {:>12} {:>12} {:>8} {:>12}",
        "region", "entries", "allocs", "frees", "allocated", "peak", "live", "live bytes"
    )?;
    for r in regions.iter().take(REGIONS_SHOWN) {
        writeln!(
            w,
            "  {:<20} {:>8} {:>10} {:>10} {:>12} {:>12} {:>8} {:>12}",
            r.name,
            r.entries,
            r.allocations,
            r.frees,
            human(r.allocated_bytes),
            human(r.peak_live_bytes),
            r.live_allocations,
            human(r.live_bytes)
        )?;
    }
    if regions.len() > REGIONS_SHOWN {
        writeln!(
            w,
            "  and {} more regions (the profile lists every one)",
            regions.len() - REGIONS_SHOWN
        )?;
    }
    Ok(())
}
