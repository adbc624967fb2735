//! Reports that aggregate (issue 24): sites grouped by the first caller
//! outside allocator wrappers (`--wrapper`, `--no-group`), the functions
//! and calls views (`--view`, `--focus`), `--hide`, C++ names shortened in
//! text, and blocks live at exit that are not leaks (runtime pools,
//! `--suppressions`). Captures of `wrapped.c` (an xmalloc called from two
//! callers with known sizes) and `cxx_baseline.cc` need root and a kernel
//! memtrail supports; the others read the hand-written profile of
//! `tests/fixtures/report/sites.json`.

use std::ffi::OsString;
use std::path::Path;

use serde_json::{Value, json};

use crate::support::report::{memtrail, sites, write_profile};
use crate::support::{Capture, capture, cmd, field, fixture_with_flags, num};

/// Runs `memtrail report PROFILE ARGS...`; returns (exit code, stdout,
/// stderr).
fn report_at(profile: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all: Vec<OsString> = vec!["report".into(), profile.into()];
    all.extend(args.iter().map(OsString::from));
    let run = memtrail(&all);
    (
        run.code.expect("memtrail exited"),
        run.stdout().to_owned(),
        run.stderr.clone(),
    )
}

/// `memtrail report` on `run`'s profile, expecting exit 0; stdout.
fn report(run: &Capture, args: &[&str]) -> String {
    let (code, out, err) = report_at(&run.dir.path().join("profile.json"), args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

/// The JSON groups: (function, bytes, allocations, stacks).
fn groups(doc: &Value) -> Vec<(String, u64, u64, usize)> {
    doc["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .map(|g| {
            (
                g["function"].as_str().unwrap_or("null").to_owned(),
                num(g, "bytes"),
                num(g, "allocations"),
                g["stacks"].as_array().map_or(0, Vec::len),
            )
        })
        .collect()
}

fn wrapped() -> Capture {
    let run = capture(&cmd("wrapped", &[]));
    run.expect_code(0);
    run
}

/// Check that the sites of `wrapped` are grouped by the caller of
/// `xmalloc`: build_table (8000 bytes, 2 allocations, 1 stack), then
/// parse_input (3000 bytes, 3 allocations, its 2 stacks), then
/// keep_forever's malloc (777 bytes); that the text's first site names
/// build_table right after the wrapper, the second its 2 stacks; that
/// `--no-group` gives whole stacks (parse_input's two apart, no `groups`
/// in JSON); and that `--wrapper build_table` groups by its caller, main.
#[test]
fn report_groups_wrapper_callers() {
    let run = wrapped();
    let doc: Value = serde_json::from_str(&report(&run, &["--format", "json"])).expect("JSON");
    assert_eq!(
        groups(&doc),
        [
            ("build_table".to_owned(), 8000, 2, 1),
            ("parse_input".to_owned(), 3000, 3, 2),
            ("keep_forever".to_owned(), 777, 1, 1),
        ]
    );
    let text = report(&run, &[]);
    let lines: Vec<&str> = text.lines().collect();
    let first = lines
        .iter()
        .position(|l| l.starts_with("#1  "))
        .expect("#1");
    assert_eq!(
        lines[first],
        "#1  7.8 KiB allocated (67.9%), 2 allocations, 7.8 KiB live at peak, 0 B leaked (0 blocks)"
    );
    assert!(lines[first + 1].starts_with("    xmalloc at "), "{text}");
    assert!(
        lines[first + 2].starts_with("    build_table at "),
        "{text}"
    );
    let second = lines
        .iter()
        .position(|l| l.starts_with("#2  "))
        .expect("#2");
    assert_eq!(
        lines[second],
        "#2  2.9 KiB allocated (25.5%), 3 allocations, 2.9 KiB live at peak, 0 B leaked (0 blocks); \
         2 stacks through parse_input (the largest shown)"
    );
    assert!(text.contains("(sites grouped by their first caller outside allocator wrappers"));

    let whole: Value =
        serde_json::from_str(&report(&run, &["--format", "json", "--no-group"])).expect("JSON");
    assert!(whole.get("groups").is_none(), "{whole}");
    let text = report(&run, &["--no-group"]);
    let heads: Vec<&str> = text.lines().filter(|l| l.starts_with('#')).collect();
    assert_eq!(heads.len(), 4, "{text}");
    assert!(
        heads[1].starts_with("#2  2.0 KiB allocated (17.0%), 2 allocations"),
        "{text}"
    );
    assert!(
        heads[2].starts_with("#3  1000 B allocated (8.5%), 1 allocation"),
        "{text}"
    );

    let doc: Value = serde_json::from_str(&report(
        &run,
        &["--format", "json", "--wrapper", "^build_table$"],
    ))
    .expect("JSON");
    let g = groups(&doc);
    assert_eq!(g[0], ("main".to_owned(), 8000, 2, 1), "{g:?}");
}

/// Check the functions view of `wrapped` (self: the sites a function
/// names; inclusive: the stacks it is in) and the calls view of xmalloc:
/// its callers build_table (8000) and parse_input (3000), its callee the
/// allocator (11000); and that `--focus` keeps only the stacks through a
/// matching function.
#[test]
fn report_groups_function_views() {
    let run = wrapped();
    let exe = crate::support::fixture("wrapped");
    let exe = exe.file_name().and_then(|n| n.to_str()).expect("name");
    let text = report(&run, &["--view", "functions", "-n", "3"]);
    let table: Vec<String> = text
        .lines()
        .skip_while(|l| !l.contains("  function"))
        .map(|l| l.replace(exe, "EXE"))
        .collect();
    assert_eq!(
        table,
        [
            "       self bytes   inclusive bytes self count incl count  function",
            "   7.8 KiB  67.9%    7.8 KiB  67.9%          2          2  build_table in EXE",
            "   2.9 KiB  25.5%    2.9 KiB  25.5%          3          3  parse_input in EXE",
            "     777 B   6.6%      777 B   6.6%          1          1  keep_forever in EXE",
        ],
        "{text}"
    );
    let text = report(&run, &["--view", "calls", "--focus", "^xmalloc$"]);
    let calls: Vec<String> = text
        .lines()
        .skip_while(|l| !l.starts_with("xmalloc"))
        .map(|l| l.replace(exe, "EXE"))
        .collect();
    assert_eq!(
        calls,
        [
            "xmalloc in EXE: 10.7 KiB inclusive (93.4%), 0 B self",
            "  callers:",
            "       7.8 KiB  72.7%  build_table in EXE",
            "       2.9 KiB  27.3%  parse_input in EXE",
            "  callees:",
            "      10.7 KiB 100.0%  [allocator]",
        ],
        "{text}"
    );
    let doc: Value = serde_json::from_str(&report(
        &run,
        &[
            "--format",
            "json",
            "--view",
            "calls",
            "--focus",
            "^xmalloc$",
        ],
    ))
    .expect("JSON");
    let f = &doc["functions"][0];
    assert_eq!(f["function"], "xmalloc");
    assert_eq!(num(&f["inclusive"], "bytes"), 11000);
    let callers: Vec<(&str, u64)> = f["callers"]
        .as_array()
        .expect("callers")
        .iter()
        .map(|c| (c["function"].as_str().unwrap_or(""), num(c, "bytes")))
        .collect();
    assert_eq!(callers, [("build_table", 8000), ("parse_input", 3000)]);

    let focused: Value = serde_json::from_str(&report(
        &run,
        &["--format", "json", "--focus", "^parse_input$"],
    ))
    .expect("JSON");
    assert_eq!(groups(&focused), [("parse_input".to_owned(), 3000, 3, 2)]);
}

/// Check that a suppression file moves keep_forever's leak (777 bytes, 1
/// block) from the leaks to the suppressed, shown apart in text and JSON;
/// that a line other than `leak:PATTERN` or an unreadable file is a usage
/// error (2) naming the file; and that `--view calls` without `--focus`
/// and `--view functions` in a format that shows sites are refused (2).
#[test]
fn report_groups_suppressions() {
    let run = wrapped();
    let dir = run.dir.path();
    let supp = dir.join("supp.txt");
    std::fs::write(&supp, "# ours\n\n  leak:keep_*  \nleak:^nothing_matches$\n").expect("write");
    let supp = supp.to_str().expect("UTF-8");
    let text = report(&run, &["--suppressions", supp, "--by", "leaked"]);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[1],
        "  6 allocations (11.5 KiB), peak live 11.5 KiB, leaked 0 blocks (0 B)"
    );
    assert_eq!(
        lines[2],
        "  suppressed leaks 1 block (777 B): leak:keep_* 777 B"
    );
    assert!(!text.contains("#1"), "{text}");
    let doc: Value = serde_json::from_str(&report(
        &run,
        &["--suppressions", supp, "--by", "leaked", "--format", "json"],
    ))
    .expect("JSON");
    assert_eq!(doc["total"], 0);
    assert_eq!(doc["stacks"], json!([]));
    let s = &doc["still_reachable"]["suppressed"];
    assert_eq!(s[0]["name"], "leak:keep_*", "{doc}");
    assert_eq!((num(&s[0], "bytes"), num(&s[0], "blocks")), (777, 1));
    assert_eq!(s.as_array().map(Vec::len), Some(1), "{doc}");
    // Without it, the leak is one.
    let text = report(&run, &["--by", "leaked"]);
    assert!(text.contains("leaked 1 block (777 B)"), "{text}");

    let profile = dir.join("profile.json");
    let bad = dir.join("bad.txt");
    std::fs::write(&bad, "# ok\nrace:foo\n").expect("write");
    let (code, _, err) = report_at(&profile, &["--suppressions", bad.to_str().expect("UTF-8")]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("bad.txt:2: expected `leak:PATTERN`"), "{err}");
    let missing = dir.join("missing.txt");
    let (code, _, err) = report_at(
        &profile,
        &["--suppressions", missing.to_str().expect("UTF-8")],
    );
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("cannot read the suppression file"), "{err}");
    for args in [
        &["--view", "calls"][..],
        &["--view", "functions", "--format", "pprof"],
        &["--wrapper", "("],
    ] {
        let (code, out, err) = report_at(&profile, args);
        assert_eq!((code, out.as_str()), (2, ""), "{args:?}: {err}");
    }
}

