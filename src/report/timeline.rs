//! The timeline report: an SVG chart of the tree's heap over time (the
//! profile's `timeline`), and the text report's sparkline.
//!
//! The chart draws, per interval, the live heap's maximum stacked by the
//! top sites (the timeline's `sites`, largest at the bottom, then `other`;
//! the sites of one caller outside allocator wrappers are one layer, named
//! by it), or as one area for a profile without them, on the left axis;
//! anonymous-mmap bytes as a line on their own right axis (a large
//! reservation does not flatten a small heap); resident memory (RSS, when
//! recorded) as a dashed line on the heap's axis; time ticks below; marks
//! the exact peak instant (linked to the list below it), and lists the
//! sites that made up the heap at its peak (`--by peak`, the
//! "stack at peak" view) under the legend. Colours go by rank in the
//! legend, from a fixed palette. Hand-written SVG: every text is escaped;
//! the same profile gives the same bytes.

use std::fmt::Write as _;
use std::io::{self, Write};

use super::group::{Group, Grouping, frame_key, group};
use super::names::{module_base, short};
use super::sites::{folded_name, ranked};
use super::{Metric, Prepared};
use crate::profile::timeline::{Point, Timeline};
use crate::profile::{Frame, Profile, human_bytes};

/// Room right of the plot for the mappings' axis.
const WIDTH: f64 = 1040.0;
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

/// The longest legend or list label, in characters (longer ones end in
/// `…`): what fits right of the value in the chart's width.
const LABEL_CHARS: usize = 100;
/// The longest title, in characters, at its 16-pixel font.
const TITLE_CHARS: usize = 86;

/// A layer of the chart: a site (or the sites of one caller) or `other`,
/// a value per point.
struct Layer<'a> {
    /// The stacks' ids; empty for `other`.
    stacks: Vec<u64>,
    label: String,
    colour: &'a str,
    values: Vec<u64>,
    peak: u64,
}

