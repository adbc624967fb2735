//! Reports on a profile's allocation sites: text, JSON, folded stacks,
//! flamegraph SVG and pprof. Formats are documented for users in
//! docs/reports.md.
//!
//! A report is a pure function of a [`Profile`] and [`ReportOptions`]: the
//! same profile gives the same bytes (sites are ranked by the chosen
//! [`Metric`], ties broken by stack id; flamegraph colours come from a hash
//! of the function name, never from a random source). `memtrail report`
//! loads the profile from a file with [`load_profile`]; `memtrail run
//! --report` renders the profile it just built.
//!
//! Ownership: renderers write into a writer the caller owns and never close
//! it; files go through [`OutputFile`], so a report file appears whole or
//! not at all (a FIFO or a device gets it as a stream).
//!
//! Before rendering, [`Prepared`] applies the report's [`Shaping`]: frames
//! `--hide` drops, stacks `--focus` keeps, and which blocks live at exit
//! are leaks (not runtime pools nor suppressed: `reachable`). Text and
//! JSON group sites by their first caller outside allocator wrappers
//! (`group`) and have the functions and calls views (`functions`); text
//! shortens C++ names (`names`).
//!
//! Site frames are innermost first (as in the profile's `stacks`);
//! folded stacks and flamegraphs reverse them (outermost caller first),
//! pprof keeps them (its leaf is `location_id[0]`).

mod flamegraph;
mod folded;
mod functions;
mod group;
mod json;
mod load;
mod names;
pub mod pprof;
mod reachable;
mod sites;
mod text;
mod timeline;

use std::io::{self, BufWriter, Write};
use std::path::PathBuf;
use std::sync::Arc;

pub use load::{
    FileId, InputFile, JsonError, MAX_PROFILE_BYTES, MAX_SUITE_BYTES, load_profile,
    load_profile_with_id, open_input, read_profile, read_text,
};

pub use group::{BUILTIN_WRAPPERS, Grouping};
pub use reachable::{RUNTIME_POOLS, RuntimePool, Suppression, SuppressionError, read_suppressions};

use crate::output::{OutputError, OutputFile};

use crate::profile::{Frame, Profile};

/// The sites a text report shows when `--top` is not given.
pub const DEFAULT_TEXT_TOP: usize = 10;

/// A report format.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// The top sites with their metrics and symbolized stacks, for a
    /// terminal.
    Text,
    /// The sites ranked by the metric, as a JSON document.
    Json,
    /// An SVG flame graph of the metric, outermost caller at the bottom.
    Flamegraph,
    /// A gzipped pprof profile.proto with every metric as a sample type.
    Pprof,
    /// Collapsed stacks, `outer;...;inner VALUE` a line, for any flame
    /// graph tool.
    Folded,
    /// An SVG chart of the heap over time (the profile's timeline),
    /// stacked by its top allocation sites, with the peak instant and the
    /// sites at the peak; `--by` and `--top` do not apply.
    Timeline,
    /// The profile itself, as this memtrail writes it (version 3, compact;
    /// zstd-compressed to a `.zst` name): converts a version 2 profile,
    /// keeps only `--pid`/`--exe`'s stacks and `--debuginfo-dir`'s names;
    /// `--by` and `--top` do not apply.
    Profile,
}

/// What sites are ranked (and flame graphs sized) by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Metric {
    /// Bytes allocated (the sum of the sizes asked for).
    #[default]
    Bytes,
    /// Allocating calls.
    Count,
    /// Bytes live when the tree's live heap peaked.
    Peak,
    /// Bytes still live when their process exited (in an attach window:
    /// live at detach).
    Leaked,
    /// Temporary allocations: blocks freed by their thread before it
    /// allocated or freed anything else (heaptrack's definition).
    Temporary,
    /// Bytes of anonymous memory mapped outside allocator calls (mmap and
    /// mremap's new lengths, whole pages).
    Mapped,
    /// Of them, bytes mapped when the tree's anonymous mappings peaked.
    MappedPeak,
    /// Of them, bytes still mapped when their process exited.
    MappedExit,
    /// Program break growth made through sbrk outside allocator calls.
    Brk,
}

impl Metric {
    /// The whole tree's value of this metric, from the profile's totals.
    pub fn total(self, p: &Profile) -> u64 {
        match self {
            Self::Bytes => p.totals.allocated_bytes,
            Self::Count => p.totals.allocations,
            Self::Peak => p.totals.peak_live_bytes,
            Self::Leaked => p.totals.live_bytes_at_exit,
            Self::Temporary => p.totals.temporary_allocations,
            Self::Mapped => p.mappings.mapped_bytes,
            Self::MappedPeak => p.mappings.peak_mapped_bytes,
            Self::MappedExit => p.mappings.mapped_bytes_at_exit,
            Self::Brk => p.mappings.brk_grown_bytes,
        }
    }

