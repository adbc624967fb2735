//! The results document of `memtrail bench` (format `memtrail-bench`,
//! versioned; schema in docs/bench.md), and the metrics read from a
//! profile.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::profile::{ExitInfo, Profile, StackEntry, regions::RegionEntry};

/// The `format` field of every results document.
pub const RESULTS_FORMAT: &str = "memtrail-bench";

/// Bumped on any incompatible change of the document.
pub const RESULTS_VERSION: u32 = 1;

/// One metric of a benchmark: what it measures, how it is read from a
/// profile, and whether it is judged ([`Metric::judged`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Metric {
    Allocations,
    Frees,
    AllocatedBytes,
    PeakLiveBytes,
    LeakedBytes,
    LeakedBlocks,
    MmapPeakBytes,
    TemporaryAllocations,
}

impl Metric {
    /// Every metric, in the order reports show them.
    pub const ALL: [Metric; 8] = [
        Self::Allocations,
        Self::Frees,
        Self::AllocatedBytes,
        Self::PeakLiveBytes,
        Self::LeakedBytes,
        Self::LeakedBlocks,
        Self::MmapPeakBytes,
        Self::TemporaryAllocations,
    ];

    /// The key in results documents (and BMF measures).
    pub fn key(self) -> &'static str {
        match self {
            Self::Allocations => "allocations",
            Self::Frees => "frees",
            Self::AllocatedBytes => "allocated_bytes",
            Self::PeakLiveBytes => "peak_live_bytes",
            Self::LeakedBytes => "leaked_bytes",
            Self::LeakedBlocks => "leaked_blocks",
            Self::MmapPeakBytes => "mmap_peak_bytes",
            Self::TemporaryAllocations => "temporary_allocations",
        }
    }

    /// The metric named `name`: its key or a short name (`bytes`, `peak`,
    /// `leaked`, `mmap`, `temporary`).
    pub fn from_name(name: &str) -> Option<Self> {
        let short = match name {
            "bytes" => Some(Self::AllocatedBytes),
            "peak" => Some(Self::PeakLiveBytes),
            "leaked" => Some(Self::LeakedBytes),
            "blocks" => Some(Self::LeakedBlocks),
            "mmap" => Some(Self::MmapPeakBytes),
            "temporary" => Some(Self::TemporaryAllocations),
            _ => None,
        };
        short.or_else(|| Self::ALL.into_iter().find(|m| m.key() == name))
    }

    /// Whether `memtrail compare` judges the metric (smaller is better),
    /// or shows it only. Frees and temporary allocations have no direction
    /// of their own: more frees is a leak fixed, fewer frees is fewer
    /// allocations or a leak (both judged in their own metrics), and a
    /// block freed sooner is a temporary allocation more (issue 26: fixing
    /// a leak failed the gate on both).
    pub fn judged(self) -> bool {
        !matches!(self, Self::Frees | Self::TemporaryAllocations)
    }

    /// Why a metric is not judged, for messages.
    pub fn why_not_judged(self) -> &'static str {
        match self {
            Self::Frees => {
                "more frees is a leak fixed; fewer frees shows as leaked blocks or fewer allocations"
            }
            Self::TemporaryAllocations => {
                "a block freed sooner counts as temporary; what temporary allocations cost shows in \
                 allocations"
            }
            _ => "",
        }
    }

    /// Bytes or a count.
    pub fn is_bytes(self) -> bool {
        matches!(
            self,
            Self::AllocatedBytes | Self::PeakLiveBytes | Self::LeakedBytes | Self::MmapPeakBytes
        )
    }

    /// The unit, for BMF-style outputs.
    pub fn unit(self) -> &'static str {
        if self.is_bytes() { "bytes" } else { "count" }
    }

    /// The metric's value in a profile.
    pub fn of(self, p: &Profile) -> u64 {
        match self {
            Self::Allocations => p.totals.allocations,
            Self::Frees => p.totals.frees,
            Self::AllocatedBytes => p.totals.allocated_bytes,
            Self::PeakLiveBytes => p.totals.peak_live_bytes,
            // Leaked as the summary and reports count it: live at exit,
            // less what is still reachable (runtime pools).
            Self::LeakedBytes => p
                .totals
                .live_bytes_at_exit
                .saturating_sub(crate::report::runtime_at_exit(p).0),
            Self::LeakedBlocks => p
                .totals
                .live_allocations_at_exit
                .saturating_sub(crate::report::runtime_at_exit(p).1),
            // Anonymous mmap outside allocator calls (profile
            // `mappings.peak_mapped_bytes`, always present in version 1).
            Self::MmapPeakBytes => p.mappings.peak_mapped_bytes,
            // Blocks freed by their thread before it allocated or freed
            // anything else (profile `totals.temporary_allocations`; 0 in
            // profiles written before it was counted).
            Self::TemporaryAllocations => p.totals.temporary_allocations,
        }
    }
}

