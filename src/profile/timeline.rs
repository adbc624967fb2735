//! The profile's `timeline` section: heap and mapped bytes over time, per
//! process and for the top sites (built by the aggregator).

use serde::{Deserialize, Serialize};

/// Sites (stacks) the timeline keeps a series of, those with the highest
/// live bytes in any interval; the others are summed in `other_bytes`.
pub const TOP_SITES: usize = 10;

/// The maxima of one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Point {
    pub live_bytes: u64,
    pub live_blocks: u64,
    /// Anonymous mappings made outside allocator calls (committed).
    pub mapped_bytes: u64,
    /// Resident memory (RSS) as recorded; 0 in a profile written before.
    #[serde(default)]
    pub rss_bytes: u64,
}

impl Point {
    pub(crate) fn merge(&mut self, o: &Point) {
        self.live_bytes = self.live_bytes.max(o.live_bytes);
        self.live_blocks = self.live_blocks.max(o.live_blocks);
        self.mapped_bytes = self.mapped_bytes.max(o.mapped_bytes);
        self.rss_bytes = self.rss_bytes.max(o.rss_bytes);
    }
}

/// One series: `points[i]` is interval `first + i`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Series {
    pub first: u64,
    pub points: Vec<Point>,
}

/// A process's series.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessSeries {
    pub pid: u32,
    #[serde(flatten)]
    pub series: Series,
}

/// One site's live heap over time.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteSeries {
    /// The stack (a `stacks[].id` of the profile), as a decimal string.
    #[serde(with = "super::id_string")]
    pub stack: u64,
    /// The highest of `live_bytes`.
    pub peak_bytes: u64,
    /// `live_bytes[i]` is the stack's live bytes in interval `tree.first +
    /// i`, at the instant the tree's live heap was highest in it.
    pub live_bytes: Vec<u64>,
}

/// The profile's `timeline` (docs/profile.md, "Timeline").
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeline {
    /// When interval 0 starts, ns since the command was started.
    pub start_ns: u64,
    /// Every interval's width.
    pub interval_ns: u64,
    /// The whole tree.
    pub tree: Series,
    /// One per process of the profile's `processes`, in the same order.
    pub processes: Vec<ProcessSeries>,
    /// The tree's live heap peak and the exact instant it was reached
    /// (ns since the command was started), as in `totals`.
    pub peak_live_bytes: u64,
    pub peak_live_at_ns: u64,
    /// The top sites ([`TOP_SITES`] at most, by `peak_bytes`, highest
    /// first), each with a value per point of `tree`; empty in a profile
    /// written before memtrail kept them.
    #[serde(default)]
    pub sites: Vec<SiteSeries>,
    /// Per point of `tree`: its `live_bytes` less the sites' (the other
    /// stacks, and blocks allocated without a stack).
    #[serde(default)]
    pub other_bytes: Vec<u64>,
}

impl Timeline {
    /// The interval holding `ns` (ns since the command was started).
    pub fn interval_of(&self, ns: u64) -> u64 {
        ns.saturating_sub(self.start_ns) / self.interval_ns.max(1)
    }
}