    /// The name `--by` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Bytes => "bytes",
            Self::Count => "count",
            Self::Peak => "peak",
            Self::Leaked => "leaked",
            Self::Temporary => "temporary",
            Self::Mapped => "mapped",
            Self::MappedPeak => "mapped-peak",
            Self::MappedExit => "mapped-exit",
            Self::Brk => "brk",
        }
    }

    /// What the metric measures, for titles; `attached`: the profile is
    /// an attach window, whose "leaked" bytes are live at detach.
    fn describe(self, attached: bool) -> &'static str {
        match self {
            Self::Bytes => "bytes allocated",
            Self::Count => "allocations",
            Self::Peak => "bytes live at peak",
            Self::Leaked if attached => "bytes live at detach",
            Self::Leaked => "bytes leaked",
            Self::Temporary => "temporary allocations",
            Self::Mapped => "bytes mapped",
            Self::MappedPeak => "bytes mapped at the mapping peak",
            Self::MappedExit => "bytes mapped at exit",
            Self::Brk => "program break growth",
        }
    }

    /// The unit of a value, for flame graph tooltips.
    fn unit(self) -> &'static str {
        match self {
            Self::Count | Self::Temporary => "allocations",
            _ => "bytes",
        }
    }
}

/// What a text or JSON report lists (`--view`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum View {
    /// Allocation sites, grouped by the caller of allocator wrappers
    /// unless `--no-group`.
    #[default]
    Sites,
    /// Functions with their self and inclusive metrics.
    Functions,
    /// The callers and callees of the functions `--focus` matches.
    Calls,
}

impl View {
    /// The name `--view` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sites => "sites",
            Self::Functions => "functions",
            Self::Calls => "calls",
        }
    }
}

/// How stacks are shaped before they are rendered: grouping, views,
/// frames hidden, stacks focused on, leaks suppressed.
#[derive(Clone, Debug, Default)]
pub struct Shaping {
    /// `--wrapper`, `--no-group`.
    pub grouping: Grouping,
    pub view: View,
    /// `--focus`: in the sites and functions views (and every format but
    /// text and JSON's calls view), keep only the stacks with a frame
    /// whose function matches; in the calls view, the functions shown.
    pub focus: Option<regex::Regex>,
    /// `--hide`: frames whose function matches are dropped from every
    /// stack.
    pub hide: Vec<regex::Regex>,
    /// `--suppressions`: leaks matching one are shown apart.
    pub suppressions: Vec<Suppression>,
}

/// What to render.
#[derive(Clone, Debug)]
pub struct ReportOptions {
    pub format: Format,
    /// Sites are ranked by this metric, highest first.
    pub by: Metric,
    /// Keep only the first N ranked sites; 0 keeps all. `None`:
    /// [`DEFAULT_TEXT_TOP`] for text, all sites for the other formats.
    pub top: Option<usize>,
    pub shaping: Shaping,
}

impl ReportOptions {
    /// How many ranked sites to keep (`None`: all).
    fn limit(&self) -> Option<usize> {
        let top = match (self.top, self.format) {
            (Some(n), _) => n,
            (None, Format::Text) => DEFAULT_TEXT_TOP,
            (None, _) => 0,
        };
        (top != 0).then_some(top)
    }
}

/// Why `memtrail report` failed. Each variant maps to a documented exit
/// code (see `cli::exit::report_code`).
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("cannot read the profile {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} is not a valid memtrail profile", path.display())]
    Invalid {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error(
        "{} is not a memtrail profile: its \"format\" is {found}, expected \"{}\"",
        path.display(), crate::profile::PROFILE_FORMAT
    )]
    Format { path: PathBuf, found: String },
    #[error(
        "{} is a profile of version {found}; this memtrail reads versions {} to {}{}",
        path.display(), crate::profile::OLDEST_PROFILE_VERSION, crate::profile::PROFILE_VERSION,
        if found == "1" {
            " (version 1 profiles lack each stack's process and image build ids: capture again)"
        } else {
            ""
        }
    )]
    Version { path: PathBuf, found: String },
    #[error("{} has no process {wanted} (its processes: {known})", path.display())]
    NoSuchProcess {
        path: PathBuf,
        wanted: String,
        known: String,
    },
    #[error("--debuginfo-dir {}: not a directory", path.display())]
    DebuginfoDir { path: PathBuf },
    #[error(transparent)]
    Suppressions(#[from] SuppressionError),
    #[error("--view {view} is a text or JSON view: --format {format} shows sites")]
    ViewFormat { view: &'static str, format: String },
    #[error(
        "--view calls lists the callers and callees of the functions --focus REGEX matches: give --focus"
    )]
    CallsWithoutFocus,
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("writing the report to standard output failed")]
    Stdout(#[source] io::Error),
}