/// A metric over a benchmark's runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Stat {
    /// The median run's value (the lower median for an even number of
    /// runs).
    pub value: u64,
    pub min: u64,
    pub max: u64,
    /// Every run's value, in run order.
    pub runs: Vec<u64>,
}

impl Stat {
    pub fn of(runs: Vec<u64>) -> Self {
        let mut sorted = runs.clone();
        sorted.sort_unstable();
        Self {
            value: sorted
                .get((sorted.len().saturating_sub(1)) / 2)
                .copied()
                .unwrap_or(0),
            min: sorted.first().copied().unwrap_or(0),
            max: sorted.last().copied().unwrap_or(0),
            runs,
        }
    }

    /// `max - min`.
    pub fn spread(&self) -> u64 {
        self.max - self.min
    }
}

/// An allocation site whose counts differed between runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SiteRuns {
    /// Where it allocated: `function (file:line)` of the innermost frame.
    pub site: String,
    /// The folded stack (outermost caller first, `;`-separated).
    pub stack: String,
    /// Allocations from this site in each run.
    pub allocations: Vec<u64>,
    /// Bytes from this site in each run.
    pub bytes: Vec<u64>,
}

/// One benchmark's results.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct BenchResult {
    pub name: String,
    pub command: Vec<String>,
    /// The working directory it ran in.
    pub cwd: PathBuf,
    pub runs: u32,
    /// How the command ended in the median run of `allocations` (see
    /// `profile`).
    pub exit: ExitInfo,
    /// Whether every run ended with the same status.
    pub exit_consistent: bool,
    /// Keyed by [`Metric::key`].
    pub metrics: BTreeMap<String, Stat>,
    /// False when a metric differed between runs.
    pub deterministic: bool,
    /// Sites whose allocations or bytes differed between runs, largest
    /// difference first.
    pub differing_sites: Vec<SiteRuns>,
    /// The profile of the median run, for drill-down: relative to the
    /// document's `profile_dir`.
    pub profile: PathBuf,
    /// Every run's profile, in run order.
    pub profiles: Vec<PathBuf>,
    /// The SHA-256 (hex) of each profile in `profiles`, by its path there:
    /// `compare` reads a profile only if it is the one these results were
    /// made with (issue 26: a later bench replaced it, silently). Empty in
    /// results written before memtrail kept them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub sha256: BTreeMap<String, String>,
    /// Per marked region (USDT markers, the profile's `regions`), its
    /// metrics by key ([`region_metrics`]); empty without markers.
    #[serde(default)]
    pub regions: BTreeMap<String, BTreeMap<String, Stat>>,
}

impl BenchResult {
    /// The metric's value (the median run's).
    pub fn value(&self, m: Metric) -> Option<u64> {
        self.metrics.get(m.key()).map(|s| s.value)
    }

    /// Each region `R` as a benchmark of its own named `NAME/R`, for
    /// `compare` and the BMF and github-action-benchmark outputs.
    pub fn region_results(&self) -> impl Iterator<Item = BenchResult> + '_ {
        self.regions.iter().map(|(region, metrics)| BenchResult {
            name: format!("{}/{region}", self.name),
            metrics: metrics.clone(),
            deterministic: metrics.values().all(|s| s.spread() == 0),
            differing_sites: Vec::new(),
            regions: BTreeMap::new(),
            ..self.clone()
        })
    }
}

/// The key of a region's entry count (not a [`Metric`]: a change in it is
/// shown, never judged).
pub const REGION_ENTRIES: &str = "entries";

