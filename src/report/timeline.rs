//! The timeline report: an SVG chart of the tree's heap over time (the
//! profile's `timeline`), and the text report's sparkline.
//!
//! The chart draws, per interval, the live heap's maximum stacked by the
//! top sites (the timeline's `sites`, largest at the bottom, then `other`),
//! or as one area for a profile without them, anonymous-mmap bytes and
//! resident memory (RSS, when recorded) as lines, marks the exact peak instant (linked to the list below it), and
//! lists the sites that made up the heap at its peak (`--by peak`, the
//! "stack at peak" view) under the legend. Colours go by rank in the
//! legend, from a fixed palette. Hand-written SVG: every text is escaped;
//! the same profile gives the same bytes.

use std::fmt::Write as _;
use std::io::{self, Write};

use super::Metric;
use super::sites::{Site, folded_name, merge_same_frames, module_base, ranked};
use crate::profile::{Profile, human_bytes};

const WIDTH: f64 = 960.0;
const PLOT_LEFT: f64 = 80.0;
const PLOT_TOP: f64 = 60.0;
const PLOT_WIDTH: f64 = 860.0;
const PLOT_HEIGHT: f64 = 300.0;
/// Sites at peak listed under the chart.
const PEAK_SITES: usize = 5;
/// The layers' colours, by rank of the site (as many as `TOP_SITES`).
const PALETTE: [&str; crate::profile::timeline::TOP_SITES] = [
    "#e8743b", "#19a979", "#945ecf", "#ed4a7b", "#13a4b4", "#bf399e", "#f4b400", "#6c8893",
    "#ee6868", "#2f6497",
];
/// The `other` layer's colour.
const OTHER: &str = "#b0b0b0";
/// A legend or list row's height.
const ROW: f64 = 18.0;
const SPARK: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
/// Columns of the text report's sparkline.
pub(super) const SPARK_WIDTH: usize = 48;

fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if c.is_control() => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

fn seconds(ns: u64) -> String {
    if ns >= 1_000_000_000 {
        format!("{:.2} s", ns as f64 / 1e9)
    } else {
        format!("{:.1} ms", ns as f64 / 1e6)
    }
}

/// A layer of the chart: a site or `other`, a value per point.
struct Layer<'a> {
    /// `None` for `other`.
    stack: Option<u64>,
    label: String,
    colour: &'a str,
    values: &'a [u64],
    peak: u64,
}

/// A site's label: its innermost frame's function (or module), with its
/// file and line when known, or its id when the profile has no such stack.
fn site_label(profile: &Profile, stack: u64) -> String {
    let Some(frame) = profile
        .stacks
        .iter()
        .find(|s| s.id == stack)
        .and_then(|s| s.frames.first())
    else {
        return format!("stack {stack}");
    };
    let name = folded_name(frame);
    match (&frame.file, frame.line) {
        (Some(file), Some(line)) => format!("{name} ({}:{line})", module_base(file)),
        (Some(file), None) => format!("{name} ({})", module_base(file)),
        _ => name.into_owned(),
    }
}

/// The layers to stack, bottom first: the sites, then `other` when it is
/// ever above 0. None when the timeline has no site series (a profile
/// written before memtrail kept them, or one that does not match its
/// points).
fn layers<'a>(profile: &'a Profile) -> Vec<Layer<'a>> {
    let t = &profile.timeline;
    let n = t.tree.points.len();
    if t.other_bytes.len() != n || t.sites.iter().any(|s| s.live_bytes.len() != n) {
        return Vec::new();
    }
    let mut out: Vec<Layer<'a>> = t
        .sites
        .iter()
        .zip(PALETTE.iter().cycle())
        .map(|(s, colour)| Layer {
            stack: Some(s.stack),
            label: site_label(profile, s.stack),
            colour,
            values: &s.live_bytes,
            peak: s.peak_bytes,
        })
        .collect();
    let other_peak = t.other_bytes.iter().copied().max().unwrap_or(0);
    if other_peak > 0 {
        out.push(Layer {
            stack: None,
            label: "other sites and blocks without a stack".to_owned(),
            colour: OTHER,
            values: &t.other_bytes,
            peak: other_peak,
        });
    }
    out
}