/// Check that a C++ program that throws nothing leaks nothing: libstdc++'s
/// emergency exception pool (its one block live at exit) is shown as
/// "still reachable at exit: runtime", in text and JSON, not as a leak,
/// and the run's summary counts it apart from its leaks, 0.
#[test]
fn report_groups_runtime_pool_is_no_leak() {
    let run = capture(&cmd("cxx_baseline", &[]));
    run.expect_code(0);
    let totals = field(run.profile(), "totals");
    let (pool, blocks) = (
        num(totals, "live_bytes_at_exit"),
        num(totals, "live_allocations_at_exit"),
    );
    assert_eq!(blocks, 1, "{totals}");
    let text = report(&run, &["--by", "leaked"]);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[1].ends_with(", leaked 0 blocks (0 B)"), "{text}");
    let kib = format!("{:.1} KiB", pool as f64 / 1024.0);
    assert_eq!(
        lines[2],
        format!(
            "  still reachable at exit: runtime 1 block ({kib}): libstdc++ emergency exception pool {kib}"
        ),
        "{text}"
    );
    assert!(!text.contains("#1"), "{text}");
    // The summary counts leaks the same way (issue 41), and the pool on a
    // line of its own.
    let summary = format!(
        "\n  leaked      {:>10}  {:>12}   (live at exit, not still reachable)\n  reachable   \
         {:>10}  {kib:>12}   (still reachable at exit: runtime pools, not leaks; memtrail \
         report names them)\n",
        0, "0 B", 1
    );
    assert!(run.stderr.contains(&summary), "{}", run.stderr);
    let doc: Value =
        serde_json::from_str(&report(&run, &["--by", "leaked", "--format", "json"])).expect("JSON");
    let r = &doc["still_reachable"]["runtime"];
    assert_eq!(r[0]["name"], "libstdc++ emergency exception pool");
    assert_eq!((num(&r[0], "bytes"), num(&r[0], "blocks")), (pool, 1));
    assert_eq!(doc["total"], 0);
}