impl ReportError {
    /// Standard output was closed early (e.g. `memtrail report ... | head`):
    /// not a failure.
    pub fn is_broken_pipe(&self) -> bool {
        matches!(self, Self::Stdout(e) if e.kind() == io::ErrorKind::BrokenPipe)
    }
}

/// Which processes' stacks a report keeps (`--pid`, `--exe`): a stack is
/// kept when its process matches any pid or any executable given, every
/// stack when none is given. An executable matches by its path as the
/// profile names it or by its file name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StackFilter {
    pub pids: Vec<u32>,
    pub exes: Vec<String>,
}

impl StackFilter {
    fn keeps(&self, pid: u32, exe: &str) -> bool {
        (self.pids.is_empty() && self.exes.is_empty())
            || self.pids.contains(&pid)
            || self
                .exes
                .iter()
                .any(|e| e == exe || e == names::module_base(exe))
    }

    /// Drops the stacks of other processes from `profile` (read from
    /// `path`). A pid or executable that names no process of the profile
    /// (nor, for an executable, a stack made before an exec) is an error,
    /// not an empty report. Totals and processes stay the
    /// whole tree's.
    pub fn apply(&self, profile: &mut Profile, path: &std::path::Path) -> Result<(), ReportError> {
        let procs = &profile.processes;
        let missing_pid = self
            .pids
            .iter()
            .find(|&&pid| !procs.iter().any(|p| p.pid == pid))
            .map(|pid| format!("with pid {pid}"));
        // An executable a process ran before an exec is only in its
        // stacks' `exe`.
        let matches = |e: &String, exe: &str| e == exe || e == names::module_base(exe);
        let missing_exe = || {
            self.exes
                .iter()
                .find(|&e| {
                    !procs.iter().any(|p| matches(e, &p.exe))
                        && !profile.stacks.iter().any(|s| matches(e, &s.exe))
                })
                .map(|e| format!("running {e}"))
        };
        if let Some(wanted) = missing_pid.or_else(missing_exe) {
            let known: Vec<String> = procs
                .iter()
                .map(|p| format!("{} {}", p.pid, p.exe))
                .collect();
            return Err(ReportError::NoSuchProcess {
                path: path.to_owned(),
                wanted,
                known: known.join(", "),
            });
        }
        profile.stacks.retain(|s| self.keeps(s.pid, &s.exe));
        Ok(())
    }
}

/// A profile with the report's shaping applied: frames hidden, stacks
/// focused on, blocks live at exit classified. Renderers read stacks'
/// frames and metrics through it.
struct Prepared<'a> {
    pub profile: &'a Profile,
    pub opts: &'a ReportOptions,
    /// Each stack's frames without the hidden ones (`--hide`).
    hidden: Option<Vec<Vec<Arc<Frame>>>>,
    /// The stacks `--focus` keeps (sites and functions views).
    focused: Option<Vec<bool>>,
    pub reachable: reachable::Reachable,
}

impl<'a> Prepared<'a> {
    pub fn new(profile: &'a Profile, opts: &'a ReportOptions) -> Self {
        let shaping = &opts.shaping;
        let hidden = (!shaping.hide.is_empty()).then(|| {
            profile
                .stacks
                .iter()
                .map(|s| {
                    s.frames
                        .iter()
                        .filter(|f| {
                            let name = sites::folded_name(f);
                            !shaping.hide.iter().any(|r| r.is_match(&name))
                        })
                        .cloned()
                        .collect()
                })
                .collect()
        });
        let mut prepared = Self {
            profile,
            opts,
            hidden,
            focused: None,
            reachable: reachable::Reachable::default(),
        };
        if let Some(focus) = shaping
            .focus
            .as_ref()
            .filter(|_| shaping.view != View::Calls)
        {
            let keep = (0..profile.stacks.len())
                .map(|i| {
                    prepared
                        .frames(i)
                        .iter()
                        .any(|f| focus.is_match(&sites::folded_name(f)))
                })
                .collect();
            prepared.focused = Some(keep);
        }
        prepared.reachable =
            reachable::Reachable::classify(profile, |i| prepared.frames(i), &shaping.suppressions);
        prepared
    }

