//! The timeline report: an SVG chart of the tree's heap over time (the
//! profile's `timeline`), and the text report's sparkline.
//!
//! The chart draws, per interval, the live heap's maximum as a filled area
//! and anonymous-mmap bytes as a line, marks the exact peak instant, and
//! lists the sites that made up the heap at its peak (`--by peak`, the
//! "stack at peak" view) beside it. Hand-written SVG: every text is
//! escaped; the same profile gives the same bytes.

use std::fmt::Write as _;
use std::io::{self, Write};

use super::Metric;
use super::sites::{folded_name, merge_same_frames, ranked};
use crate::report::{Profile, human_bytes};

const WIDTH: f64 = 960.0;
const PLOT_LEFT: f64 = 80.0;
const PLOT_TOP: f64 = 60.0;
const PLOT_WIDTH: f64 = 860.0;
const PLOT_HEIGHT: f64 = 300.0;
/// Sites at peak listed under the chart.
const PEAK_SITES: usize = 5;
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

/// Writes the SVG chart of `profile`'s timeline.
pub(super) fn write(profile: &Profile, w: &mut dyn Write) -> io::Result<()> {
    let t = &profile.timeline;
    let points = &t.tree.points;
    let n = points.len().max(1) as f64;
    let max = points
        .iter()
        .map(|p| p.live_bytes.max(p.mapped_bytes))
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let first = t.tree.first;
    let x = |i: f64| PLOT_LEFT + i / n * PLOT_WIDTH;
    let y = |v: u64| PLOT_TOP + PLOT_HEIGHT - v as f64 / max * PLOT_HEIGHT;
    let peak_sites = merge_same_frames(ranked(profile, Metric::Peak, None, false), Metric::Peak);
    let height = PLOT_TOP + PLOT_HEIGHT + 70.0 + 18.0 * (peak_sites.len().min(PEAK_SITES) as f64);
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
    if !points.is_empty() {
        // Each interval a step: flat over its width at its maximum.
        let mut heap = format!("{:.1},{:.1}", x(0.0), y(0));
        let mut mapped = String::new();
        for (i, p) in points.iter().enumerate() {
            let (x0, x1) = (x(i as f64), x(i as f64 + 1.0));
            let _ = write!(
                heap,
                " {x0:.1},{:.1} {x1:.1},{:.1}",
                y(p.live_bytes),
                y(p.live_bytes)
            );
            let _ = write!(
                mapped,
                " {x0:.1},{:.1} {x1:.1},{:.1}",
                y(p.mapped_bytes),
                y(p.mapped_bytes)
            );
        }
        let _ = write!(heap, " {:.1},{:.1}", x(n), y(0));
        let _ = writeln!(
            s,
            r##"<polygon points="{heap}" fill="#e8743b" fill-opacity="0.8" stroke="#b04a1a"><title>live heap bytes (interval maximum)</title></polygon>
<polyline points="{}" fill="none" stroke="#3b6ee8" stroke-width="1.5"><title>anonymous mmap bytes (interval maximum)</title></polyline>"##,
            mapped.trim_start()
        );
    }
    // The exact peak instant.
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
        r##"<line id="peak" x1="{px:.1}" y1="{PLOT_TOP}" x2="{px:.1}" y2="{:.1}" stroke="#000000" stroke-dasharray="4,3"><title>peak: {} live at {}</title></line>
<text x="{PLOT_LEFT}" y="{:.1}">0</text>
<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>
<text x="{PLOT_LEFT}" y="{:.1}"><tspan fill="#e8743b">■</tspan> live heap  <tspan fill="#3b6ee8">■</tspan> anonymous mmap  ┆ peak</text>"##,
        PLOT_TOP + PLOT_HEIGHT,
        human_bytes(t.peak_live_bytes),
        seconds(t.peak_live_at_ns),
        PLOT_TOP + PLOT_HEIGHT + 16.0,
        PLOT_LEFT + PLOT_WIDTH,
        PLOT_TOP + PLOT_HEIGHT + 16.0,
        seconds(t.start_ns + (first + points.len() as u64) * t.interval_ns),
        PLOT_TOP + PLOT_HEIGHT + 34.0
    );
    // The stack at peak: the view `memtrail report --by peak` shows.
    let _ = writeln!(
        s,
        r#"<g id="stack-at-peak"><text x="{PLOT_LEFT}" y="{:.1}">heap at its peak by site (memtrail report PROFILE --by peak):</text>"#,
        PLOT_TOP + PLOT_HEIGHT + 56.0
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
            PLOT_TOP + PLOT_HEIGHT + 74.0 + 18.0 * k as f64,
            escape(&human_bytes(site.metrics.live_bytes_at_peak)),
            escape(&name)
        );
    }
    s.push_str("</g>\n</svg>\n");
    w.write_all(s.as_bytes())
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