/// Check that `g++ -c` of a small file leaks no emergency pool (issue
/// 41): the gcc driver and cc1plus link libstdc++ statically and are
/// stripped, so the pool's constructor is named by its code, matched
/// against the system's libstdc++.a; each process's 72,704-byte pool
/// (GCC 12: 64 objects of 1 KiB and 64 dependent exceptions) is "still
/// reachable at exit: runtime", and no leaked site is one of them.
#[test]
fn report_groups_static_libstdcxx_pool_is_no_leak() {
    const POOL: u64 = 72_704;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("small.cc");
    std::fs::write(
        &src,
        "#include <vector>\nint f() { return std::vector<int>(3).size(); }\n",
    )
    .unwrap();
    let obj = dir.path().join("small.o");
    let run = capture(&[
        OsString::from("/usr/bin/g++"),
        "-c".into(),
        src.into(),
        "-o".into(),
        obj.into(),
    ]);
    run.expect_code(0);
    let doc: Value = serde_json::from_str(&report(
        &run,
        &["--by", "leaked", "--format", "json", "-n", "0"],
    ))
    .expect("JSON");
    let r = &doc["still_reachable"]["runtime"];
    let pool = r
        .as_array()
        .expect("runtime pools")
        .iter()
        .find(|p| p["name"] == "libstdc++ emergency exception pool")
        .unwrap_or_else(|| panic!("no emergency pool: {r}"));
    assert_eq!(
        (num(pool, "bytes"), num(pool, "blocks")),
        (2 * POOL, 2),
        "{r}"
    );
    let folded = report(&run, &["--by", "leaked", "--format", "folded"]);
    assert!(
        !folded.lines().any(|l| l.ends_with(&format!(" {POOL}"))),
        "{folded}"
    );
    let text = report(&run, &["--format", "folded"]);
    let named = text
        .lines()
        .filter(|l| l.ends_with(&format!(";call_init;_GLOBAL__sub_I_eh_alloc.cc {POOL}")))
        .count();
    assert_eq!(named, 2, "{text}");
}