    /// Stack `i`'s frames as the report shows them.
    pub fn frames(&self, i: usize) -> &[Arc<Frame>] {
        match &self.hidden {
            Some(hidden) => &hidden[i],
            None => &self.profile.stacks[i].frames,
        }
    }

    /// Whether stack `i` is reported (`--focus`).
    pub fn keeps(&self, i: usize) -> bool {
        self.focused.as_ref().is_none_or(|keep| keep[i])
    }
}

/// The bytes and blocks of `profile` live at exit in known runtime pools
/// ([`RUNTIME_POOLS`]): still reachable, not leaked.
pub fn runtime_at_exit(profile: &Profile) -> (u64, u64) {
    reachable::Reachable::classify(profile, |i| &profile.stacks[i].frames, &[]).runtime_total()
}

/// [`runtime_at_exit`] per process: its pid, bytes and blocks, for the
/// processes that have some.
pub fn runtime_at_exit_by_pid(profile: &Profile) -> std::collections::BTreeMap<u32, (u64, u64)> {
    let r = reachable::Reachable::classify(profile, |i| &profile.stacks[i].frames, &[]);
    let mut by_pid = std::collections::BTreeMap::new();
    for (stack, reach) in profile.stacks.iter().zip(&r.reach) {
        if matches!(reach, reachable::Reach::Runtime(_)) {
            let (bytes, blocks) = by_pid.entry(stack.pid).or_insert((0, 0));
            *bytes += stack.metrics.live_bytes_at_exit;
            *blocks += stack.metrics.live_allocations_at_exit;
        }
    }
    by_pid
}

/// Renders the report of `profile` into `w`.
pub fn write_report(profile: &Profile, opts: &ReportOptions, w: &mut dyn Write) -> io::Result<()> {
    if opts.format == Format::Profile {
        // The profile itself: no shaping to prepare.
        serde_json::to_writer(&mut *w, profile)?;
        return w.write_all(b"\n");
    }
    let p = Prepared::new(profile, opts);
    let (by, limit) = (opts.by, opts.limit());
    match (opts.format, opts.shaping.view) {
        (Format::Text, View::Sites) => text::write(&p, by, limit, w),
        (Format::Text, _) => functions::write_text(&p, by, limit, w),
        (Format::Json, View::Sites) => json::write(&p, by, limit, w),
        (Format::Json, _) => functions::write_json(&p, by, limit, w),
        (Format::Folded, _) => folded::write(&p, by, limit, w),
        (Format::Flamegraph, _) => flamegraph::write(&p, by, limit, w),
        (Format::Pprof, _) => pprof::write(&p, by, limit, w),
        (Format::Timeline, _) => timeline::write(&p, w),
        (Format::Profile, _) => unreachable!("written above"),
    }
}

impl ReportOptions {
    /// Refuses combinations that cannot be rendered: a functions or calls
    /// view in a format that shows sites, the calls view without
    /// `--focus`.
    pub fn check(&self) -> Result<(), ReportError> {
        let view = self.shaping.view;
        if view != View::Sites && !matches!(self.format, Format::Text | Format::Json) {
            return Err(ReportError::ViewFormat {
                view: view.name(),
                format: format!("{:?}", self.format).to_lowercase(),
            });
        }
        if view == View::Calls && self.shaping.focus.is_none() {
            return Err(ReportError::CallsWithoutFocus);
        }
        Ok(())
    }
}

/// Renders the report of `profile` into `out` and renames it into place.
pub fn write_report_file(
    profile: &Profile,
    opts: &ReportOptions,
    out: OutputFile,
) -> Result<(), OutputError> {
    stage_report(profile, opts, &out)?;
    out.commit()
}

/// Renders the report of `profile` into `out`, without putting it in place
/// (see [`crate::output::Outputs`]).
pub fn stage_report(
    profile: &Profile,
    opts: &ReportOptions,
    out: &OutputFile,
) -> Result<(), OutputError> {
    if opts.format == Format::Profile {
        return crate::output::stage_profile(profile, out);
    }
    let err = |source| OutputError {
        path: out.path().to_owned(),
        source,
    };
    let mut w = BufWriter::new(out.file());
    write_report(profile, opts, &mut w)
        .and_then(|()| w.flush())
        .map_err(err)
}
