//! `memtrail report` in the text, json, folded and flamegraph formats, on
//! the hand-written profile of `tests/fixtures/report/sites.json` (its
//! stacks are listed in `support::report`). No kernel needed.

use serde_json::{Value, json};

use crate::support::report::{json_ids, memtrail, sites, write_profile};

/// Runs `memtrail report PROFILE ARGS...` on `doc`, expects exit 0 and
/// returns stdout.
fn report(doc: &Value, args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile = write_profile(dir.path(), doc);
    let mut all = vec!["report".to_owned(), profile.display().to_string()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let run = memtrail(&all);
    run.expect_code(0);
    assert_eq!(run.stderr, "", "nothing on stderr");
    run.stdout().to_owned()
}

const HEADER: &str = "\
memtrail report: ./shop --items <3> (exited with code 0 after 250.0 ms)
  1601 allocations (10.0 MiB), peak live 3.8 MiB, leaked 7 blocks (585.9 KiB)
";

/// Check that the text report lists the top N sites by bytes, highest
/// first, each with its metrics (bytes first, with its share of the
/// profile's total) and its symbolized frames innermost first: function,
/// file:line and module, inlined frames marked, unknown frames as their
/// module and file offset; stacks 20 and 60, which differ only in the address
/// of `main`, are one site.
#[test]
fn report_text_top_sites_by_bytes() {
    let out = report(&sites(), &["--top", "3"]);
    let expected = format!(
        "{HEADER}  top 3 of 5 allocation sites by bytes allocated

#1  5.7 MiB allocated (57.1%), 1000 allocations, 2.9 MiB live at peak, 0 B leaked (0 blocks)
    std::vector<…>::push_back (inlined) at /usr/include/c++/12/bits/stl_vector.h:1281 in shop
    make_buffer at src/buffer.cc:42 in shop
    main at src/main.cc:12 in shop
    libc.so.6+0x29d8f

#2  2.9 MiB allocated (28.6%), 300 allocations, 488.3 KiB live at peak, 488.3 KiB leaked (5 blocks); 2 stacks
    load_config at src/config.cc:88 in shop
    main at src/main.cc:13 in shop
    libc.so.6+0x29d8f

#3  1.4 MiB allocated (14.3%), 299 allocations, 488.3 KiB live at peak, 97.7 KiB leaked (2 blocks)
    parse;token at src/config.cc:120 in shop
    load_config at src/config.cc:90 in shop
    main at src/main.cc:13 in shop
    libc.so.6+0x29d8f
"
    );
    assert_eq!(out, expected);
}

/// Check that text sites ranked by leaked bytes leave out the sites that
/// leaked nothing and count them, and that frames without a function or
/// module show what is known (ranked by count, where all sites have a
/// value).
#[test]
fn report_text_by_leaked_and_count() {
    let out = report(&sites(), &["--by", "leaked"]);
    let expected = format!(
        "{HEADER}  top 2 of 2 allocation sites by bytes leaked (3 more with none)

#1  488.3 KiB leaked (83.3%, 5 blocks), 2.9 MiB allocated, 300 allocations, 488.3 KiB live at peak; 2 stacks
    load_config at src/config.cc:88 in shop
    main at src/main.cc:13 in shop
    libc.so.6+0x29d8f

#2  97.7 KiB leaked (16.7%, 2 blocks), 1.4 MiB allocated, 299 allocations, 488.3 KiB live at peak
    parse;token at src/config.cc:120 in shop
    load_config at src/config.cc:90 in shop
    main at src/main.cc:13 in shop
    libc.so.6+0x29d8f
"
    );
    assert_eq!(out, expected);

    let out = report(&sites(), &["--by", "count", "-n", "0"]);
    let tail = "
#4  1 allocation (0.1%), 1 B allocated, 0 B live at peak, 0 B leaked (0 blocks)
    0xdead0
    main at src/main.cc:14 in shop

#5  1 allocation (0.1%), 1 B allocated, 0 B live at peak, 0 B leaked (0 blocks)
    free_list_grow in shop
";
    assert!(out.ends_with(tail), "{out}");
    let heads: Vec<&str> = out.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(
        heads,
        [
            "#1  1000 allocations (62.5%), 5.7 MiB allocated, 2.9 MiB live at peak, 0 B leaked (0 blocks)",
            "#2  300 allocations (18.7%), 2.9 MiB allocated, 488.3 KiB live at peak, 488.3 KiB leaked (5 blocks); 2 stacks",
            "#3  299 allocations (18.7%), 1.4 MiB allocated, 488.3 KiB live at peak, 97.7 KiB leaked (2 blocks)",
            "#4  1 allocation (0.1%), 1 B allocated, 0 B live at peak, 0 B leaked (0 blocks)",
            "#5  1 allocation (0.1%), 1 B allocated, 0 B live at peak, 0 B leaked (0 blocks)",
        ]
    );
}

/// A profile with `n` one-frame stacks `f1..fn`, stack `i` allocating `i`
/// bytes once.
fn many_sites(n: u64) -> Value {
    let mut doc = sites();
    doc["stacks"] = (1..=n)
        .map(|i| {
            json!({
                "id": i.to_string(), "pid": 100, "exe": "/bin/m",
                "frames": [{"addr": 0x1000 + i, "module": "/bin/m", "function": format!("f{i}"),
                            "file": "m.c", "line": i, "inlined": false,
                            "build_id": null, "offset": 0xfff + i}],
                "allocations": 1, "bytes": i, "live_bytes_at_peak": 0,
                "live_allocations_at_peak": 0,
                "live_bytes_at_exit": 0, "live_allocations_at_exit": 0
            })
        })
        .collect();
    doc
}

/// Check that the text report shows 10 sites unless told otherwise, and
/// that `--top` larger than the number of sites shows them all.
#[test]
fn report_text_default_top_is_ten() {
    let doc = many_sites(12);
    let out = report(&doc, &[]);
    assert!(
        out.contains("  top 10 of 12 allocation sites by bytes allocated\n"),
        "{out}"
    );
    let frames: Vec<&str> = out
        .lines()
        .filter(|l| l.starts_with("    "))
        .map(str::trim)
        .collect();
    let expected: Vec<String> = (3..=12)
        .rev()
        .map(|i| format!("f{i} at m.c:{i} in m"))
        .collect();
    assert_eq!(frames, expected);

    let out = report(&doc, &["--top", "50"]);
    assert!(out.contains("  top 12 of 12 allocation sites"), "{out}");
    assert_eq!(out.matches("\n#").count(), 12);
}

/// Check that the text report says so when the profile has no stacks (as
/// `--stack-depth 0` writes it: an empty list), or no site has the metric.
#[test]
fn report_text_without_sites() {
    let mut doc = sites();
    doc["stacks"] = json!([]);
    let out = report(&doc, &[]);
    assert_eq!(
        out,
        format!("{HEADER}  no allocation sites: the profile has no stacks\n")
    );

    let mut doc = sites();
    for s in doc["stacks"].as_array_mut().expect("stacks") {
        s["live_bytes_at_exit"] = json!(0);
    }
    let out = report(&doc, &["--by", "leaked"]);
    assert_eq!(
        out,
        format!("{HEADER}  5 allocation sites, none with bytes leaked\n")
    );
}

/// Check that the JSON report holds the profile's stack entries unchanged,
/// ranked by each metric (ties by id), without the sites whose value is 0,
/// and cut by `--top`.
#[test]
fn report_json_ranks_stacks() {
    let doc = sites();
    let out: Value = serde_json::from_str(&report(&doc, &["--format", "json"])).expect("JSON");
    assert_eq!(out["format"], "memtrail-report");
    assert_eq!(out["version"], 2);
    assert_eq!(out["by"], "bytes");
    assert_eq!(out["total"], 10_500_001);
    assert_eq!(out["command"], json!(["./shop", "--items", "<3>"]));
    assert_eq!(json_ids(&out), [10, 20, 30, 60, 40, 50]);
    for entry in out["stacks"].as_array().expect("stacks") {
        let original = doc["stacks"]
            .as_array()
            .expect("stacks")
            .iter()
            .find(|s| s["id"] == entry["id"])
            .expect("same id in the profile");
        assert_eq!(entry, original);
    }

    for (by, total, ids) in [
        ("count", 1601, vec![10, 30, 20, 60, 40, 50]),
        ("peak", 4_000_000, vec![10, 20, 30]),
        ("leaked", 600_000, vec![20, 30]),
    ] {
        let out: Value =
            serde_json::from_str(&report(&doc, &["-f", "json", "--by", by])).expect("JSON");
        assert_eq!(out["by"], by);
        assert_eq!(out["total"], total, "{by}");
        assert_eq!(json_ids(&out), ids, "{by}");
    }

    let out: Value = serde_json::from_str(&report(
        &doc,
        &["-f", "json", "--by", "count", "--top", "2"],
    ))
    .expect("JSON");
    assert_eq!(json_ids(&out), [10, 30]);
}

/// Check the folded stacks exactly: outermost frame first, function names
/// only, `module+0xOFFSET` for unknown frames (the file offset), `;` in a name turned into `:`,
/// stacks that fold alike summed, lines sorted, zero values left out.
#[test]
fn report_folded_lines() {
    let doc = sites();
    assert_eq!(
        report(&doc, &["--format", "folded"]),
        "\
free_list_grow 1
libc.so.6+0x29d8f;main;load_config 3000000
libc.so.6+0x29d8f;main;load_config;parse:token 1499999
libc.so.6+0x29d8f;main;make_buffer;std::vector<int>::push_back 6000000
main;[unknown] 1
"
    );
    assert_eq!(
        report(&doc, &["-f", "folded", "--by", "leaked"]),
        "\
libc.so.6+0x29d8f;main;load_config 500000
libc.so.6+0x29d8f;main;load_config;parse:token 100000
"
    );
    assert_eq!(
        report(&doc, &["-f", "folded", "--by", "count", "--top", "2"]),
        "\
libc.so.6+0x29d8f;main;load_config;parse:token 299
libc.so.6+0x29d8f;main;make_buffer;std::vector<int>::push_back 1000
"
    );
    assert_eq!(
        report(&doc, &["-f", "folded", "--by", "peak"])
            .lines()
            .count(),
        3
    );
}

/// The frame names and values of a flame graph: the `<title>` of every
/// frame, `NAME (VALUE UNIT, PCT%)`.
fn flame_titles(svg: &str) -> Vec<String> {
    let doc = roxmltree::Document::parse_with_options(
        svg,
        roxmltree::ParsingOptions {
            allow_dtd: true,
            ..roxmltree::ParsingOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("flame graph is not well-formed XML: {e}"));
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    let mut titles: Vec<String> = doc
        .descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text().map(str::to_owned))
        .collect();
    titles.sort();
    titles
}

/// Check that the flame graph is a well-formed SVG whose frames are the
/// folded stacks' functions sized by the `--by` metric (frames narrower
/// than 0.01% of the total, here the 1-byte stacks, are left out), with the
/// metric in the title, the command as subtitle and markup in names
/// escaped.
#[test]
fn report_flamegraph_svg() {
    let doc = sites();
    let svg = report(&doc, &["--format", "flamegraph"]);
    assert_eq!(
        flame_titles(&svg),
        [
            "all (10,500,001 bytes, 100%)",
            "libc.so.6+0x29d8f (10,499,999 bytes, 100.00%)",
            "load_config (4,499,999 bytes, 42.86%)",
            "main (10,499,999 bytes, 100.00%)",
            "make_buffer (6,000,000 bytes, 57.14%)",
            "parse:token (1,499,999 bytes, 14.29%)",
            "std::vector<int>::push_back (6,000,000 bytes, 57.14%)",
        ]
    );
    assert!(svg.contains(">memtrail: bytes allocated</text>"), "title");
    assert!(svg.contains(">./shop --items &lt;3&gt;</text>"), "subtitle");

    let svg = report(&doc, &["-f", "flamegraph", "--by", "count"]);
    let titles = flame_titles(&svg);
    assert!(
        titles.contains(&"all (1,601 allocations, 100%)".to_owned()),
        "{titles:?}"
    );
    assert!(svg.contains(">memtrail: allocations</text>"), "title");

    let svg = report(&doc, &["-f", "flamegraph", "--by", "leaked"]);
    assert_eq!(
        flame_titles(&svg),
        [
            "all (600,000 bytes, 100%)",
            "libc.so.6+0x29d8f (600,000 bytes, 100.00%)",
            "load_config (600,000 bytes, 100.00%)",
            "main (600,000 bytes, 100.00%)",
            "parse:token (100,000 bytes, 16.67%)",
        ]
    );

    // The same profile, the same bytes.
    assert_eq!(report(&doc, &["-f", "flamegraph", "--by", "leaked"]), svg);
}

/// Check that a flame graph with nothing to draw is still a well-formed SVG
/// that says so.
#[test]
fn report_flamegraph_empty() {
    let mut doc = sites();
    for s in doc["stacks"].as_array_mut().expect("stacks") {
        s["live_bytes_at_exit"] = json!(0);
    }
    let svg = report(&doc, &["-f", "flamegraph", "--by", "leaked"]);
    let parsed = roxmltree::Document::parse(&svg).expect("well-formed");
    let texts: Vec<&str> = parsed
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter_map(|n| n.text())
        .collect();
    assert_eq!(
        texts,
        [
            "memtrail: bytes leaked",
            "no allocation site has bytes leaked"
        ]
    );
    assert_eq!(report(&doc, &["-f", "folded", "--by", "leaked"]), "");
}

/// The fixture with stack 10 (make_buffer's) ended early, in libc, whose
/// table the profile says was too big for the maps.
fn truncated_sites() -> serde_json::Value {
    let mut doc = sites();
    let stack = doc["stacks"]
        .as_array_mut()
        .expect("stacks")
        .iter_mut()
        .find(|s| s["id"] == "10")
        .expect("stack 10");
    stack["end"] = "no_table".into();
    doc["unwind"] = serde_json::json!({
        "mode": "auto",
        "images": [{
            "image": "/usr/lib/x86_64-linux-gnu/libc.so.6",
            "status": "too_big",
            "rows": 28274,
            "room": 0,
            "micros": 1,
        }],
        "ended_early": [],
        "stacks": 5,
        "bytes": 10500001,
    });
    doc
}

/// Check that a stack whose walk stopped early ends honestly (issue 23):
/// `[truncated: no unwind table for libc.so.6]` past its last frame in the
/// text report, whose header counts such stacks, and as its outermost frame
/// in folded stacks and the flame graph.
#[test]
fn report_truncated_stacks_say_why() {
    let doc = truncated_sites();
    let out = report(&doc, &["--top", "1"]);
    assert!(
        out.contains(
            "  1 of 6 stacks (5.7 MiB of 10.0 MiB allocated) truncated: their walk stopped \
             before the program's entry\n"
        ),
        "{out}"
    );
    assert!(
        out.contains("    libc.so.6+0x29d8f\n    [truncated: no unwind table for libc.so.6]\n"),
        "{out}"
    );
    let folded = report(&doc, &["--format", "folded"]);
    assert!(
        folded.contains(
            "[truncated: no unwind table for libc.so.6];libc.so.6+0x29d8f;main;make_buffer;\
             std::vector<int>::push_back 6000000\n"
        ),
        "{folded}"
    );
    // The other stacks are complete.
    assert_eq!(folded.matches("[truncated").count(), 1, "{folded}");
    let svg = report(&doc, &["--format", "flamegraph"]);
    assert!(
        flame_titles(&svg).contains(
            &"[truncated: no unwind table for libc.so.6] (6,000,000 bytes, 57.14%)".to_owned()
        ),
        "{svg}"
    );
}