/// Runs `memtrail report` on `doc` written to a temporary file, expecting
/// exit 0; stdout.
fn report_doc(doc: &Value, args: &[&str]) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = write_profile(dir.path(), doc);
    let (code, out, err) = report_at(&path, args);
    assert_eq!(code, 0, "{args:?}: {err}");
    out
}

/// Check that text shortens a C++ name (template arguments and parameters
/// elided) and JSON keeps it whole; and that `--hide` drops matching frames
/// (make_buffer's site then reads `main` after push_back).
#[test]
fn report_groups_cxx_names_and_hide() {
    let mut doc = sites();
    let long = "std::vector<int, std::allocator<int> >::_M_realloc_insert<int const&>(__gnu_cxx::__normal_iterator<int*, std::vector<int, std::allocator<int> > >, int const&)";
    doc["stacks"][0]["frames"][0]["function"] = json!(long);
    let text = report_doc(&doc, &["-n", "1"]);
    assert!(
        text.contains(
            "\n    std::vector<…>::_M_realloc_insert<…> (inlined) at /usr/include/c++/12/bits/stl_vector.h:1281 in shop\n"
        ),
        "{text}"
    );
    let json: Value =
        serde_json::from_str(&report_doc(&doc, &["--format", "json", "-n", "1"])).expect("JSON");
    assert_eq!(json["stacks"][0]["frames"][0]["function"], long);
    assert_eq!(json["groups"][0]["function"], long);

    let text = report_doc(&sites(), &["-n", "1", "--hide", "^make_buffer$"]);
    let frames: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("#1"))
        .skip(1)
        .collect();
    assert_eq!(
        frames,
        [
            "    std::vector<…>::push_back (inlined) at /usr/include/c++/12/bits/stl_vector.h:1281 in shop",
            "    main at src/main.cc:12 in shop",
            "    libc.so.6+0x29d8f",
        ],
        "{text}"
    );
}

/// Check that the timeline puts the heap and the mappings on their own
/// axes (a 765 MiB reservation beside a 12 MiB heap: heap ticks to 12 MiB,
/// mapping ticks to 768 MiB, the heap's area reaching the plot's top) and
/// cuts a long title to fit.
#[test]
fn report_groups_timeline_axes() {
    let mut doc = sites();
    let mib = 1024 * 1024u64;
    doc["command"] = json!(["x".repeat(300)]);
    doc["timeline"] = json!({
        "start_ns": 0,
        "interval_ns": 1_000_000,
        "tree": {"first": 0, "points": [
            {"live_bytes": 4 * mib, "live_blocks": 1, "mapped_bytes": 765 * mib},
            {"live_bytes": 12 * mib, "live_blocks": 2, "mapped_bytes": 765 * mib},
        ]},
        "processes": [],
        "peak_live_bytes": 12 * mib,
        "peak_live_at_ns": 1_500_000,
        "sites": [],
        "other_bytes": [],
    });
    let svg = report_doc(&doc, &["--format", "timeline"]);
    let parsed = roxmltree::Document::parse(&svg).unwrap_or_else(|e| panic!("{e}: {svg}"));
    let texts = |class: &str| -> Vec<String> {
        parsed
            .descendants()
            .filter(|n| n.attribute("class") == Some(class))
            .filter_map(|n| n.text().map(str::to_owned))
            .collect()
    };
    assert_eq!(
        texts("tick-heap"),
        ["0 B", "4.0 MiB", "8.0 MiB", "12.0 MiB"]
    );
    assert_eq!(
        texts("tick-mapped"),
        ["0 B", "256.0 MiB", "512.0 MiB", "768.0 MiB"]
    );
    assert_eq!(texts("tick-time").len(), 6);
    let title = parsed
        .descendants()
        .find(|n| n.has_tag_name("text"))
        .and_then(|n| n.text())
        .expect("title");
    assert_eq!(title.chars().count(), 86, "{title}");
    assert!(title.ends_with("x…"), "{title}");
    // The heap's area reaches the plot's top (y 60) at its 12 MiB.
    assert!(svg.contains(",60.0 "), "{svg}");
}