/// Writes the SVG chart of `profile`'s timeline.
pub(super) fn write(profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
    let t = &profile.timeline;
    let points = &t.tree.points;
    let n = points.len().max(1) as f64;
    let max = points
        .iter()
        .map(|p| p.live_bytes.max(p.mapped_bytes).max(p.rss_bytes))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let first = t.tree.first;
    let x = |i: f64| PLOT_LEFT + i / n * PLOT_WIDTH;
    let y = |v: u64| PLOT_TOP + PLOT_HEIGHT - v as f64 / max * PLOT_HEIGHT;
    let layers = layers(profile);
    let peak_sites = merge_same_frames(ranked(profile, Metric::Peak, None, false), Metric::Peak);
    let legend_top = PLOT_TOP + PLOT_HEIGHT + 56.0;
    let legend_rows = layers.len() as f64 + if layers.is_empty() { 0.0 } else { 1.5 };
    let peak_top = legend_top + ROW * legend_rows;
    let height = peak_top + 14.0 + ROW * (peak_sites.len().min(PEAK_SITES) as f64);
    let mut s = String::new();
    let _ = writeln!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8" standalone="no"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="12">
<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>
<text x="{PLOT_LEFT}" y="24" font-size="16">memtrail: heap over time — {}</text>
<text x="{PLOT_LEFT}" y="44">peak live {} at {}; interval {}; {} processes</text>"##,
        escape(&profile.command.join(" ")),
        human_bytes(t.peak_live_bytes),
        seconds(t.peak_live_at_ns),
        seconds(t.interval_ns),
        t.processes.len()
    );
    let _ = writeln!(
        s,
        r##"<rect x="{PLOT_LEFT}" y="{PLOT_TOP}" width="{PLOT_WIDTH}" height="{PLOT_HEIGHT}" fill="none" stroke="#999999"/>
<text x="{}" y="{}" text-anchor="end">{}</text>
<text x="{}" y="{}" text-anchor="end">0</text>"##,
        PLOT_LEFT - 4.0,
        PLOT_TOP + 10.0,
        human_bytes(max as u64),
        PLOT_LEFT - 4.0,
        PLOT_TOP + PLOT_HEIGHT
    );
    // Each interval a step: flat over its width at its value.
    let steps = |values: &mut dyn Iterator<Item = u64>| {
        let mut out = String::new();
        for (i, v) in values.enumerate() {
            let (x0, x1) = (x(i as f64), x(i as f64 + 1.0));
            let _ = write!(out, " {x0:.1},{:.1} {x1:.1},{:.1}", y(v), y(v));
        }
        out
    };
    if !points.is_empty() && !layers.is_empty() {
        // Stacked: each layer between the sum of those below and that sum
        // plus its own.
        let mut below = vec![0u64; points.len()];
        for layer in &layers {
            let top: Vec<u64> = below.iter().zip(layer.values).map(|(b, v)| b + v).collect();
            let upper = steps(&mut top.iter().copied());
            let mut lower: Vec<(f64, f64)> = Vec::with_capacity(2 * below.len());
            for (i, &b) in below.iter().enumerate().rev() {
                lower.push((x(i as f64 + 1.0), y(b)));
                lower.push((x(i as f64), y(b)));
            }
            let mut poly = upper.trim_start().to_owned();
            for (lx, ly) in lower {
                let _ = write!(poly, " {lx:.1},{ly:.1}");
            }
            let stack = layer
                .stack
                .map_or_else(|| "other".to_owned(), |id| id.to_string());
            let _ = writeln!(
                s,
                r##"<polygon class="layer" data-stack="{stack}" points="{poly}" fill="{}" fill-opacity="0.85" stroke="{}" stroke-width="0.5"><title>{}: peak {}</title></polygon>"##,
                layer.colour,
                layer.colour,
                escape(&layer.label),
                human_bytes(layer.peak)
            );
            below = top;
        }
    } else if !points.is_empty() {
        let heap = steps(&mut points.iter().map(|p| p.live_bytes));
        let _ = writeln!(
            s,
            r##"<polygon points="{:.1},{:.1}{heap} {:.1},{:.1}" fill="#e8743b" fill-opacity="0.8" stroke="#b04a1a"><title>live heap bytes (interval maximum)</title></polygon>"##,
            x(0.0),
            y(0),
            x(n),
            y(0)
        );
    }
    if !points.is_empty() {
        let total = steps(&mut points.iter().map(|p| p.live_bytes));
        let mapped = steps(&mut points.iter().map(|p| p.mapped_bytes));
        let _ = writeln!(
            s,
            r##"<polyline points="{}" fill="none" stroke="#333333" stroke-width="1"><title>live heap bytes (interval maximum)</title></polyline>
<polyline points="{}" fill="none" stroke="#3b6ee8" stroke-width="1.5"><title>anonymous mmap bytes (interval maximum)</title></polyline>"##,
            total.trim_start(),
            mapped.trim_start()
        );
        // Resident memory, when the profile has it.
        if points.iter().any(|p| p.rss_bytes > 0) {
            let rss = steps(&mut points.iter().map(|p| p.rss_bytes));
            let _ = writeln!(
                s,
                r##"<polyline id="rss" points="{}" fill="none" stroke="#2a9d3a" stroke-width="1.5" stroke-dasharray="6,2"><title>resident memory (RSS, interval maximum)</title></polyline>"##,
                rss.trim_start()
            );
        }
    }
    // The exact peak instant, linked to the sites that made it up.
    let peak_i = t.interval_of(t.peak_live_at_ns).saturating_sub(first) as f64;
    let within = t
        .peak_live_at_ns
        .saturating_sub(t.start_ns)
        .checked_rem(t.interval_ns.max(1))
        .unwrap_or(0) as f64
        / t.interval_ns.max(1) as f64;
    let px = x(peak_i + within);
    let _ = writeln!(
        s,
        r##"<a href="#stack-at-peak"><line id="peak" x1="{px:.1}" y1="{PLOT_TOP}" x2="{px:.1}" y2="{:.1}" stroke="#000000" stroke-width="1.5" stroke-dasharray="4,3"><title>peak: {} live at {} (the sites then: below, and memtrail report PROFILE --by peak)</title></line></a>
<text x="{PLOT_LEFT}" y="{:.1}">0</text>
<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>
<text x="{PLOT_LEFT}" y="{:.1}">━ live heap  <tspan fill="#3b6ee8">━</tspan> anonymous mmap  <tspan fill="#2a9d3a">╍</tspan> resident (RSS)  ┆ peak (memtrail report PROFILE --by peak shows the stacks at the peak)</text>"##,
        PLOT_TOP + PLOT_HEIGHT,
        human_bytes(t.peak_live_bytes),
        seconds(t.peak_live_at_ns),
        PLOT_TOP + PLOT_HEIGHT + 16.0,
        PLOT_LEFT + PLOT_WIDTH,
        PLOT_TOP + PLOT_HEIGHT + 16.0,
        seconds(t.start_ns + (first + points.len() as u64) * t.interval_ns),
        PLOT_TOP + PLOT_HEIGHT + 34.0
    );
    write_legend(&mut s, &layers, legend_top);
    write_peak_sites(&mut s, &peak_sites, peak_top);
    s.push_str("</g>\n</svg>\n");
    w.write_all(s.as_bytes())
}

