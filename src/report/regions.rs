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
    /// Its counts over every ended entry: summed, but for
    /// `peak_live_bytes`, the largest peak of one entry.
    #[serde(flatten)]
    pub counts: crate::session::RegionCounts,
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
            r.counts.allocations,
            r.counts.frees,
            human(r.counts.allocated_bytes),
            human(r.counts.peak_live_bytes),
            r.counts.live_allocations,
            human(r.counts.live_bytes)
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