/// Check that functions g++ -O2 compiles as clones keep their names with
/// the clone suffixes in every view (issue 41: they showed as `.isra.0] in
/// node`): the sites, functions and calls views shorten them to `fill
/// [clone .constprop.0] [clone .isra.0]`, `make [clone .constprop.0]`,
/// `grow [clone .part.0]` and `spill [clone .cold]` with their bytes, JSON
/// and folded stacks keep them whole. `clones.cc` is built without debug
/// information, so the names are the symbol table's, as in node.
#[test]
fn report_groups_gcc_clone_names() {
    let exe = fixture_with_flags(
        "clones",
        &[
            "-O2",
            "-fno-omit-frame-pointer",
            "-Wall",
            "-Wextra",
            "-Werror",
        ],
    );
    let base = exe.file_name().and_then(|n| n.to_str()).expect("name");
    let run = capture(&[exe.clone().into_os_string()]);
    run.expect_code(0);
    let shown = [
        (
            "spill(unsigned long) [clone .cold]",
            "spill [clone .cold]",
            200_000u64,
            1u64,
        ),
        (
            "make(unsigned long, int) [clone .constprop.0]",
            "make [clone .constprop.0]",
            6000,
            2,
        ),
        (
            "grow(unsigned long) [clone .part.0]",
            "grow [clone .part.0]",
            5000,
            1,
        ),
        (
            "fill(Big) [clone .constprop.0] [clone .isra.0]",
            "fill [clone .constprop.0] [clone .isra.0]",
            2000,
            1,
        ),
    ];
    let doc: Value = serde_json::from_str(&report(&run, &["--format", "json"])).expect("JSON");
    let want: Vec<(String, u64, u64, usize)> = shown
        .iter()
        .map(|&(whole, _, bytes, n)| (whole.to_owned(), bytes, n, n as usize))
        .collect();
    assert_eq!(groups(&doc), want);
    let text = report(&run, &[]);
    let firsts: Vec<&str> = text
        .split("\n\n")
        .skip(1)
        .filter_map(|site| site.lines().nth(1))
        .collect();
    let want: Vec<String> = shown
        .iter()
        .map(|(_, short, ..)| format!("    {short} in {base}"))
        .collect();
    assert_eq!(firsts, want, "{text}");
    let functions = report(&run, &["--view", "functions"]);
    for (_, short, bytes, n) in shown {
        let row = format!("  {short} in {base}");
        let line = functions
            .lines()
            .find(|l| l.ends_with(&row))
            .unwrap_or_else(|| panic!("{row}: {functions}"));
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells[6..8], [n.to_string(), n.to_string()], "{line}");
        let kib = format!("{:.1}", bytes as f64 / 1024.0);
        assert_eq!(cells[0], kib, "{line}");
    }
    assert!(!functions.contains("  .isra.0]"), "{functions}");
    let calls = report(&run, &["--view", "calls", "--focus", "fill"]);
    let head = format!("fill [clone .constprop.0] [clone .isra.0] in {base}: 2.0 KiB inclusive");
    assert!(calls.lines().any(|l| l.starts_with(&head)), "{calls}");
    assert!(
        calls.contains(&format!("100.0%  main in {base}\n")),
        "{calls}"
    );
    let folded = report(&run, &["--format", "folded"]);
    for (whole, _, bytes, _) in shown {
        let tail = format!(";main;{whole} {bytes}");
        assert!(
            folded.lines().any(|l| l.ends_with(&tail)),
            "{tail}: {folded}"
        );
    }
}
