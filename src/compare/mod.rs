//! `memtrail compare BASE NEW`: the metrics of two bench results (or two
//! profiles) side by side, a verdict per metric against thresholds, and for
//! each regressed benchmark the allocation sites that changed most.
//!
//! A comparison is a pure function of the two documents (and the profiles
//! they name, for sites): the same inputs give the same report. Each metric
//! has its direction ([`Metric::judged`]): a smaller-is-better metric
//! regresses when the new value exceeds the base by more than its threshold
//! and improves when it falls short of it by more; frees and temporary
//! allocations are shown but never judged, so that a fix in one metric (a
//! leak freed) never makes another regress. Sites are matched across the two by their
//! folded stack of function names ([`crate::bench::results::site_key`]), so
//! another build's addresses and moved lines do not split a site.

use std::collections::BTreeMap;
use std::io::{self, BufRead, Write};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::bench::format::{exit_text, grouped, title};
use crate::bench::results::{BenchResult, Metric, Results, Stat, sites_by_key};
use crate::bench::{self, BenchError};
use crate::output::OutputError;
use crate::profile::Profile;
use crate::report::{self, ReportError};
use crate::sys::error_chain;

/// Sites shown per regressed benchmark by default.
pub const DEFAULT_SITES: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum CompareError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{} is neither memtrail bench results nor a memtrail profile (its \"format\" is {found})",
        path.display()
    )]
    Unknown { path: PathBuf, found: String },
    #[error(transparent)]
    Results(#[from] BenchError),
    #[error(transparent)]
    Profile(#[from] ReportError),
    #[error("{0}")]
    Usage(String),
    #[error(transparent)]
    Output(#[from] OutputError),
    #[error("writing to standard output failed")]
    Stdout(#[source] io::Error),
}

/// How far a metric may grow before it counts as regressed.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Limit {
    /// Percent of the base value.
    Percent(f64),
    /// An absolute amount (count or bytes).
    Absolute(u64),
    /// No limit (`inf`): the metric is shown, and never a regression.
    Inf,
}

impl Limit {
    fn parse(s: &str) -> Result<Self, String> {
        let bad =
            || format!("invalid threshold `{s}`: use a percentage (1%, 0.5%), a number, or inf");
        let s = s.trim();
        if s == "inf" {
            return Ok(Self::Inf);
        }
        match s.strip_suffix('%') {
            Some(p) => {
                let v: f64 = p.trim().parse().map_err(|_| bad())?;
                if v.is_finite() && v >= 0.0 {
                    Ok(Self::Percent(v))
                } else {
                    Err(bad())
                }
            }
            None => s.parse().map(Self::Absolute).map_err(|_| bad()),
        }
    }

    /// The largest change within this limit from `base`.
    fn allowed(self, base: u64) -> f64 {
        match self {
            Self::Percent(p) => base as f64 * p / 100.0,
            Self::Absolute(n) => n as f64,
            Self::Inf => f64::INFINITY,
        }
    }

    pub fn text(self) -> String {
        match self {
            Self::Percent(p) => format!("{p}%"),
            Self::Absolute(n) => grouped(n),
            Self::Inf => "inf".to_owned(),
        }
    }
}

/// `--threshold`: one limit for every metric, and per-metric ones.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Thresholds {
    pub default: Limit,
    pub per_metric: BTreeMap<&'static str, Limit>,
}

impl Default for Thresholds {
    /// Exact: memory metrics of a deterministic program do not vary.
    fn default() -> Self {
        Self {
            default: Limit::Absolute(0),
            per_metric: BTreeMap::new(),
        }
    }
}

impl Thresholds {
    /// The limit of metric `m`: none for a metric that is not judged.
    pub fn for_metric(&self, m: Metric) -> Limit {
        if !m.judged() {
            return Limit::Inf;
        }
        self.per_metric
            .get(m.key())
            .copied()
            .unwrap_or(self.default)
    }

    /// Parses every `--threshold` value: `1%`, `peak=0.5%,allocations=0`,
    /// or both mixed. Refuses an empty value or entry, a limit given twice
    /// for every metric or for one metric (issue 26: the last one silently
    /// won), and a finite limit for a metric that is not judged.
    pub fn parse_all(values: &[String]) -> Result<Self, String> {
        let mut t = Self::default();
        // What each limit was given as, by metric (None: every metric).
        let mut given: BTreeMap<Option<Metric>, String> = BTreeMap::new();
        for value in values {
            for part in value.split(',').map(str::trim) {
                if part.is_empty() {
                    return Err(format!(
                        "--threshold `{value}` has an empty limit: give one for every metric \
                         (`1%`), for one metric (`peak=0.5%`), or several separated by commas"
                    ));
                }
                let (metric, limit) = match part.split_once('=') {
                    Some((name, limit)) => {
                        let m = Metric::from_name(name.trim()).ok_or_else(|| {
                            format!(
                                "unknown metric `{}` in --threshold: use one of {}",
                                name.trim(),
                                Metric::ALL.map(Metric::key).join(", ")
                            )
                        })?;
                        (Some(m), Limit::parse(limit)?)
                    }
                    None => (None, Limit::parse(part)?),
                };
                if let Some(first) = given.insert(metric, part.to_owned()) {
                    let whose = metric
                        .map_or_else(|| "every metric".to_owned(), |m| format!("`{}`", m.key()));
                    return Err(format!(
                        "--threshold gives the limit of {whose} twice (`{first}` and `{part}`): \
                         give it once"
                    ));
                }
                match metric {
                    Some(m) if !m.judged() && limit != Limit::Inf => {
                        return Err(format!(
                            "`{part}` in --threshold: `{}` is not judged ({}), so it never \
                             regresses and takes no limit but `inf`",
                            m.key(),
                            m.why_not_judged()
                        ));
                    }
                    Some(m) => {
                        t.per_metric.insert(m.key(), limit);
                    }
                    None => t.default = limit,
                }
            }
        }
        Ok(t)
    }
}

/// clap parser: checks one `--threshold` value.
pub fn check_threshold(s: &str) -> Result<String, String> {
    Thresholds::parse_all(&[s.to_owned()]).map(|_| s.to_owned())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Unchanged,
    /// Changed, but within the threshold.
    Within,
    Improved,
    Regressed,
    /// Changed, in a metric that is not judged ([`Metric::judged`]).
    NotJudged,
}

impl Verdict {
    pub fn text(self) -> &'static str {
        match self {
            Self::Unchanged => "unchanged",
            Self::Within => "within threshold",
            Self::Improved => "improved",
            Self::Regressed => "REGRESSED",
            Self::NotJudged => "not judged",
        }
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct MetricChange {
    pub metric: &'static str,
    pub base: u64,
    pub new: u64,
    pub change: i128,
    /// Percent of the base; `null` when the base is 0.
    pub percent: Option<f64>,
    pub threshold: Limit,
    /// Whether the metric has a verdict of its own (smaller is better), or
    /// is shown only ([`Metric::judged`]).
    pub judged: bool,
    pub verdict: Verdict,
}

/// A site whose allocations, bytes or mapped bytes changed.
#[derive(Clone, Debug, Serialize)]
pub struct SiteChange {
    /// `function (file:line)` of the innermost frame (the new profile's
    /// when it has the site).
    pub site: String,
    /// Folded stack, outermost first.
    pub stack: String,
    pub allocations: i128,
    pub bytes: i128,
    /// Change of the anonymous bytes the site mapped outside allocator
    /// calls.
    pub mapped_bytes: i128,
}

#[derive(Clone, Debug, Serialize)]
pub struct BenchChange {
    pub name: String,
    /// `regressed`, `improved`, `unchanged`, `added`, `removed`.
    pub status: &'static str,
    pub metrics: Vec<MetricChange>,
    pub base_exit: Option<String>,
    pub new_exit: Option<String>,
    /// Sites that changed most (for regressed benchmarks).
    pub sites: Vec<SiteChange>,
    /// Why `sites` is empty for a regressed benchmark, if it is for want
    /// of profiles.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sites_note: Option<String>,
    /// A non-deterministic side: the verdict rests on median runs.
    pub non_deterministic: bool,
}

#[derive(Clone, Debug, Serialize)]
pub struct Comparison {
    pub format: &'static str,
    pub version: u32,
    pub base: String,
    pub new: String,
    pub thresholds: Thresholds,
    pub regressed: bool,
    pub benchmarks: Vec<BenchChange>,
}

/// A results document, or a profile seen as one: a single benchmark named
/// `profile`.
pub struct Input {
    pub path: PathBuf,
    pub results: Results,
    /// The file's device and inode (an output must not be written over
    /// it), if it was read from a file.
    pub id: Option<report::FileId>,
}

impl Input {
    /// Reads `path`, a results document or a profile, through the reader
    /// every command shares ([`report::open_input`]: a regular file, at
    /// most 1 GiB, parsed in bounded memory).
    pub fn load(path: &Path) -> Result<Self, CompareError> {
        let read = |source| CompareError::Read {
            path: path.to_owned(),
            source,
        };
        let mut input = report::open_input(path).map_err(read)?;
        #[derive(serde::Deserialize)]
        struct Header {
            format: Option<serde_json::Value>,
        }
        let found = match input.json::<Header>(report::MAX_PROFILE_BYTES, "a document") {
            Ok(h) => h.format,
            Err(report::JsonError::Read(e)) => return Err(read(e)),
            Err(report::JsonError::Invalid(_)) => None,
        };
        let results = match found.as_ref().and_then(|f| f.as_str()) {
            Some(bench::results::RESULTS_FORMAT) => bench::read_results(&mut input, path)?,
            Some(crate::profile::PROFILE_FORMAT) => {
                let profile = report::read_profile(&mut input, path)?;
                let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_owned());
                let dir = abs.parent().map(Path::to_owned).unwrap_or_default();
                let file = PathBuf::from(abs.file_name().unwrap_or_default());
                let bench = bench::Benchmark {
                    name: "profile".to_owned(),
                    command: profile.command.clone(),
                    cwd: PathBuf::new(),
                    env: BTreeMap::new(),
                    runs: 1,
                };
                let result = bench::collect(&bench, &[profile], vec![file]);
                Results::new(dir, vec![result])
            }
            _ => {
                return Err(CompareError::Unknown {
                    path: path.to_owned(),
                    found: found.map_or_else(|| "missing".to_owned(), |v| v.to_string()),
                });
            }
        };
        Ok(Self {
            path: path.to_owned(),
            results,
            id: Some(input.id()),
        })
    }

    /// The representative profile of a benchmark, if it can be read: the
    /// first of its places ([`Results::profile_paths`]) that holds it, and,
    /// where the results have its SHA-256, only the one with those bytes
    /// (issue 26: two results files of two benches in the same directory
    /// named one profile, and the later one's was compared with itself).
    fn profile(&self, r: &BenchResult) -> Result<Profile, String> {
        let paths = self.results.profile_paths(&r.profile, Some(&self.path));
        let want = r.sha256.get(&*r.profile.to_string_lossy());
        let mut first_err = None;
        let mut mismatched = Vec::new();
        for path in &paths {
            let read = |source| ReportError::Read {
                path: path.clone(),
                source,
            };
            let attempt = report::open_input(path)
                .map_err(read)
                .and_then(|mut input| {
                    if let Some(want) = want {
                        let got = input
                            .sha256(report::MAX_PROFILE_BYTES, "a profile")
                            .map_err(read)?;
                        if got != *want {
                            mismatched.push(path.display().to_string());
                            return Ok(None);
                        }
                    }
                    report::read_profile(&mut input, path).map(Some)
                });
            match attempt {
                Ok(Some(profile)) => return Ok(profile),
                Ok(None) => {}
                Err(e) => {
                    first_err.get_or_insert(e);
                }
            }
        }
        if !mismatched.is_empty() {
            return Err(format!(
                "{} {} not the profile {} was made with (its SHA-256 differs): a later \
                 `memtrail bench` replaced it; keep the results of separate benches apart \
                 (-o FILE.json keeps its profiles beside it; --save-baseline NAME, or --dir)",
                mismatched.join(" and "),
                if mismatched.len() == 1 { "is" } else { "are" },
                self.path.display()
            ));
        }
        Err(first_err.map_or_else(|| "no profile".to_owned(), |e| error_chain(&e)))
    }
}

/// The verdict on metric `m` of one benchmark. Each metric is judged on
/// its own direction ([`Metric::judged`]): smaller is better, or not
/// judged at all (frees, temporary allocations: a change in them follows
/// from another metric's, such as a leak fixed, and is never a regression
/// of its own, issue 26).
fn judge(m: Metric, base: &Stat, new: &Stat, t: Limit) -> MetricChange {
    let change = i128::from(new.value) - i128::from(base.value);
    let allowed = t.allowed(base.value);
    let verdict = if change == 0 {
        Verdict::Unchanged
    } else if !m.judged() {
        Verdict::NotJudged
    } else if change as f64 > allowed {
        Verdict::Regressed
    } else if (-change) as f64 > allowed {
        Verdict::Improved
    } else {
        Verdict::Within
    };
    MetricChange {
        metric: m.key(),
        base: base.value,
        new: new.value,
        change,
        percent: (base.value != 0).then(|| change as f64 * 100.0 / base.value as f64),
        threshold: t,
        judged: m.judged(),
        verdict,
    }
}

/// Compares `base` with `new`; `sites` is how many changed sites to name
/// per regressed benchmark.
pub fn compare(base: &Input, new: &Input, t: &Thresholds, sites: usize) -> Comparison {
    let mut out = Vec::new();
    // A region R of benchmark B compares as a benchmark B/R, after B.
    let with_regions = |rs: &[BenchResult]| -> Vec<BenchResult> {
        rs.iter()
            .flat_map(|r| std::iter::once(r.clone()).chain(r.region_results()))
            .collect()
    };
    let (base_all, new_all) = (
        with_regions(&base.results.benchmarks),
        with_regions(&new.results.benchmarks),
    );
    for b in &base_all {
        let Some(n) = new_all.iter().find(|n| n.name == b.name) else {
            out.push(one_sided(b, "removed"));
            continue;
        };
        let metrics: Vec<MetricChange> = Metric::ALL
            .into_iter()
            .filter_map(|m| {
                let (bs, ns) = (b.metrics.get(m.key())?, n.metrics.get(m.key())?);
                Some(judge(m, bs, ns, t.for_metric(m)))
            })
            .collect();
        let exit_regressed = exit_text(&n.exit) != exit_text(&b.exit) && n.exit.code != Some(0);
        let regressed = exit_regressed || metrics.iter().any(|c| c.verdict == Verdict::Regressed);
        let improved = metrics.iter().any(|c| c.verdict == Verdict::Improved);
        let (site_changes, sites_note) = if regressed && sites > 0 {
            match (base.profile(b), new.profile(n)) {
                (Ok(bp), Ok(np)) => (changed_sites(&bp, &np, sites), None),
                (Err(e), _) | (_, Err(e)) => (Vec::new(), Some(format!("no sites: {e}"))),
            }
        } else {
            (Vec::new(), None)
        };
        out.push(BenchChange {
            name: b.name.clone(),
            status: if regressed {
                "regressed"
            } else if improved {
                "improved"
            } else {
                "unchanged"
            },
            metrics,
            base_exit: Some(exit_text(&b.exit)),
            new_exit: Some(exit_text(&n.exit)),
            sites: site_changes,
            sites_note,
            non_deterministic: !b.deterministic || !n.deterministic,
        });
    }
    for n in &new_all {
        if !base_all.iter().any(|b| b.name == n.name) {
            out.push(one_sided(n, "added"));
        }
    }
    Comparison {
        format: "memtrail-compare",
        version: 1,
        base: base.path.display().to_string(),
        new: new.path.display().to_string(),
        thresholds: t.clone(),
        regressed: out.iter().any(|b| b.status == "regressed"),
        benchmarks: out,
    }
}

fn one_sided(r: &BenchResult, status: &'static str) -> BenchChange {
    let exit = Some(exit_text(&r.exit));
    BenchChange {
        name: r.name.clone(),
        status,
        metrics: Vec::new(),
        base_exit: if status == "removed" {
            exit.clone()
        } else {
            None
        },
        new_exit: if status == "added" { exit } else { None },
        sites: Vec::new(),
        sites_note: None,
        non_deterministic: !r.deterministic,
    }
}

/// The `limit` sites whose bytes or mapped bytes (the larger change), then
/// allocations, changed most.
pub fn changed_sites(base: &Profile, new: &Profile, limit: usize) -> Vec<SiteChange> {
    let bs = sites_by_key(base);
    let ns = sites_by_key(new);
    let mut keys: Vec<&String> = bs.keys().chain(ns.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out: Vec<SiteChange> = keys
        .into_iter()
        .filter_map(|k| {
            let (b, n) = (bs.get(k), ns.get(k));
            let allocations = i128::from(n.map_or(0, |s| s.allocations))
                - i128::from(b.map_or(0, |s| s.allocations));
            let bytes = i128::from(n.map_or(0, |s| s.bytes)) - i128::from(b.map_or(0, |s| s.bytes));
            let mapped_bytes = i128::from(n.map_or(0, |s| s.mapped_bytes))
                - i128::from(b.map_or(0, |s| s.mapped_bytes));
            let site = n.or(b).map(|s| s.name.clone()).unwrap_or_default();
            (allocations != 0 || bytes != 0 || mapped_bytes != 0).then(|| SiteChange {
                site,
                stack: k.clone(),
                allocations,
                bytes,
                mapped_bytes,
            })
        })
        .collect();
    let size = |s: &SiteChange| s.bytes.abs().max(s.mapped_bytes.abs());
    out.sort_by(|a, b| {
        size(b)
            .cmp(&size(a))
            .then(b.allocations.abs().cmp(&a.allocations.abs()))
            .then(a.stack.cmp(&b.stack))
    });
    out.truncate(limit);
    out
}

/// `+1,234` / `-56` / `0`.
pub fn signed(n: i128) -> String {
    let g = grouped(n.unsigned_abs() as u64);
    match n {
        0 => "0".to_owned(),
        n if n > 0 => format!("+{g}"),
        _ => format!("-{g}"),
    }
}

fn change_text(c: &MetricChange) -> String {
    let unit = if Metric::from_name(c.metric).is_some_and(Metric::is_bytes) {
        " B"
    } else {
        ""
    };
    match c.percent {
        Some(p) if c.change != 0 => format!("{}{unit} ({p:+.2}%)", signed(c.change)),
        _ => format!("{}{unit}", signed(c.change)),
    }
}

fn value_text(metric: &str, v: u64) -> String {
    match Metric::from_name(metric) {
        Some(m) if m.is_bytes() => format!("{} B", grouped(v)),
        _ => grouped(v),
    }
}

/// `+100 allocations (+6,400 B) at extra_allocs (src/x.c:12)`; a site
/// whose mapped bytes changed adds `, +8,192 B mapped` before `at`.
pub fn site_text(s: &SiteChange) -> String {
    let mapped = if s.mapped_bytes != 0 {
        format!(", {} B mapped", signed(s.mapped_bytes))
    } else {
        String::new()
    };
    format!(
        "{} allocations ({} B){mapped} at {}",
        signed(s.allocations),
        signed(s.bytes),
        s.site
    )
}

fn metric_title(key: &str) -> &'static str {
    Metric::from_name(key).map_or("?", title)
}

fn summary_line(c: &Comparison) -> String {
    let count = |s: &str| c.benchmarks.iter().filter(|b| b.status == s).count();
    format!(
        "{} regressed, {} improved, {} unchanged, {} added, {} removed",
        count("regressed"),
        count("improved"),
        count("unchanged"),
        count("added"),
        count("removed")
    )
}

fn thresholds_text(t: &Thresholds) -> String {
    let mut s = format!("{} for all", t.default.text());
    for (m, l) in &t.per_metric {
        s.push_str(&format!(", {m} {}", l.text()));
    }
    s
}

pub fn write_text(c: &Comparison, w: &mut dyn Write) -> io::Result<()> {
    writeln!(w, "memtrail compare: {} -> {}", c.base, c.new)?;
    writeln!(w, "threshold: {}", thresholds_text(&c.thresholds))?;
    for b in &c.benchmarks {
        writeln!(w)?;
        let nd = if b.non_deterministic {
            " (non-deterministic: medians compared)"
        } else {
            ""
        };
        writeln!(w, "{}: {}{nd}", b.name, b.status)?;
        if !b.metrics.is_empty() {
            writeln!(
                w,
                "  {:<14} {:>16} {:>16} {:>24}  verdict",
                "metric", "base", "new", "change"
            )?;
        }
        for m in &b.metrics {
            writeln!(
                w,
                "  {:<14} {:>16} {:>16} {:>24}  {}",
                metric_title(m.metric),
                value_text(m.metric, m.base),
                value_text(m.metric, m.new),
                change_text(m),
                m.verdict.text()
            )?;
        }
        if b.base_exit != b.new_exit && b.base_exit.is_some() && b.new_exit.is_some() {
            writeln!(
                w,
                "  exit: {} -> {}",
                b.base_exit.as_deref().unwrap_or("-"),
                b.new_exit.as_deref().unwrap_or("-")
            )?;
        }
        if !b.sites.is_empty() {
            writeln!(w, "  sites that changed most:")?;
            for s in &b.sites {
                writeln!(w, "    {}", site_text(s))?;
            }
        }
        if let Some(note) = &b.sites_note {
            writeln!(w, "  {note}")?;
        }
    }
    writeln!(w)?;
    writeln!(w, "{}", summary_line(c))
}

pub fn write_markdown(c: &Comparison, w: &mut dyn Write) -> io::Result<()> {
    let mark = if c.regressed { "❌" } else { "✅" };
    writeln!(w, "### {mark} memtrail: memory metrics")?;
    writeln!(w)?;
    writeln!(
        w,
        "{} (threshold: {})",
        summary_line(c),
        thresholds_text(&c.thresholds)
    )?;
    for b in &c.benchmarks {
        writeln!(w)?;
        writeln!(w, "#### `{}`: {}", b.name, b.status)?;
        if b.metrics.is_empty() {
            continue;
        }
        writeln!(w)?;
        writeln!(w, "| metric | base | new | change | verdict |")?;
        writeln!(w, "| --- | ---: | ---: | ---: | --- |")?;
        for m in &b.metrics {
            writeln!(
                w,
                "| {} | {} | {} | {} | {} |",
                metric_title(m.metric),
                value_text(m.metric, m.base),
                value_text(m.metric, m.new),
                change_text(m),
                m.verdict.text()
            )?;
        }
        if !b.sites.is_empty() {
            writeln!(w)?;
            writeln!(w, "Sites that changed most:")?;
            writeln!(w)?;
            for s in &b.sites {
                writeln!(w, "- {}", site_text(s).replace('`', "'"))?;
            }
        }
        if let Some(note) = &b.sites_note {
            writeln!(w)?;
            writeln!(w, "{note}")?;
        }
    }
    Ok(())
}

/// What a differential flame graph is sized by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FlameMetric {
    /// Bytes allocated.
    #[default]
    Bytes,
    /// Allocating calls.
    Allocations,
}

