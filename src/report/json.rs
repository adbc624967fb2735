//! The JSON report: the profile's stack entries ranked by the metric, the
//! sites grouped by caller (unless `--no-group`), and the blocks live at
//! exit that are not leaks. Names are whole (not shortened).

use std::io::{self, Write};

use serde::Serialize;

use super::group::{group, python_file};
use super::reachable::Held;
use super::sites::{ranked, whole_name};
use super::{Metric, Prepared};
use crate::profile::{StackEntry, StackMetrics};

/// The `format` field of a JSON report.
pub(super) const REPORT_FORMAT: &str = "memtrail-report";

/// Bumped on any incompatible change of the document.
pub(super) const REPORT_VERSION: u32 = 2;

#[derive(Serialize)]
struct Report<'a> {
    format: &'static str,
    version: u32,
    command: &'a [String],
    by: Metric,
    /// The profile's total of the metric (for `leaked`: without the
    /// runtime pools and the suppressed).
    total: u64,
    /// Entries of the profile's `stacks`, unchanged, highest value first.
    stacks: Vec<&'a StackEntry>,
    /// The sites grouped by their first caller outside allocator wrappers,
    /// highest value first; absent with `--no-group`.
    #[serde(skip_serializing_if = "Option::is_none")]
    groups: Option<Vec<GroupDoc>>,
    still_reachable: StillReachable,
}

/// A group of stacks.
#[derive(Serialize)]
struct GroupDoc {
    /// The caller's function (whole), or `module+0xOFFSET`; null for a
    /// stack whose every frame is a wrapper's (a group of its own).
    function: Option<String>,
    /// The caller's module path.
    module: Option<String>,
    /// A Python caller's source file (a Python function is its name and
    /// file); absent for native code.
    #[serde(skip_serializing_if = "Option::is_none")]
    file: Option<String>,
    /// The members' summed metrics (leaked bytes without runtime pools
    /// and suppressed blocks).
    #[serde(flatten)]
    metrics: StackMetrics,
    /// The members' ids (of `stacks` entries), largest first.
    #[serde(serialize_with = "ids")]
    stacks: Vec<u64>,
}

fn ids<S: serde::Serializer>(ids: &[u64], s: S) -> Result<S::Ok, S::Error> {
    s.collect_seq(ids.iter().map(u64::to_string))
}

#[derive(Serialize)]
struct StillReachable {
    /// Live at exit in known runtime pools, by pool.
    runtime: Vec<HeldDoc>,
    /// Live at exit in stacks a suppression matched, by `leak:` line.
    suppressed: Vec<HeldDoc>,
}

#[derive(Serialize)]
struct HeldDoc {
    name: String,
    bytes: u64,
    blocks: u64,
    #[serde(serialize_with = "ids")]
    stacks: Vec<u64>,
}

fn held(h: &[Held]) -> Vec<HeldDoc> {
    h.iter()
        .map(|h| HeldDoc {
            name: h.name.clone(),
            bytes: h.bytes,
            blocks: h.blocks,
            stacks: h.stacks.clone(),
        })
        .collect()
}

pub(super) fn write(
    p: &Prepared<'_>,
    by: Metric,
    limit: Option<usize>,
    w: &mut dyn Write,
) -> io::Result<()> {
    let profile = p.profile;
    let grouping = &p.opts.shaping.grouping;
    let groups = grouping.enabled().then(|| {
        let mut groups = group(ranked(p, by, None, false), grouping, by);
        if let Some(n) = limit {
            groups.truncate(n);
        }
        groups
            .into_iter()
            .map(|g| {
                let caller = g.caller.map(|c| &g.site.frames[c]);
                GroupDoc {
                    function: caller.map(|f| whole_name(f)),
                    module: caller.and_then(|f| f.module.as_deref().map(str::to_owned)),
                    file: caller.and_then(|f| python_file(f)).map(str::to_owned),
                    metrics: g.site.metrics,
                    stacks: g.stacks,
                }
            })
            .collect()
    });
    let total = match by {
        Metric::Leaked => p.reachable.leaked(profile).0,
        _ => by.total(profile),
    };
    let report = Report {
        format: REPORT_FORMAT,
        version: REPORT_VERSION,
        command: &profile.command,
        by,
        total,
        stacks: ranked(p, by, limit, false)
            .iter()
            .map(|site| &profile.stacks[site.index])
            .collect(),
        groups,
        still_reachable: StillReachable {
            runtime: held(&p.reachable.runtime),
            suppressed: held(&p.reachable.suppressed),
        },
    };
    serde_json::to_writer_pretty(&mut *w, &report)?;
    w.write_all(b"\n")
}
