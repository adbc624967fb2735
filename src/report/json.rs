//! The JSON report: the profile's stack entries ranked by the metric.

use std::io::{self, Write};

use serde::Serialize;

use super::Metric;
use super::sites::ranked;
use crate::profile::{Profile, StackEntry};

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
    /// The profile's total of the metric.
    total: u64,
    /// Entries of the profile's `stacks`, unchanged, highest value first.
    stacks: Vec<&'a StackEntry>,
}

pub(super) fn write(
    profile: &Profile,
    by: Metric,
    limit: Option<usize>,
    w: &mut dyn Write,
) -> io::Result<()> {
    let report = Report {
        format: REPORT_FORMAT,
        version: REPORT_VERSION,
        command: &profile.command,
        by,
        total: by.total(profile),
        stacks: ranked(profile, by, limit, false)
            .iter()
            .map(|site| &profile.stacks[site.index])
            .collect(),
    };
    serde_json::to_writer_pretty(&mut *w, &report)?;
    w.write_all(b"\n")
}
