//! The flame graph: inferno's SVG of the folded stacks of one metric (the
//! `--by` one), outermost caller at the bottom.
//!
//! Colours come from inferno's memory palette, picked by a hash of each
//! function name, so the same profile gives the same SVG. A profile with
//! no site of non-zero value gets a small SVG that says so (inferno would
//! refuse to draw it).

use std::io::{self, Write};

use inferno::flamegraph::color::{BasicPalette, Palette};
use inferno::flamegraph::{self as inferno_fg, Options};

use super::Metric;
use super::Prepared;
use super::folded;

pub(super) fn write(
    p: &Prepared<'_>,
    by: Metric,
    limit: Option<usize>,
    w: &mut dyn Write,
) -> io::Result<()> {
    let lines = folded::lines(p, by, limit);
    let profile = p.profile;
    let title = format!("memtrail: {}", by.describe(profile.attached));
    if lines.is_empty() {
        return write_empty(&title, by.describe(profile.attached), w);
    }
    let mut opts = Options::default();
    opts.title = title;
    opts.subtitle = Some(profile.command.join(" ")).filter(|s| !s.is_empty());
    opts.count_name = by.unit().to_owned();
    opts.colors = Palette::Basic(BasicPalette::Mem);
    opts.deterministic = true;
    inferno_fg::from_lines(&mut opts, lines.iter().map(String::as_str), w)
}

/// An SVG with a single message, for a graph with nothing to draw.
fn write_empty(title: &str, what: &str, w: &mut dyn Write) -> io::Result<()> {
    // `title` and the message are memtrail's own text: nothing to escape.
    write!(
        w,
        concat!(
            "<?xml version=\"1.0\" standalone=\"no\"?>\n",
            "<svg version=\"1.1\" width=\"1200\" height=\"80\" ",
            "xmlns=\"http://www.w3.org/2000/svg\">\n",
            "<text x=\"600\" y=\"24\" text-anchor=\"middle\" font-family=\"monospace\" ",
            "font-size=\"17\">{}</text>\n",
            "<text x=\"600\" y=\"56\" text-anchor=\"middle\" font-family=\"monospace\" ",
            "font-size=\"12\">no allocation site has {}</text>\n",
            "</svg>\n"
        ),
        title, what
    )
}