/// A region's metrics by key: the benchmark metrics it has, for that
/// region only (`leaked_bytes` and `leaked_blocks` are what was allocated
/// in the region and still live at its end; a region has no
/// `mmap_peak_bytes`), and [`REGION_ENTRIES`].
pub fn region_metrics(r: &RegionEntry) -> [(&'static str, u64); 7] {
    [
        (REGION_ENTRIES, r.entries),
        (Metric::Allocations.key(), r.counts.allocations),
        (Metric::Frees.key(), r.counts.frees),
        (Metric::AllocatedBytes.key(), r.counts.allocated_bytes),
        (Metric::PeakLiveBytes.key(), r.counts.peak_live_bytes),
        (Metric::LeakedBytes.key(), r.counts.live_bytes),
        (Metric::LeakedBlocks.key(), r.counts.live_allocations),
    ]
}

/// Per region name, each metric over the runs' profiles (0 in a run that
/// did not enter the region).
pub fn regions_of(profiles: &[Profile]) -> BTreeMap<String, BTreeMap<String, Stat>> {
    let names: std::collections::BTreeSet<&str> = profiles
        .iter()
        .flat_map(|p| p.regions.iter().map(|r| r.name.as_str()))
        .collect();
    let empty = RegionEntry::default();
    names
        .into_iter()
        .map(|name| {
            let per_run: Vec<[(&'static str, u64); 7]> = profiles
                .iter()
                .map(|p| {
                    region_metrics(p.regions.iter().find(|r| r.name == name).unwrap_or(&empty))
                })
                .collect();
            let stats = (0..7)
                .map(|i| {
                    let key = per_run.first().map_or("", |m| m[i].0);
                    (
                        key.to_owned(),
                        Stat::of(per_run.iter().map(|m| m[i].1).collect()),
                    )
                })
                .collect();
            (name.to_owned(), stats)
        })
        .collect()
}

/// The results document.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Results {
    pub format: String,
    pub version: u32,
    /// Where the profiles named in `benchmarks` were written (absolute).
    pub profile_dir: PathBuf,
    pub benchmarks: Vec<BenchResult>,
}

impl Results {
    pub fn new(profile_dir: PathBuf, benchmarks: Vec<BenchResult>) -> Self {
        Self {
            format: RESULTS_FORMAT.to_owned(),
            version: RESULTS_VERSION,
            profile_dir,
            benchmarks,
        }
    }

    /// Where a profile named in the document may be, in the order to try:
    /// under `profile_dir`, then, for a directory moved or copied (a CI
    /// artifact), next to `doc`, the document's path: in its directory,
    /// then in the directory of profiles `--output` keeps beside it
    /// ([`profiles_dir`]: `A.profiles/` for `A.json`).
    pub fn profile_paths(&self, rel: &Path, doc: Option<&Path>) -> Vec<PathBuf> {
        let mut paths = vec![self.profile_dir.join(rel)];
        if let Some(doc) = doc {
            let dir = doc.parent().unwrap_or(Path::new(""));
            for other in [dir.join(rel), profiles_dir(doc).join(rel)] {
                if !paths.contains(&other) {
                    paths.push(other);
                }
            }
        }
        paths
    }
}

/// `function (file:line)` of a stack's innermost frame, or the best it has.
pub fn site_name(stack: &StackEntry) -> String {
    let Some(f) = stack.frames.first() else {
        return "[no frames]".to_owned();
    };
    let func = f.function.as_deref().map_or_else(
        || match &f.module {
            Some(m) => format!("[{}]", m.rsplit('/').next().unwrap_or(m)),
            None => format!("{:#x}", f.addr),
        },
        str::to_owned,
    );
    match (&f.file, f.line) {
        (Some(file), Some(line)) => format!("{func} ({file}:{line})"),
        (Some(file), None) => format!("{func} ({file})"),
        _ => func,
    }
}

/// The key sites are matched by across runs and builds: the folded stack of
/// function names (outermost first), which addresses (ASLR, another
/// build) and line numbers (code moved within a function) do not change.
pub fn site_key(stack: &StackEntry) -> String {
    if stack.frames.is_empty() {
        return "[no frames]".to_owned();
    }
    stack
        .frames
        .iter()
        .rev()
        .map(|f| {
            let name = match (&f.function, &f.module) {
                (Some(func), _) => func.to_string(),
                (None, Some(m)) => format!("[{}]", m.rsplit('/').next().unwrap_or(m)),
                (None, None) => "[unknown]".to_owned(),
            };
            name.replace(';', ":")
        })
        .collect::<Vec<_>>()
        .join(";")
}

/// A profile's sites merged by [`site_key`]: summed allocations and bytes,
/// and the [`site_name`] of the largest stack (by bytes) under each key.
pub fn sites_by_key(p: &Profile) -> BTreeMap<String, SiteSum> {
    let mut sites: BTreeMap<String, SiteSum> = BTreeMap::new();
    for s in &p.stacks {
        let e = sites.entry(site_key(s)).or_default();
        e.allocations += s.metrics.allocations;
        e.bytes += s.metrics.bytes;
        e.mapped_bytes += s.metrics.mapped_bytes;
        if e.name.is_empty() || s.metrics.bytes > e.largest {
            e.name = site_name(s);
            e.largest = s.metrics.bytes;
        }
    }
    sites
}

/// One merged site of [`sites_by_key`].
#[derive(Clone, Debug, Default)]
pub struct SiteSum {
    pub name: String,
    pub allocations: u64,
    pub bytes: u64,
    /// Anonymous bytes mapped outside allocator calls (docs/profile.md,
    /// "Mappings by site").
    pub mapped_bytes: u64,
    largest: u64,
}

/// The directory the profiles of the results document `doc` are kept in:
/// `STEM.profiles` next to it (`A.json`: `A.profiles`).
pub fn profiles_dir(doc: &Path) -> PathBuf {
    let stem = doc.file_stem().unwrap_or(doc.as_os_str());
    let mut name = stem.to_os_string();
    name.push(".profiles");
    doc.with_file_name(name)
}