/// The legend of the layers: each site's colour, peak and name, top
/// layer first.
fn write_legend(s: &mut String, layers: &[Layer<'_>], legend_top: f64) {
    if layers.is_empty() {
        return;
    }
    {
        let _ = writeln!(
            s,
            r#"<g id="legend"><text x="{PLOT_LEFT}" y="{legend_top:.1}">live heap by site, largest at the bottom (each site's highest value):</text>"#
        );
        // Top of the stack first, as the layers appear.
        for (k, layer) in layers.iter().rev().enumerate() {
            let row = legend_top + ROW * (k as f64 + 1.0);
            let stack = layer
                .stack
                .map_or_else(|| "other".to_owned(), |id| id.to_string());
            let _ = writeln!(
                s,
                r#"<g class="legend-entry" data-stack="{stack}"><rect x="{}" y="{:.1}" width="10" height="10" fill="{}"/><text x="{}" y="{row:.1}">{:>10}  {}</text></g>"#,
                PLOT_LEFT + 16.0,
                row - 9.0,
                layer.colour,
                PLOT_LEFT + 32.0,
                escape(&human_bytes(layer.peak)),
                escape(&layer.label)
            );
        }
        s.push_str("</g>\n");
    }
}

/// The heap at its peak by site: the view `memtrail report --by peak`
/// shows.
fn write_peak_sites(s: &mut String, peak_sites: &[(Site<'_>, usize)], peak_top: f64) {
    // The stack at peak: the view `memtrail report --by peak` shows.
    let _ = writeln!(
        s,
        r#"<g id="stack-at-peak"><text x="{PLOT_LEFT}" y="{peak_top:.1}">heap at its peak by site (memtrail report PROFILE --by peak):</text>"#
    );
    for (k, (site, _)) in peak_sites.iter().take(PEAK_SITES).enumerate() {
        let name = site
            .frames
            .first()
            .map_or_else(|| "[no frames]".into(), folded_name);
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{:.1}">{:>10}  {}</text>"#,
            PLOT_LEFT + 16.0,
            peak_top + ROW * (k as f64 + 1.0),
            escape(&human_bytes(site.metrics.live_bytes_at_peak)),
            escape(&name)
        );
    }
}

/// The tree's live heap as a sparkline of at most [`SPARK_WIDTH`]
/// characters (each the maximum of its intervals), or `None` without a
/// timeline.
pub(super) fn sparkline(profile: &Profile) -> Option<String> {
    let points = &profile.timeline.tree.points;
    if points.is_empty() {
        return None;
    }
    let cols = points.len().min(SPARK_WIDTH);
    let mut maxima = vec![0u64; cols];
    for (i, p) in points.iter().enumerate() {
        let c = i * cols / points.len();
        maxima[c] = maxima[c].max(p.live_bytes);
    }
    let top = maxima.iter().copied().max().unwrap_or(0).max(1);
    Some(
        maxima
            .iter()
            .map(|&v| SPARK[((v * (SPARK.len() as u64 - 1)).div_ceil(top)) as usize])
            .collect(),
    )
}
