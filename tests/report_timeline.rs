//! The profile's timeline (the heap over time) and `memtrail report
//! --format timeline` (issue 15).

mod common;

use std::ffi::OsString;

use serde_json::Value;

use common::{capture, cmd, field, memtrail, num, stream_root};

/// The highest `key` of a series' points.
fn max_of(series: &Value, key: &str) -> u64 {
    series["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| num(p, key))
        .max()
        .expect("a point")
}

/// Check that the timeline of `peak` (live bytes 1000003, 3000006,
/// 2000003, 3500010 at the peak, ...) holds the exact peak value and
/// instant, that the peak's interval has the peak's value and two live
/// blocks, and that the root process's series peaks at the same value.
#[test]
fn report_timeline_exact_peak() {
    let run = capture(&cmd("peak", &[]));
    run.expect_code(0);
    let profile = run.profile();
    let totals = field(profile, "totals");
    let t = field(profile, "timeline");
    let peak = 2000003 + 1500007;
    assert_eq!(num(t, "peak_live_bytes"), peak);
    assert_eq!(num(t, "peak_live_at_ns"), num(totals, "peak_live_at_ns"));
    let tree = field(t, "tree");
    assert_eq!(max_of(tree, "live_bytes"), peak);
    assert_eq!(max_of(tree, "live_blocks"), 2);
    let interval = num(t, "interval_ns");
    let slot = (num(t, "peak_live_at_ns") - num(t, "start_ns")) / interval;
    let at = &tree["points"][(slot - num(tree, "first")) as usize];
    assert_eq!(num(at, "live_bytes"), peak, "{t}");
    assert!(
        tree["points"].as_array().unwrap().len() <= 512,
        "bounded: {t}"
    );

    let root = stream_root(run.events());
    let series: Vec<&Value> = t["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| num(p, "pid") == u64::from(root))
        .collect();
    assert_eq!(series.len(), 1, "{t}");
    assert_eq!(max_of(series[0], "live_bytes"), peak);
    assert_eq!(
        t["processes"].as_array().unwrap().len(),
        profile["processes"].as_array().unwrap().len()
    );
}

/// Check that `--format timeline` writes a well-formed SVG (parsed) with
/// the peak marker and the sites at the peak (B and C, both allocated in
/// `main`), and that the text report prints the sparkline.
#[test]
fn report_timeline_svg_well_formed() {
    let run = capture(&cmd("peak", &[]));
    run.expect_code(0);
    let path = run.dir.path().join("profile.json");
    let report = |args: &[&str]| {
        let mut all: Vec<OsString> = vec!["report".into(), path.clone().into()];
        all.extend(args.iter().map(OsString::from));
        let (_, status, stdout, stderr) = memtrail(&all, b"");
        assert_eq!(status.code(), Some(0), "{stderr}");
        String::from_utf8(stdout).expect("utf-8")
    };
    let svg = report(&["--format", "timeline"]);
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}: {svg}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let peak = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("peak"))
        .expect("peak marker");
    let title = peak
        .first_element_child()
        .and_then(|t| t.text())
        .unwrap_or("");
    assert!(title.starts_with("peak: 3.3 MiB live at "), "{title}");
    let group = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("stack-at-peak"))
        .expect("stack at peak");
    let rows: Vec<&str> = group
        .children()
        .filter(|n| n.is_element())
        .skip(1)
        .filter_map(|n| n.text())
        .map(str::trim)
        .collect();
    assert_eq!(rows, ["1.9 MiB  main", "1.4 MiB  main"], "{svg}");
    assert!(doc.descendants().any(|n| n.has_tag_name("polygon")));

    let text = report(&[]);
    let spark = text
        .lines()
        .find(|l| l.starts_with("  heap over time  "))
        .unwrap_or_else(|| panic!("no sparkline: {text}"));
    assert!(spark.contains('█'), "{spark}");
}

/// Check that `memtrail run --no-timeline` (the switch
/// perf/timeline_cost.sh measures the timeline's cost with) keeps no
/// timeline but the same exact peak, and that the text report then draws no
/// sparkline (issue 15).
#[test]
fn report_timeline_off_with_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("profile.json");
    let mut args: Vec<OsString> = vec![
        "run".into(),
        "--no-timeline".into(),
        "-q".into(),
        "-o".into(),
        path.clone().into(),
        "--".into(),
    ];
    args.extend(cmd("peak", &[]));
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    let profile = common::read_profile(&path).expect("a profile");
    assert_eq!(num(field(&profile, "totals"), "peak_live_bytes"), 3500010);
    assert_eq!(profile["attached"], Value::Bool(false));
    let t = field(&profile, "timeline");
    assert_eq!(t["tree"]["points"].as_array().map(Vec::len), Some(0), "{t}");
    assert_eq!(t["processes"].as_array().map(Vec::len), Some(0), "{t}");
    assert_eq!(num(t, "peak_live_bytes"), 0, "{t}");

    let (_, status, stdout, stderr) = memtrail(&["report".into(), path.into()], b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    let text = String::from_utf8(stdout).expect("utf-8");
    assert!(!text.contains("heap over time"), "{text}");
}
