//! The profile's timeline (the heap over time) and `memtrail report
//! --format timeline` (issue 15).

use std::collections::HashMap;
use std::ffi::OsString;

use serde_json::Value;

use crate::support::{self, capture, cmd, field, id, kind, memtrail, num, pid, stream_root};

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
/// `main`: one site of `main`'s, grouped by caller), and that the text
/// report prints the sparkline.
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
    assert_eq!(rows, ["3.3 MiB  main"], "{svg}");
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
    let profile = support::read_profile(&path).expect("a profile");
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

/// Each interval's tree live bytes and the values of `stacks` at the
/// interval's first highest tree value (the value carried in counting as
/// the interval's start), replayed from the event stream at the profile's
/// final interval width: the rule docs/profile.md states for `sites`.
fn replay(events: &[Value], interval: u64, stacks: &[u64]) -> (Vec<u64>, Vec<Vec<u64>>) {
    let mut origin = None;
    let mut open = 0usize;
    // addr -> (pid, size, stack)
    let mut blocks: HashMap<u64, (u32, u64, u64)> = HashMap::new();
    let mut total = 0u64;
    let mut per = vec![0u64; stacks.len()];
    let mut tree: Vec<u64> = Vec::new();
    let mut snaps: Vec<Vec<u64>> = Vec::new();
    let at = |stack: u64| stacks.iter().position(|&s| s == stack);
    for e in events {
        let k = kind(e);
        if k.starts_with("region") {
            continue;
        }
        let ts = num(e, "ts_ns");
        let origin = *origin.get_or_insert(ts);
        // A clock reading behind the open interval stays in it.
        open = open.max((ts.saturating_sub(origin) / interval) as usize);
        while tree.len() <= open {
            tree.push(total);
            snaps.push(per.clone());
        }
        let p = pid(e);
        let mut drop_block = |(_, size, stack): (u32, u64, u64)| {
            total -= size;
            if let Some(i) = at(stack) {
                per[i] -= size;
            }
        };
        match k {
            "free" => {
                if let Some(b) = blocks.remove(&num(e, "addr")) {
                    drop_block(b);
                }
            }
            "exit" | "exec" => {
                let gone: Vec<u64> = blocks
                    .iter()
                    .filter(|(_, b)| b.0 == p)
                    .map(|(&a, _)| a)
                    .collect();
                for a in gone {
                    let b = blocks.remove(&a).expect("listed");
                    drop_block(b);
                }
            }
            "realloc" | "reallocarray" => panic!("the fixture makes no realloc: {e}"),
            "malloc" | "calloc" | "aligned_alloc" | "memalign" | "posix_memalign" | "valloc"
            | "pvalloc" => {
                let size = num(e, "size");
                let stack = e.get("stack_id").map_or(0, |_| id(e, "stack_id"));
                if let Some(old) = blocks.insert(num(e, "addr"), (p, size, stack)) {
                    drop_block(old);
                }
                total += size;
                if let Some(i) = at(stack) {
                    per[i] += size;
                }
            }
            _ => {}
        }
        if total > tree[open] {
            tree[open] = total;
            snaps[open] = per.clone();
        }
    }
    let series = (0..stacks.len())
        .map(|i| snaps.iter().map(|s| s[i]).collect())
        .collect();
    (tree, series)
}

