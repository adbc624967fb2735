//! The renderers' view of a profile's allocation sites: ranked, borrowed
//! from the profile, and the frame names every format shares.

use std::borrow::Cow;
use std::sync::Arc;

use super::names::module_base;
use super::reachable::Reach;
use super::{Metric, Prepared};
use crate::profile::unwind::{Outcome, StackEnd};
use crate::profile::{Frame, Profile, StackMetrics};

/// One allocation site, borrowed from the profile.
#[derive(Clone, Debug)]
pub(super) struct Site<'a> {
    /// Index of the entry in `Profile::stacks`.
    pub index: usize,
    pub id: u64,
    /// Innermost first, as in the profile.
    pub frames: &'a [Arc<Frame>],
    /// Its metrics, without the blocks live at exit when they are not a
    /// leak (a runtime pool's, suppressed).
    pub metrics: StackMetrics,
    /// Why the walk stopped after the frames.
    pub end: StackEnd,
    /// What its blocks live at exit are.
    pub reach: Reach,
}

impl Metric {
    /// The site's value of this metric.
    pub(super) fn of(self, m: &StackMetrics) -> u64 {
        match self {
            Self::Bytes => m.bytes,
            Self::Count => m.allocations,
            Self::Peak => m.live_bytes_at_peak,
            Self::Leaked => m.live_bytes_at_exit,
            Self::Temporary => m.temporary_allocations,
            Self::Mapped => m.mapped_bytes,
            Self::MappedPeak => m.mapped_bytes_at_peak,
            Self::MappedExit => m.mapped_bytes_at_exit,
            Self::Brk => m.brk_bytes,
        }
    }
}

/// The profile's sites ranked by `by`, highest first, ties by stack id
/// then position: the stacks `--focus` keeps, with the frames `--hide`
/// leaves. `keep_zero` keeps sites whose value is 0; `limit` keeps the
/// first N.
pub(super) fn ranked<'a>(
    p: &'a Prepared<'_>,
    by: Metric,
    limit: Option<usize>,
    keep_zero: bool,
) -> Vec<Site<'a>> {
    let mut sites: Vec<Site<'a>> = p
        .profile
        .stacks
        .iter()
        .enumerate()
        .filter(|&(index, _)| p.keeps(index))
        .map(|(index, s)| Site {
            index,
            id: s.id,
            frames: p.frames(index),
            metrics: p.reachable.as_leak(index, &s.metrics),
            end: s.end,
            reach: p.reachable.reach.get(index).copied().unwrap_or_default(),
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

/// The frame shown past the last one of a stack whose walk stopped before
/// the program's entry (issue 23): `[truncated: why]`, naming the image
/// the walk stopped in when it had no table (or no rule for the address);
/// None for a complete stack.
pub(super) fn truncation(profile: &Profile, site: &Site<'_>) -> Option<String> {
    let last = site.frames.last();
    let module = last.and_then(|f| f.module.as_deref());
    let why = match site.end {
        StackEnd::Complete => return None,
        StackEnd::StackSwitch => return Some("[stack switch]".to_owned()),
        StackEnd::NoTable => match module {
            Some(module) => {
                let loaded = profile.unwind.images.iter().any(|i| {
                    i.image.to_str() == Some(module) && matches!(i.outcome, Outcome::Loaded { .. })
                });
                let base = module_base(module);
                if loaded {
                    match last.and_then(|f| f.offset) {
                        Some(offset) => format!("no unwind rule at {base}+{offset:#x}"),
                        None => format!("no unwind rule in {base}"),
                    }
                } else {
                    format!("no unwind table for {base}")
                }
            }
            None => "no unwind table for code outside any file".to_owned(),
        },
        end => end.describe().to_owned(),
    };
    Some(format!("[truncated: {why}]"))
}

/// A frame's name in folded stacks and flame graphs: the function, else
/// `module+0xOFFSET` (the file offset, as addr2line takes it), else
/// `[unknown]`. `;` becomes `:` (as in FlameGraph's stackcollapse
/// scripts) and control characters become spaces, so a name never splits
/// a stack or a line.
pub(super) fn folded_name(f: &Frame) -> Cow<'_, str> {
    let name: Cow<'_, str> = match (f.function.as_deref().map(str::trim), &f.module) {
        (Some(func), _) if !func.is_empty() => Cow::Borrowed(func),
        (_, Some(module)) => Cow::Owned(unnamed(module, f.offset)),
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

/// An unnamed frame in `module`: `module+0xOFFSET`, the file offset of the
/// byte symbolized (what addr2line takes); `[module]` without one.
pub(super) fn unnamed(module: &str, offset: Option<u64>) -> String {
    match offset {
        Some(offset) => format!("{}+{offset:#x}", module_base(module)),
        None => format!("[{}]", module_base(module)),
    }
}

pub(super) fn add(sum: &mut StackMetrics, m: &StackMetrics) {
    sum.allocations = sum.allocations.saturating_add(m.allocations);
    sum.bytes = sum.bytes.saturating_add(m.bytes);
    sum.live_bytes_at_peak = sum.live_bytes_at_peak.saturating_add(m.live_bytes_at_peak);
    sum.live_allocations_at_peak = sum
        .live_allocations_at_peak
        .saturating_add(m.live_allocations_at_peak);
    sum.live_bytes_at_exit = sum.live_bytes_at_exit.saturating_add(m.live_bytes_at_exit);
    sum.live_allocations_at_exit = sum
        .live_allocations_at_exit
        .saturating_add(m.live_allocations_at_exit);
    sum.temporary_allocations = sum
        .temporary_allocations
        .saturating_add(m.temporary_allocations);
    sum.mmaps = sum.mmaps.saturating_add(m.mmaps);
    sum.mapped_bytes = sum.mapped_bytes.saturating_add(m.mapped_bytes);
    sum.mapped_bytes_at_peak = sum
        .mapped_bytes_at_peak
        .saturating_add(m.mapped_bytes_at_peak);
    sum.mapped_bytes_at_exit = sum
        .mapped_bytes_at_exit
        .saturating_add(m.mapped_bytes_at_exit);
    sum.brk_bytes = sum.brk_bytes.saturating_add(m.brk_bytes);
}

/// A frame's name as JSON shows it: the whole function name, else what
/// [`folded_name`] shows.
pub(super) fn whole_name(f: &Frame) -> String {
    match f.function.as_deref() {
        Some(func) if !func.trim().is_empty() => func.to_owned(),
        _ => folded_name(f).into_owned(),
    }
}
