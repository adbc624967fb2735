//! The renderers' view of a profile's allocation sites: ranked, borrowed
//! from the profile, and the frame names every format shares.
//!
//! `crate::report` does not re-export its stack types, so the view borrows
//! their fields instead of naming them.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::HashMap;

use super::Metric;
use crate::report::Profile;

/// What one site allocated (the fields of the profile's `StackMetrics`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct Metrics {
    pub allocations: u64,
    pub bytes: u64,
    pub live_bytes_at_peak: u64,
    pub live_bytes_at_exit: u64,
    pub live_allocations_at_exit: u64,
}

/// One frame of a site, borrowed from the profile.
#[derive(Clone, Copy, Debug)]
pub(super) struct FrameView<'a> {
    pub addr: u64,
    pub module: Option<&'a str>,
    pub function: Option<&'a str>,
    pub file: Option<&'a str>,
    pub line: Option<u32>,
    pub inlined: bool,
}

/// One allocation site, borrowed from the profile.
#[derive(Clone, Debug)]
pub(super) struct Site<'a> {
    /// Index of the entry in `Profile::stacks`.
    pub index: usize,
    pub id: u64,
    /// Innermost first, as in the profile.
    pub frames: Vec<FrameView<'a>>,
    pub metrics: Metrics,
}

impl Metric {
    /// The site's value of this metric.
    pub(super) fn of(self, m: &Metrics) -> u64 {
        match self {
            Self::Bytes => m.bytes,
            Self::Count => m.allocations,
            Self::Peak => m.live_bytes_at_peak,
            Self::Leaked => m.live_bytes_at_exit,
        }
    }
}

/// The profile's sites ranked by `by`, highest first, ties by stack id
/// then position. `keep_zero` keeps sites whose value is 0; `limit` keeps
/// the first N.
pub(super) fn ranked(
    profile: &Profile,
    by: Metric,
    limit: Option<usize>,
    keep_zero: bool,
) -> Vec<Site<'_>> {
    let mut sites: Vec<Site<'_>> = profile
        .stacks
        .iter()
        .enumerate()
        .map(|(index, s)| Site {
            index,
            id: s.id,
            frames: s
                .frames
                .iter()
                .map(|f| FrameView {
                    addr: f.addr,
                    module: f.module.as_deref(),
                    function: f.function.as_deref(),
                    file: f.file.as_deref(),
                    line: f.line,
                    inlined: f.inlined,
                })
                .collect(),
            metrics: Metrics {
                allocations: s.metrics.allocations,
                bytes: s.metrics.bytes,
                live_bytes_at_peak: s.metrics.live_bytes_at_peak,
                live_bytes_at_exit: s.metrics.live_bytes_at_exit,
                live_allocations_at_exit: s.metrics.live_allocations_at_exit,
            },
        })
        .filter(|s| keep_zero || by.of(&s.metrics) > 0)
        .collect();
    sites.sort_by(|a, b| {
        by.of(&b.metrics)
            .cmp(&by.of(&a.metrics))
            .then(a.id.cmp(&b.id))
            .then(a.index.cmp(&b.index))
    });
    if let Some(n) = limit {
        sites.truncate(n);
    }
    sites
}

/// The last component of a module path: `/usr/lib/libc.so.6` → `libc.so.6`.
pub(super) fn module_base(module: &str) -> &str {
    module.rsplit('/').find(|s| !s.is_empty()).unwrap_or(module)
}

/// A frame's name in folded stacks and flame graphs: the function, else
/// `[module]` (as FlameGraph's stackcollapse-perf names unknown frames),
/// else `[unknown]`. `;` becomes `:` (as in FlameGraph's stackcollapse
/// scripts) and control characters become spaces, so a name never splits
/// a stack or a line.
pub(super) fn folded_name<'a>(f: &FrameView<'a>) -> Cow<'a, str> {
    let name: Cow<'a, str> = match (f.function.map(str::trim), f.module) {
        (Some(func), _) if !func.is_empty() => Cow::Borrowed(func),
        (_, Some(module)) => Cow::Owned(format!("[{}]", module_base(module))),
        _ => Cow::Borrowed("[unknown]"),
    };
    if name.contains(|c: char| c == ';' || c.is_control()) {
        Cow::Owned(
            name.chars()
                .map(|c| match c {
                    ';' => ':',
                    c if c.is_control() => ' ',
                    c => c,
                })
                .collect(),
        )
    } else {
        name
    }
}

impl Metrics {
    fn add(&mut self, o: &Metrics) {
        self.allocations = self.allocations.saturating_add(o.allocations);
        self.bytes = self.bytes.saturating_add(o.bytes);
        self.live_bytes_at_peak = self.live_bytes_at_peak.saturating_add(o.live_bytes_at_peak);
        self.live_bytes_at_exit = self.live_bytes_at_exit.saturating_add(o.live_bytes_at_exit);
        self.live_allocations_at_exit = self
            .live_allocations_at_exit
            .saturating_add(o.live_allocations_at_exit);
    }
}

/// What a frame shows once symbolized: its address only when it has no
/// function.
type ShownFrame<'a> = (
    Option<&'a str>,
    Option<&'a str>,
    Option<u32>,
    Option<&'a str>,
    bool,
    Option<u64>,
);

/// Merges sites whose frames show the same (function, file, line, module,
/// inlined; the address only for frames without a function): e.g. the calls
/// of an unrolled loop. Metrics are summed; the merged site keeps the
/// frames and id of its first site and counts its stacks. The result is
/// ranked by `by` again (stable, so ties keep the input's order).
pub(super) fn merge_same_frames(sites: Vec<Site<'_>>, by: Metric) -> Vec<(Site<'_>, usize)> {
    let mut merged: Vec<(Site<'_>, usize)> = Vec::with_capacity(sites.len());
    let mut index: HashMap<Vec<ShownFrame<'_>>, usize> = HashMap::new();
    for site in sites {
        let key = site
            .frames
            .iter()
            .map(|f| {
                let addr = f.function.is_none().then_some(f.addr);
                (f.function, f.file, f.line, f.module, f.inlined, addr)
            })
            .collect();
        match index.get(&key) {
            Some(&i) => {
                merged[i].0.metrics.add(&site.metrics);
                merged[i].1 += 1;
            }
            None => {
                index.insert(key, merged.len());
                merged.push((site, 1));
            }
        }
    }
    merged.sort_by_key(|(site, _)| Reverse(by.of(&site.metrics)));
    merged
}
