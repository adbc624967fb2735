//! Folded (collapsed) stacks: `outer;...;inner VALUE` a line, the format
//! of FlameGraph's stackcollapse scripts, which inferno, speedscope and
//! most flame graph tools read.
//!
//! Frames are named by [`folded_name`] (function names only, so sites that
//! differ only in their lines merge); a stack whose walk stopped early has
//! `[truncated: why]` as its outermost frame; stacks that fold to the same line
//! are summed; lines are sorted; sites whose value is 0 are left out.

use std::collections::BTreeMap;
use std::io::{self, Write};

use super::Metric;
use super::Prepared;
use super::sites::{folded_name, ranked, truncation};

/// The folded stacks of the ranked sites, each with its summed value, in
/// sorted order.
pub(super) fn lines(p: &Prepared<'_>, by: Metric, limit: Option<usize>) -> Vec<String> {
    let mut folded: BTreeMap<String, u64> = BTreeMap::new();
    for site in ranked(p, by, limit, false) {
        // A walk that stopped early shows why as the outermost frame.
        let stack = truncation(p.profile, &site)
            .map(|t| {
                folded_name(&crate::profile::Frame {
                    function: Some(t.into()),
                    ..crate::profile::Frame::unknown(0)
                })
                .into_owned()
            })
            .into_iter()
            .chain(
                site.frames
                    .iter()
                    .rev()
                    .map(|f| folded_name(f).into_owned()),
            )
            .collect::<Vec<_>>()
            .join(";");
        let stack = if stack.is_empty() {
            "[no frames]".to_owned()
        } else {
            stack
        };
        let sum = folded.entry(stack).or_default();
        *sum = sum.saturating_add(by.of(&site.metrics));
    }
    folded
        .into_iter()
        .map(|(stack, value)| format!("{stack} {value}"))
        .collect()
}

pub(super) fn write(
    p: &Prepared<'_>,
    by: Metric,
    limit: Option<usize>,
    w: &mut dyn Write,
) -> io::Result<()> {
    for line in lines(p, by, limit) {
        writeln!(w, "{line}")?;
    }
    Ok(())
}