/// The id of the one stack whose innermost frame is `function`.
fn stack_of(profile: &Value, function: &str) -> u64 {
    let ids: Vec<u64> = profile["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["frames"][0]["function"] == function)
        .map(|s| id(s, "id"))
        .collect();
    assert_eq!(ids.len(), 1, "stacks of {function}: {ids:?}");
    ids[0]
}

/// Check that the timeline's per-site series are exact (issue 15): a
/// fixture whose two sites rise and fall in six phases (A 1000000, then B
/// 2000000 more: the peak, A freed, A 500000, B freed, A freed), 100 ms
/// apart. Each site's series equals, at every interval, its live bytes at
/// the instant the tree's live heap was highest in it, replayed from the
/// event stream; `other_bytes` is the rest of the tree's point; in the
/// interval after each phase's last call both sites hold that phase's
/// values; at the peak's interval, A 1000000 and B 2000000. The SVG chart
/// then stacks one layer per site, with a legend naming both.
#[test]
fn report_timeline_sites_exact() {
    let run = capture(&cmd("timeline_sites", &[]));
    run.expect_code(0);
    let profile = run.profile();
    let t = field(profile, "timeline");
    let interval = num(t, "interval_ns");
    // The records span the six 100 ms pauses: coarsened at least once; and
    // the pauses are wider than an interval unless the run took over 25 s.
    assert!(interval >= 2_000_000, "{interval}");
    assert!(interval < 50_000_000, "a 25 s run? interval {interval}");
    let (a, b) = (stack_of(profile, "site_a"), stack_of(profile, "site_b"));
    let sites = t["sites"].as_array().expect("sites");
    let ranked: Vec<(u64, u64)> = sites
        .iter()
        .map(|s| (id(s, "stack"), num(s, "peak_bytes")))
        .collect();
    assert_eq!(ranked, [(b, 2_000_000), (a, 1_000_000)], "{t}");
    let series = |i: usize| -> Vec<u64> {
        sites[i]["live_bytes"]
            .as_array()
            .expect("live_bytes")
            .iter()
            .map(|v| v.as_u64().expect("a number"))
            .collect()
    };
    let (b_series, a_series) = (series(0), series(1));

    let (tree, want) = replay(run.events(), interval, &[a, b]);
    assert_eq!(num(field(t, "tree"), "first"), 0);
    let points: Vec<u64> = t["tree"]["points"]
        .as_array()
        .expect("points")
        .iter()
        .map(|p| num(p, "live_bytes"))
        .collect();
    assert!(points.len() <= 512);
    assert_eq!(points, tree);
    assert_eq!(a_series, want[0]);
    assert_eq!(b_series, want[1]);
    let other: Vec<u64> = t["other_bytes"]
        .as_array()
        .expect("other_bytes")
        .iter()
        .map(|v| v.as_u64().expect("a number"))
        .collect();
    let rest: Vec<u64> = (0..tree.len())
        .map(|i| tree[i] - want[0][i] - want[1][i])
        .collect();
    assert_eq!(other, rest);

    // The phases: the fixture's 70 calls of 100000 bytes, in order.
    let origin = num(&run.events()[0], "ts_ns");
    let mut mine = std::collections::HashSet::new();
    let slots: Vec<usize> = run
        .events()
        .iter()
        .filter(|e| match kind(e) {
            "malloc" if num(e, "size") == 100_000 => mine.insert(num(e, "addr")),
            "free" => mine.remove(&num(e, "addr")),
            _ => false,
        })
        .map(|e| ((num(e, "ts_ns") - origin) / interval) as usize)
        .collect();
    assert_eq!(slots.len(), 70);
    let ends = [10, 30, 40, 45, 65, 70];
    let values = [
        (1_000_000, 0),
        (1_000_000, 2_000_000),
        (0, 2_000_000),
        (500_000, 2_000_000),
        (500_000, 0),
        (0, 0),
    ];
    for (end, (va, vb)) in ends.iter().zip(values) {
        let k = slots[end - 1] + 1;
        assert_eq!((a_series[k], b_series[k]), (va, vb), "after call {end}");
    }
    let peak = ((num(t, "peak_live_at_ns") - num(t, "start_ns")) / interval) as usize;
    assert_eq!((a_series[peak], b_series[peak]), (1_000_000, 2_000_000));

    // The chart: a layer per site (and `other` only when it is above 0).
    let path = run.dir.path().join("profile.json");
    let (_, status, stdout, stderr) = memtrail(
        &[
            "report".into(),
            path.into(),
            "--format".into(),
            "timeline".into(),
        ],
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    let svg = String::from_utf8(stdout).expect("utf-8");
    let doc = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}: {svg}"));
    let layers: Vec<String> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("layer"))
        .map(|n| n.attribute("data-stack").unwrap_or("").to_owned())
        .collect();
    let mut want_layers = vec![b.to_string(), a.to_string()];
    if other.iter().any(|&o| o > 0) {
        want_layers.push("other".into());
    }
    assert_eq!(layers, want_layers, "{svg}");
    let legend: Vec<String> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("legend-entry"))
        .filter_map(|n| n.descendants().find(|c| c.has_tag_name("text")))
        .filter_map(|n| n.text())
        .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    assert!(
        legend
            .iter()
            .any(|l| l == "976.6 KiB site_a (timeline_sites.c)"),
        "{legend:?}"
    );
    assert!(
        legend
            .iter()
            .any(|l| l == "1.9 MiB site_b (timeline_sites.c)"),
        "{legend:?}"
    );
    let link = doc
        .descendants()
        .find(|n| n.attribute("id") == Some("peak"))
        .and_then(|n| n.parent_element())
        .expect("the peak marker's parent");
    assert_eq!(link.tag_name().name(), "a");
    assert_eq!(link.attribute("href"), Some("#stack-at-peak"));
    // The heap's axis: power-of-two steps up to the first past the peak.
    let ticks: Vec<&str> = doc
        .descendants()
        .filter(|n| n.attribute("class") == Some("tick-heap"))
        .filter_map(|n| n.text())
        .collect();
    assert_eq!(ticks, ["0 B", "1.0 MiB", "2.0 MiB", "3.0 MiB"], "{svg}");
}