fn folded(p: &Profile, by: FlameMetric) -> Vec<u8> {
    let mut out = Vec::new();
    for (key, s) in sites_by_key(p) {
        let v = match by {
            FlameMetric::Bytes => s.bytes,
            FlameMetric::Allocations => s.allocations,
        };
        if v != 0 {
            out.extend_from_slice(format!("{key} {v}\n").as_bytes());
        }
    }
    out
}

/// A differential flame graph of benchmark `name` (inferno's diff-folded:
/// the new profile's stacks, coloured by the change from the base: red
/// grew, blue shrank).
pub fn write_flamegraph(
    base: &Input,
    new: &Input,
    name: Option<&str>,
    by: FlameMetric,
    w: &mut dyn Write,
) -> Result<(), CompareError> {
    let common: Vec<&str> = base
        .results
        .benchmarks
        .iter()
        .filter(|b| new.results.benchmarks.iter().any(|n| n.name == b.name))
        .map(|b| b.name.as_str())
        .collect();
    let name = match (name, common.as_slice()) {
        (Some(n), _) if common.contains(&n) => n,
        (Some(n), _) => {
            return Err(CompareError::Usage(format!(
                "no benchmark `{n}` in both inputs (both have: {})",
                common.join(", ")
            )));
        }
        (None, [one]) => one,
        (None, _) => {
            return Err(CompareError::Usage(format!(
                "--format flamegraph needs --bench NAME: one of {}",
                common.join(", ")
            )));
        }
    };
    let find = |i: &Input| -> Result<Profile, CompareError> {
        let r = i
            .results
            .benchmarks
            .iter()
            .find(|b| b.name == name)
            .ok_or_else(|| CompareError::Usage(format!("no benchmark `{name}`")))?;
        i.profile(r).map_err(CompareError::Usage)
    };
    let (bp, np) = (find(base)?, find(new)?);
    let mut diff = Vec::new();
    inferno::differential::from_readers(
        inferno::differential::Options::default(),
        &folded(&bp, by)[..],
        &folded(&np, by)[..],
        &mut diff,
    )
    .map_err(CompareError::Stdout)?;
    let owned: Vec<String> = diff.lines().map_while(Result::ok).collect();
    let lines: Vec<&str> = owned.iter().map(String::as_str).collect();
    let title = format!(
        "memtrail compare: {name}, {}",
        match by {
            FlameMetric::Bytes => "bytes allocated",
            FlameMetric::Allocations => "allocations",
        }
    );
    let io = CompareError::Stdout;
    let empty = lines
        .iter()
        .all(|l| l.rsplit(' ').next().is_none_or(|v| v.trim() == "0"));
    if empty {
        return writeln!(
            w,
            "<?xml version=\"1.0\" standalone=\"no\"?>\n<svg version=\"1.1\" width=\"1200\" \
             height=\"60\" xmlns=\"http://www.w3.org/2000/svg\"><text x=\"600\" y=\"30\" \
             text-anchor=\"middle\" font-family=\"monospace\" font-size=\"14\">{title}: \
             nothing allocated in the new profile</text></svg>"
        )
        .map_err(io);
    }
    let mut opts = inferno::flamegraph::Options::default();
    opts.title = title;
    opts.count_name = match by {
        FlameMetric::Bytes => "bytes".to_owned(),
        FlameMetric::Allocations => "allocations".to_owned(),
    };
    opts.deterministic = true;
    inferno::flamegraph::from_lines(&mut opts, lines.iter().copied(), w).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_parse() {
        let t = Thresholds::parse_all(&["1%".into()]).unwrap();
        assert_eq!(t.for_metric(Metric::PeakLiveBytes), Limit::Percent(1.0));
        let t = Thresholds::parse_all(&["peak=0.5%,allocations=0".into(), "leaked=4096".into()])
            .unwrap();
        assert_eq!(t.for_metric(Metric::PeakLiveBytes), Limit::Percent(0.5));
        assert_eq!(t.for_metric(Metric::Allocations), Limit::Absolute(0));
        assert_eq!(t.for_metric(Metric::LeakedBytes), Limit::Absolute(4096));
        assert_eq!(
            t.for_metric(Metric::AllocatedBytes),
            Limit::Absolute(0),
            "default"
        );
        assert_eq!(t.for_metric(Metric::Frees), Limit::Inf, "not judged");
        let t = Thresholds::parse_all(&["inf,frees=inf,mmap=inf".into()]).unwrap();
        assert_eq!(t.for_metric(Metric::Allocations), Limit::Inf);
        assert_eq!(t.for_metric(Metric::MmapPeakBytes), Limit::Inf);
        for bad in [
            "x",
            "-1%",
            "nan%",
            "speed=1%",
            "peak=",
            "1.5",
            "",
            "1%,",
            ",1%",
            "infinity",
            "frees=0",
            "temporary=1%",
        ] {
            assert!(Thresholds::parse_all(&[bad.into()]).is_err(), "{bad}");
        }
        for twice in [
            vec!["peak=0.5%,peak=1%"],
            vec!["peak=0.5%,peak_live_bytes=1%"],
            vec!["1%,2%"],
            vec!["peak=1%", "peak=1%"],
            vec!["1%", "leaked=0,2%"],
        ] {
            let values: Vec<String> = twice.iter().map(|s| s.to_string()).collect();
            let err = Thresholds::parse_all(&values).unwrap_err();
            assert!(err.contains("twice"), "{twice:?}: {err}");
        }
    }

    #[test]
    fn verdicts() {
        let s = |v| Stat::of(vec![v]);
        let pct = Limit::Percent(1.0);
        let v = |b, n, t| judge(Metric::Allocations, &s(b), &s(n), t).verdict;
        assert_eq!(v(100, 100, pct), Verdict::Unchanged);
        assert_eq!(v(100, 101, pct), Verdict::Within);
        assert_eq!(v(100, 102, pct), Verdict::Regressed);
        assert_eq!(v(100, 98, pct), Verdict::Improved);
        assert_eq!(v(0, 1, pct), Verdict::Regressed, "growth from 0");
        assert_eq!(v(10, 11, Limit::Absolute(0)), Verdict::Regressed);
        assert_eq!(v(10, 11, Limit::Absolute(1)), Verdict::Within);
        assert_eq!(v(10, 1 << 40, Limit::Inf), Verdict::Within);
        // Frees and temporary allocations are never judged (issue 26).
        for m in [Metric::Frees, Metric::TemporaryAllocations] {
            let v = |b, n| judge(m, &s(b), &s(n), Limit::Absolute(0)).verdict;
            assert_eq!(v(0, 10), Verdict::NotJudged, "{m:?}");
            assert_eq!(v(10, 0), Verdict::NotJudged, "{m:?}");
            assert_eq!(v(10, 10), Verdict::Unchanged, "{m:?}");
        }
    }

    #[test]
    fn signed_numbers() {
        assert_eq!(signed(6400), "+6,400");
        assert_eq!(signed(-12000), "-12,000");
        assert_eq!(signed(0), "0");
    }
}