/// `s` cut to `max` characters, ending in `…` when cut.
fn fit(s: &str, max: usize) -> String {
    if s.chars().count() <= max {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(max.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// A frame's label: its function (shortened) or module, with its file
/// and line when known.
fn frame_label(frame: &Frame) -> String {
    let name = short(&folded_name(frame)).into_owned();
    match (&frame.file, frame.line) {
        (Some(file), Some(line)) => format!("{name} ({}:{line})", module_base(file)),
        (Some(file), None) => format!("{name} ({})", module_base(file)),
        _ => name,
    }
}

/// A stack's layer key and label: its first frame outside allocator
/// wrappers (its innermost frame with `--no-group`), or its id when the
/// profile has no such stack.
fn site_label(p: &Prepared<'_>, grouping: &Grouping, stack: u64) -> (String, String) {
    let frames = p
        .profile
        .stacks
        .iter()
        .position(|s| s.id == stack)
        .map(|i| p.frames(i));
    let Some(frames) = frames.filter(|f| !f.is_empty()) else {
        return (format!("stack {stack}"), format!("stack {stack}"));
    };
    let frame = &frames[grouping.caller(frames).unwrap_or(0)];
    let key = match grouping.enabled() {
        true => {
            let (name, module) = frame_key(frame);
            format!("{name} in {module}")
        }
        false => format!("stack {stack}"),
    };
    let label = if grouping.enabled() {
        // The sites of one caller are one layer, whatever their lines.
        let name = short(&folded_name(frame)).into_owned();
        match &frame.file {
            Some(file) => format!("{name} ({})", module_base(file)),
            None => name,
        }
    } else {
        frame_label(frame)
    };
    (key, fit(&label, LABEL_CHARS))
}

/// The layers to stack, bottom first: the sites (those of one caller
/// summed into one layer), then `other` when it is ever above 0. None
/// when the timeline has no site series (a profile written before
/// memtrail kept them, or one that does not match its points).
fn layers<'a>(p: &Prepared<'_>) -> Vec<Layer<'a>> {
    let t = &p.profile.timeline;
    let n = t.tree.points.len();
    if t.other_bytes.len() != n || t.sites.iter().any(|s| s.live_bytes.len() != n) {
        return Vec::new();
    }
    let grouping = &p.opts.shaping.grouping;
    let mut keys: Vec<String> = Vec::new();
    let mut out: Vec<Layer<'a>> = Vec::new();
    for s in &t.sites {
        let (key, label) = site_label(p, grouping, s.stack);
        match keys.iter().position(|k| *k == key) {
            Some(i) => {
                let layer = &mut out[i];
                layer.stacks.push(s.stack);
                for (sum, v) in layer.values.iter_mut().zip(&s.live_bytes) {
                    *sum += v;
                }
                layer.peak = layer.values.iter().copied().max().unwrap_or(0);
            }
            None => {
                keys.push(key);
                out.push(Layer {
                    stacks: vec![s.stack],
                    label,
                    colour: PALETTE[out.len() % PALETTE.len()],
                    values: s.live_bytes.clone(),
                    peak: s.peak_bytes,
                });
            }
        }
    }
    let other_peak = t.other_bytes.iter().copied().max().unwrap_or(0);
    if other_peak > 0 {
        out.push(Layer {
            stacks: Vec::new(),
            label: "other sites and blocks without a stack".to_owned(),
            colour: OTHER,
            values: t.other_bytes.clone(),
            peak: other_peak,
        });
    }
    out
}

/// A layer's `data-stack`: its stacks' ids, or `other`.
fn layer_id(layer: &Layer<'_>) -> String {
    if layer.stacks.is_empty() {
        "other".to_owned()
    } else {
        let ids: Vec<String> = layer.stacks.iter().map(u64::to_string).collect();
        ids.join(" ")
    }
}

/// At most six round values from 0 to at least `max`: the step is a power
/// of two, so byte ticks read `256.0 KiB`, `512.0 KiB`, `4.0 MiB`.
/// Returns the step and the axis's top (a whole number of steps).
fn ticks(max: u64) -> (u64, u64) {
    let max = max.max(1);
    let mut step = 1u64;
    while step.saturating_mul(5) < max {
        step = step.saturating_mul(2);
    }
    let top = max.div_ceil(step) * step;
    (step, top)
}

/// The chart's scales: an interval's index to x, bytes to y on the
/// heap's axis (left) and on the mappings' (right).
struct Scales {
    /// Intervals across the plot (at least 1).
    n: f64,
    heap_top: u64,
    mapped_top: u64,
}

impl Scales {
    fn x(&self, i: f64) -> f64 {
        PLOT_LEFT + i / self.n * PLOT_WIDTH
    }

    fn y(&self, v: u64) -> f64 {
        PLOT_TOP + PLOT_HEIGHT - v as f64 / self.heap_top as f64 * PLOT_HEIGHT
    }

    fn y_mapped(&self, v: u64) -> f64 {
        PLOT_TOP + PLOT_HEIGHT - v as f64 / self.mapped_top as f64 * PLOT_HEIGHT
    }

    /// Each interval a step: flat over its width at its value, as SVG
    /// points on the heap's axis.
    fn steps(&self, values: impl Iterator<Item = u64>) -> String {
        let mut out = String::new();
        for (i, v) in values.enumerate() {
            let (x0, x1) = (self.x(i as f64), self.x(i as f64 + 1.0));
            let _ = write!(out, " {x0:.1},{:.1} {x1:.1},{:.1}", self.y(v), self.y(v));
        }
        out
    }
}

/// Writes the SVG chart of `profile`'s timeline.
pub(super) fn write(p: &Prepared<'_>, w: &mut dyn Write) -> io::Result<()> {
    let profile = p.profile;
    let t = &profile.timeline;
    let points = &t.tree.points;
    // The heap and the mappings each on their own axis (left and right):
    // a large reservation does not flatten a small heap.
    let heap_max = points
        .iter()
        .map(|p| p.live_bytes.max(p.rss_bytes))
        .max()
        .unwrap_or(0);
    let mapped_max = points.iter().map(|p| p.mapped_bytes).max().unwrap_or(0);
    let (heap_step, heap_top) = ticks(heap_max);
    let (mapped_step, mapped_top) = ticks(mapped_max);
    let sc = Scales {
        n: points.len().max(1) as f64,
        heap_top,
        mapped_top,
    };
    let layers = layers(p);
    let grouping = &p.opts.shaping.grouping;
    let peak_sites = group(ranked(p, Metric::Peak, None, false), grouping, Metric::Peak);
    let legend_top = PLOT_TOP + PLOT_HEIGHT + 56.0;
    let legend_rows = layers.len() as f64 + if layers.is_empty() { 0.0 } else { 1.5 };
    let peak_top = legend_top + ROW * legend_rows;
    let height = peak_top + 14.0 + ROW * (peak_sites.len().min(PEAK_SITES) as f64);
    let mut s = String::new();
    write_title(&mut s, profile, height);
    write_axes(
        &mut s,
        (heap_step, heap_top),
        (mapped_max > 0).then_some((mapped_step, mapped_top)),
        (
            t.start_ns + t.tree.first * t.interval_ns,
            points.len() as u64 * t.interval_ns,
        ),
    );
    if !points.is_empty() {
        if layers.is_empty() {
            write_heap(&mut s, &sc, points);
        } else {
            write_layers(&mut s, &sc, points.len(), &layers);
        }
        write_series(&mut s, &sc, points);
    }
    write_peak(&mut s, &sc, t);
    write_legend(&mut s, &layers, legend_top);
    write_peak_sites(&mut s, &peak_sites, peak_top);
    s.push_str("</g>\n</svg>\n");
    w.write_all(s.as_bytes())
}

/// The SVG's head, `height` high: its title (the command), the peak, the
/// interval and the processes; and the plot's frame.
fn write_title(s: &mut String, profile: &Profile, height: f64) {
    let t = &profile.timeline;
    let _ = writeln!(
        s,
        r##"<?xml version="1.0" encoding="UTF-8" standalone="no"?>
<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" viewBox="0 0 {WIDTH} {height}" font-family="monospace" font-size="12">
<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#ffffff"/>
<text x="{PLOT_LEFT}" y="24" font-size="16">{}</text>
<text x="{PLOT_LEFT}" y="44">peak live {} at {}; interval {}; {} processes</text>"##,
        escape(&fit(
            &format!("memtrail: heap over time — {}", profile.command.join(" ")),
            TITLE_CHARS
        )),
        human_bytes(t.peak_live_bytes),
        seconds(t.peak_live_at_ns),
        seconds(t.interval_ns),
        t.processes.len()
    );
    let _ = writeln!(
        s,
        r##"<rect x="{PLOT_LEFT}" y="{PLOT_TOP}" width="{PLOT_WIDTH}" height="{PLOT_HEIGHT}" fill="none" stroke="#999999"/>"##
    );
}

/// The heap stacked by its top sites: each layer between the sum of those
/// below and that sum plus its own; `n` intervals.
fn write_layers(s: &mut String, sc: &Scales, n: usize, layers: &[Layer<'_>]) {
    let mut below = vec![0u64; n];
    for layer in layers {
        let top: Vec<u64> = below
            .iter()
            .zip(&layer.values)
            .map(|(b, v)| b + v)
            .collect();
        let upper = sc.steps(top.iter().copied());
        let mut lower: Vec<(f64, f64)> = Vec::with_capacity(2 * below.len());
        for (i, &b) in below.iter().enumerate().rev() {
            lower.push((sc.x(i as f64 + 1.0), sc.y(b)));
            lower.push((sc.x(i as f64), sc.y(b)));
        }
        let mut poly = upper.trim_start().to_owned();
        for (lx, ly) in lower {
            let _ = write!(poly, " {lx:.1},{ly:.1}");
        }
        let stack = layer_id(layer);
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
}

/// The heap as one area, when no site has a layer.
fn write_heap(s: &mut String, sc: &Scales, points: &[Point]) {
    let heap = sc.steps(points.iter().map(|p| p.live_bytes));
    let _ = writeln!(
        s,
        r##"<polygon points="{:.1},{:.1}{heap} {:.1},{:.1}" fill="#e8743b" fill-opacity="0.8" stroke="#b04a1a"><title>live heap bytes (interval maximum)</title></polygon>"##,
        sc.x(0.0),
        sc.y(0),
        sc.x(sc.n),
        sc.y(0)
    );
}

/// The lines over the areas: the heap's total, the anonymous mappings and
/// resident memory.
fn write_series(s: &mut String, sc: &Scales, points: &[Point]) {
    let total = sc.steps(points.iter().map(|p| p.live_bytes));
    let mut mapped = String::new();
    for (i, p) in points.iter().enumerate() {
        let (x0, x1) = (sc.x(i as f64), sc.x(i as f64 + 1.0));
        let v = sc.y_mapped(p.mapped_bytes);
        let _ = write!(mapped, " {x0:.1},{v:.1} {x1:.1},{v:.1}");
    }
    // Resident memory, when the profile has it.
    let rss = points
        .iter()
        .any(|p| p.rss_bytes > 0)
        .then(|| sc.steps(points.iter().map(|p| p.rss_bytes)));
    write_lines(s, &total, &mapped, rss.as_deref());
}

/// The exact peak instant, linked to the sites that made it up, and the
/// key to the lines.
fn write_peak(s: &mut String, sc: &Scales, t: &Timeline) {
    let first = t.tree.first;
    let peak_i = t.interval_of(t.peak_live_at_ns).saturating_sub(first) as f64;
    let within = t
        .peak_live_at_ns
        .saturating_sub(t.start_ns)
        .checked_rem(t.interval_ns.max(1))
        .unwrap_or(0) as f64
        / t.interval_ns.max(1) as f64;
    let px = sc.x(peak_i + within);
    let _ = writeln!(
        s,
        r##"<a href="#stack-at-peak"><line id="peak" x1="{px:.1}" y1="{PLOT_TOP}" x2="{px:.1}" y2="{:.1}" stroke="#000000" stroke-width="1.5" stroke-dasharray="4,3"><title>peak: {} live at {} (the sites then: below, and memtrail report PROFILE --by peak)</title></line></a>
<text x="{PLOT_LEFT}" y="{:.1}">━ live heap (left axis)  <tspan fill="#3b6ee8">━</tspan> anonymous mmap (right axis)  <tspan fill="#2a9d3a">╍</tspan> resident (RSS, left axis)  ┆ peak (report --by peak: the stacks then)</text>"##,
        PLOT_TOP + PLOT_HEIGHT,
        human_bytes(t.peak_live_bytes),
        seconds(t.peak_live_at_ns),
        PLOT_TOP + PLOT_HEIGHT + 34.0
    );
}

/// The chart's lines: the heap's total, the anonymous mappings (right
/// axis) and resident memory (when recorded), as SVG points.
fn write_lines(s: &mut String, total: &str, mapped: &str, rss: Option<&str>) {
    let _ = writeln!(
        s,
        r##"<polyline points="{}" fill="none" stroke="#333333" stroke-width="1"><title>live heap bytes (interval maximum)</title></polyline>
<polyline points="{}" fill="none" stroke="#3b6ee8" stroke-width="1.5"><title>anonymous mmap bytes (interval maximum; right axis)</title></polyline>"##,
        total.trim_start(),
        mapped.trim_start()
    );
    if let Some(rss) = rss {
        let _ = writeln!(
            s,
            r##"<polyline id="rss" points="{}" fill="none" stroke="#2a9d3a" stroke-width="1.5" stroke-dasharray="6,2"><title>resident memory (RSS, interval maximum)</title></polyline>"##,
            rss.trim_start()
        );
    }
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
            let stack = layer_id(layer);
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
fn write_peak_sites(s: &mut String, peak_sites: &[Group<'_>], peak_top: f64) {
    // The stack at peak: the view `memtrail report --by peak` shows.
    let _ = writeln!(
        s,
        r#"<g id="stack-at-peak"><text x="{PLOT_LEFT}" y="{peak_top:.1}">heap at its peak by site (memtrail report PROFILE --by peak):</text>"#
    );
    for (k, g) in peak_sites.iter().take(PEAK_SITES).enumerate() {
        let site = &g.site;
        let name = site.frames.get(g.caller.unwrap_or(0)).map_or_else(
            || "[no frames]".into(),
            |f| short(&folded_name(f)).into_owned(),
        );
        let name = fit(&name, LABEL_CHARS);
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

/// The axes' ticks: the heap's on the left, the mappings' (when there
/// are any) on the right, and time below (`span`: the first interval's
/// start and the plotted duration, ns since the command started).
fn write_axes(s: &mut String, heap: (u64, u64), mapped: Option<(u64, u64)>, span: (u64, u64)) {
    let y = |v: u64, top: u64| PLOT_TOP + PLOT_HEIGHT - v as f64 / top as f64 * PLOT_HEIGHT;
    s.push_str("<g id=\"axes\" font-size=\"11\">\n");
    let (step, top) = heap;
    let mut v = 0;
    while v <= top {
        let yy = y(v, top);
        let _ = writeln!(
            s,
            r##"<line x1="{:.1}" y1="{yy:.1}" x2="{PLOT_LEFT}" y2="{yy:.1}" stroke="#999999"/><line x1="{PLOT_LEFT}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#eeeeee"/><text class="tick-heap" x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"##,
            PLOT_LEFT - 4.0,
            PLOT_LEFT + PLOT_WIDTH,
            PLOT_LEFT - 6.0,
            yy + 4.0,
            human_bytes(v)
        );
        v += step;
    }
    if let Some((step, top)) = mapped {
        let right = PLOT_LEFT + PLOT_WIDTH;
        let mut v = 0;
        while v <= top {
            let yy = y(v, top);
            let _ = writeln!(
                s,
                r##"<line x1="{right:.1}" y1="{yy:.1}" x2="{:.1}" y2="{yy:.1}" stroke="#3b6ee8"/><text class="tick-mapped" x="{:.1}" y="{:.1}" fill="#3b6ee8">{}</text>"##,
                right + 4.0,
                right + 6.0,
                yy + 4.0,
                human_bytes(v)
            );
            v += step;
        }
    }
    let (start, duration) = span;
    for k in 0..=5u64 {
        let xx = PLOT_LEFT + k as f64 / 5.0 * PLOT_WIDTH;
        let anchor = match k {
            0 => "start",
            5 => "end",
            _ => "middle",
        };
        let _ = writeln!(
            s,
            r##"<line x1="{xx:.1}" y1="{:.1}" x2="{xx:.1}" y2="{:.1}" stroke="#999999"/><text class="tick-time" x="{xx:.1}" y="{:.1}" text-anchor="{anchor}">{}</text>"##,
            PLOT_TOP + PLOT_HEIGHT,
            PLOT_TOP + PLOT_HEIGHT + 4.0,
            PLOT_TOP + PLOT_HEIGHT + 16.0,
            seconds(start + duration * k / 5)
        );
    }
    s.push_str("</g>\n");
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
