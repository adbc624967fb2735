//! `memtrail report --format pprof` on the hand-written profile of
//! `tests/fixtures/report/sites.json` (stacks listed in `support::report`):
//! decoded back with memtrail's own prost types, and read by
//! `go tool pprof` when Go is installed. No kernel needed.

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

use flate2::read::GzDecoder;
use memtrail::internals::report::pprof::proto;
use prost::Message;

use crate::support::report::{memtrail, sites, write_profile};

/// Writes the fixture's pprof report with `args` into `dir/heap.pb.gz`.
fn write_pprof(dir: &Path, args: &[&str]) -> std::path::PathBuf {
    let profile = write_profile(dir, &sites());
    let out = dir.join("heap.pb.gz");
    let mut all = vec![
        "report".to_owned(),
        profile.display().to_string(),
        "--format".to_owned(),
        "pprof".to_owned(),
        "--output".to_owned(),
        out.display().to_string(),
        // A test writes several reports there.
        "--force".to_owned(),
    ];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let run = memtrail(&all);
    run.expect_code(0);
    assert!(run.stdout.is_empty() && run.stderr.is_empty(), "{run:?}");
    out
}

/// Gunzips and decodes a pprof file.
fn decode(path: &Path) -> proto::Profile {
    let gz = std::fs::read(path).expect("read pprof");
    assert_eq!(&gz[..2], [0x1f, 0x8b], "gzip magic");
    let mut raw = Vec::new();
    GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .expect("gunzip");
    proto::Profile::decode(&raw[..]).expect("decode profile.proto")
}

/// A sample's stack as text, leaf first: each location as
/// `ADDR MAPPING: FUNC FILE:LINE | FUNC FILE:LINE` (inlined lines first).
fn stack(p: &proto::Profile, sample: &proto::Sample) -> Vec<String> {
    let s = |i: i64| p.string_table[usize::try_from(i).expect("index")].as_str();
    sample
        .location_id
        .iter()
        .map(|&id| {
            let loc = p.location.iter().find(|l| l.id == id).expect("location id");
            let mapping = match loc.mapping_id {
                0 => "-",
                m => s(p
                    .mapping
                    .iter()
                    .find(|x| x.id == m)
                    .expect("mapping")
                    .filename),
            };
            let lines: Vec<String> = loc
                .line
                .iter()
                .map(|line| {
                    let f = p
                        .function
                        .iter()
                        .find(|f| f.id == line.function_id)
                        .expect("function id");
                    assert_eq!(f.system_name, f.name);
                    format!("{} {}:{}", s(f.name), s(f.filename), line.line)
                })
                .collect();
            format!("{:#x} {mapping}: {}", loc.address, lines.join(" | "))
        })
        .collect()
}

const SHOP: &str = "/opt/shop/bin/shop";
const LIBC: &str = "/usr/lib/x86_64-linux-gnu/libc.so.6";

/// Check that the pprof report decodes with the documented sample types,
/// the `--by` metric as default sample type, one sample per site ranked by
/// it with every metric's value, leaf-first locations (inlined frames as
/// several lines of one location, an unknown frame as a location without
/// lines), locations, functions and mappings each once, and string 0 "".
#[test]
fn report_pprof_decodes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = decode(&write_pprof(dir.path(), &[]));
    let s = |i: i64| p.string_table[usize::try_from(i).expect("index")].as_str();

    assert_eq!(p.string_table[0], "");
    let types: Vec<(&str, &str)> = p
        .sample_type
        .iter()
        .map(|t| (s(t.r#type), s(t.unit)))
        .collect();
    assert_eq!(
        types,
        [
            ("alloc_objects", "count"),
            ("alloc_space", "bytes"),
            ("inuse_objects", "count"),
            ("inuse_space", "bytes"),
            ("leaked_objects", "count"),
            ("leaked_space", "bytes"),
            ("temporary_objects", "count"),
            ("mapped_objects", "count"),
            ("mapped_space", "bytes"),
            ("mapped_inuse_space", "bytes"),
            ("mapped_leaked_space", "bytes"),
            ("brk_space", "bytes"),
        ]
    );
    assert_eq!(s(p.default_sample_type), "alloc_space");
    assert_eq!(p.duration_nanos, 250_000_000);
    let comments: Vec<&str> = p.comment.iter().map(|&c| s(c)).collect();
    assert_eq!(comments, ["memtrail run -- ./shop --items <3>"]);

    let values: Vec<&[i64]> = p.sample.iter().map(|x| &x.value[..]).collect();
    assert_eq!(
        values,
        [
            &[1000, 6_000_000, 300, 3_000_000, 0, 0, 0, 0, 0, 0, 0, 0][..],
            &[200, 2_500_000, 50, 500_000, 5, 500_000, 0, 0, 0, 0, 0, 0],
            &[299, 1_499_999, 100, 500_000, 2, 100_000, 0, 0, 0, 0, 0, 0],
            &[100, 500_000, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            &[1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
        ]
    );
    let period_type = p.period_type.as_ref().expect("period_type");
    assert_eq!(
        (s(period_type.r#type), s(period_type.unit), p.period),
        ("space", "bytes", 1)
    );
    // Each sample names its process: pid as a number, exe as a string.
    let labels: Vec<Vec<(&str, &str, i64)>> = p
        .sample
        .iter()
        .map(|x| {
            x.label
                .iter()
                .map(|l| (s(l.key), s(l.str), l.num))
                .collect()
        })
        .collect();
    let shop = vec![("pid", "", 100), ("exe", SHOP, 0)];
    assert_eq!(
        labels,
        [
            shop.clone(),
            shop.clone(),
            shop.clone(),
            shop.clone(),
            shop,
            vec![("pid", "", 101), ("exe", "/usr/bin/helper", 0)],
        ]
    );
    let stacks: Vec<Vec<String>> = p.sample.iter().map(|x| stack(&p, x)).collect();
    let libc_start = format!("0x7f0000029d90 {LIBC}: ");
    assert_eq!(
        stacks,
        [
            vec![
                format!(
                    "0x401a10 {SHOP}: std::vector<int>::push_back \
                     /usr/include/c++/12/bits/stl_vector.h:1281 | make_buffer src/buffer.cc:42"
                ),
                format!("0x401234 {SHOP}: main src/main.cc:12"),
                libc_start.clone(),
            ],
            vec![
                format!("0x402000 {SHOP}: load_config src/config.cc:88"),
                format!("0x401240 {SHOP}: main src/main.cc:13"),
                libc_start.clone(),
            ],
            vec![
                format!("0x402100 {SHOP}: parse;token src/config.cc:120"),
                format!("0x402010 {SHOP}: load_config src/config.cc:90"),
                format!("0x401240 {SHOP}: main src/main.cc:13"),
                libc_start.clone(),
            ],
            vec![
                format!("0x402000 {SHOP}: load_config src/config.cc:88"),
                format!("0x401250 {SHOP}: main src/main.cc:13"),
                libc_start.clone(),
            ],
            vec![
                "0xdead0 -: ".to_owned(),
                format!("0x401260 {SHOP}: main src/main.cc:14"),
            ],
            vec![format!("0x403000 {SHOP}: free_list_grow :0")],
        ]
    );

    // Each distinct address once, each (function, file) once.
    assert_eq!(p.location.len(), 11);
    let mut functions: Vec<(&str, &str)> = p
        .function
        .iter()
        .map(|f| (s(f.name), s(f.filename)))
        .collect();
    functions.sort();
    assert_eq!(
        functions,
        [
            ("free_list_grow", ""),
            ("load_config", "src/config.cc"),
            ("main", "src/main.cc"),
            ("make_buffer", "src/buffer.cc"),
            ("parse;token", "src/config.cc"),
            (
                "std::vector<int>::push_back",
                "/usr/include/c++/12/bits/stl_vector.h"
            ),
        ]
    );
    let ids: Vec<u64> = p.location.iter().map(|l| l.id).collect();
    assert_eq!(ids, (1..=11).collect::<Vec<u64>>(), "ids are nonzero");

    type MappingRow<'a> = (u64, &'a str, &'a str, [u64; 3], [bool; 4]);
    let mappings: Vec<MappingRow<'_>> = p
        .mapping
        .iter()
        .map(|m| {
            (
                m.id,
                s(m.filename),
                s(m.build_id),
                [m.memory_start, m.memory_limit, m.file_offset],
                [
                    m.has_functions,
                    m.has_filenames,
                    m.has_line_numbers,
                    m.has_inline_frames,
                ],
            )
        })
        .collect();
    // Each image from the page of its lowest frame to past its highest, so
    // an address minus `memory_start` plus `file_offset` is the frame's
    // offset plus one.
    assert_eq!(
        mappings,
        [
            (
                1,
                SHOP,
                "5d2c9e0f6a1b3c4d5e6f708192a3b4c5d6e7f801",
                [0x40_1000, 0x40_3001, 0x1000],
                [true; 4]
            ),
            (
                2,
                LIBC,
                "c047672cae7964324658491e7dee26748ae5d2f8",
                [0x7f00_0002_9000, 0x7f00_0002_9d91, 0x2_9000],
                [false; 4]
            )
        ]
    );
}

/// Check that `--by` picks the default sample type and the sample order,
/// and `--top` the number of samples.
#[test]
fn report_pprof_by_and_top() {
    let dir = tempfile::tempdir().expect("tempdir");
    for (by, default, first_values) in [
        ("count", "alloc_objects", [1000, 299, 200]),
        ("peak", "inuse_space", [1000, 200, 299]),
        ("leaked", "leaked_space", [200, 299, 1000]),
    ] {
        let p = decode(&write_pprof(dir.path(), &["--by", by]));
        let default_type = &p.string_table[usize::try_from(p.default_sample_type).expect("index")];
        assert_eq!(default_type, default, "{by}");
        // Every site, zero values included.
        assert_eq!(p.sample.len(), 6, "{by}");
        let allocations: Vec<i64> = p.sample.iter().take(3).map(|x| x.value[0]).collect();
        assert_eq!(allocations, first_values, "{by}");
    }
    let p = decode(&write_pprof(dir.path(), &["--top", "2"]));
    let bytes: Vec<i64> = p.sample.iter().map(|x| x.value[1]).collect();
    assert_eq!(bytes, [6_000_000, 2_500_000]);
}

/// `go tool pprof ARGS FILE`, or `None` when Go is not installed.
fn go_pprof(args: &[&str], file: &Path) -> Option<String> {
    if Command::new("go").arg("version").output().is_err() {
        return None;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .env("PPROF_TMPDIR", tmp.path())
        .output()
        .expect("run go tool pprof");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "go tool pprof failed: {stderr}");
    assert!(stderr.trim().is_empty(), "go tool pprof warned: {stderr}");
    Some(String::from_utf8(out.stdout).expect("UTF-8"))
}

/// The `flat cum name` rows of `go tool pprof -top`, sorted.
fn top_rows(out: &str) -> Vec<(String, String, String)> {
    let mut rows: Vec<(String, String, String)> = out
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("flat"))
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_owned(), f[3].to_owned(), f[5..].join(" "))
        })
        .collect();
    rows.sort();
    rows
}

/// Check that `go tool pprof -top` reads the report without a warning and
/// finds every function with its exact flat and cumulative values, for the
/// default sample type and another one (skipped when Go is not installed).
#[test]
fn report_pprof_go_tool_top() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_pprof(dir.path(), &[]);
    let Some(out) = go_pprof(&["-top", "-unit=B", "-nodefraction=0"], &file) else {
        let _ = writeln!(
            std::io::stderr(),
            "report_pprof_go_tool_top: `go` not found, go tool pprof not checked"
        );
        return;
    };
    assert!(out.contains("Type: alloc_space\n"), "{out}");
    let row =
        |flat: &str, cum: &str, name: &str| (flat.to_owned(), cum.to_owned(), name.to_owned());
    let mut expected = vec![
        row("0", "10499999B", "[libc.so.6]"),
        row("0", "10500000B", "main"),
        row("0", "6000000B", "make_buffer"),
        row("1499999B", "1499999B", "parse;token"),
        row("1B", "1B", "<unknown>"),
        row("1B", "1B", "free_list_grow"),
        row("3000000B", "4499999B", "load_config"),
        row("6000000B", "6000000B", "std::vector::push_back (inline)"),
    ];
    expected.sort();
    assert_eq!(top_rows(&out), expected, "{out}");

    let out = go_pprof(
        &[
            "-top",
            "-sample_index=leaked_space",
            "-unit=B",
            "-nodefraction=0",
        ],
        &file,
    )
    .expect("go is there");
    assert!(out.contains("Type: leaked_space\n"), "{out}");
    let mut expected = vec![
        row("0", "600000B", "[libc.so.6]"),
        row("0", "600000B", "main"),
        row("100000B", "100000B", "parse;token"),
        row("500000B", "600000B", "load_config"),
    ];
    expected.sort();
    assert_eq!(top_rows(&out), expected, "{out}");
}

/// Check that `go tool pprof` takes `-sample_index=inuse_objects` (blocks
/// live at the peak; issue 16: it refused it), shows each sample's process
/// with `-tags`, and lists the mappings with their build ids and ranges
/// (skipped when Go is not installed).
#[test]
fn report_pprof_go_tool_inuse_objects_tags_mappings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write_pprof(dir.path(), &[]);
    let Some(out) = go_pprof(
        &["-top", "-sample_index=inuse_objects", "-nodefraction=0"],
        &file,
    ) else {
        let _ = writeln!(
            std::io::stderr(),
            "report_pprof_go_tool_inuse_objects_tags_mappings: `go` not found, not checked"
        );
        return;
    };
    assert!(out.contains("Type: inuse_objects\n"), "{out}");
    let row =
        |flat: &str, cum: &str, name: &str| (flat.to_owned(), cum.to_owned(), name.to_owned());
    let mut expected = vec![
        row("0", "450", "[libc.so.6]"),
        row("0", "450", "main"),
        row("0", "300", "make_buffer"),
        row("100", "100", "parse;token"),
        row("300", "300", "std::vector::push_back (inline)"),
        row("50", "150", "load_config"),
    ];
    expected.sort();
    assert_eq!(top_rows(&out), expected, "{out}");

    let out = go_pprof(&["-tags", "-sample_index=alloc_objects"], &file).expect("go is there");
    let tags: Vec<&str> = out.lines().map(str::trim).collect();
    for line in [
        "exe: Total 1601.0",
        "1600.0 (99.94%): /opt/shop/bin/shop",
        "1.0 (0.062%): /usr/bin/helper",
        "pid: Total 1601.0",
        "1600.0 (99.94%): 100",
        "1.0 (0.062%): 101",
    ] {
        assert!(tags.contains(&line), "no {line:?} in:\n{out}");
    }

    let out = go_pprof(&["-raw"], &file).expect("go is there");
    let mappings: Vec<&str> = out
        .lines()
        .skip_while(|l| *l != "Mappings")
        .skip(1)
        .map(str::trim_end)
        .collect();
    assert_eq!(
        mappings,
        [
            "1: 0x401000/0x403001/0x1000 /opt/shop/bin/shop \
             5d2c9e0f6a1b3c4d5e6f708192a3b4c5d6e7f801 [FN][FL][LN][IN]",
            "2: 0x7f0000029000/0x7f0000029d91/0x29000 /usr/lib/x86_64-linux-gnu/libc.so.6 \
             c047672cae7964324658491e7dee26748ae5d2f8",
        ],
        "{out}"
    );
}

/// Check that a stack whose walk stopped early (issue 23) ends, outermost,
/// with a location of no address and no mapping whose function says why:
/// `[truncated: no unwind table for libc.so.6]`; complete stacks do not.
#[test]
fn report_pprof_truncated_stack_says_why() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut doc = sites();
    for stack in doc["stacks"].as_array_mut().expect("stacks") {
        if stack["id"] == "10" {
            stack["end"] = "no_table".into();
        }
    }
    let profile = write_profile(dir.path(), &doc);
    let out = dir.path().join("heap.pb.gz");
    let run = memtrail(&[
        "report".to_owned(),
        profile.display().to_string(),
        "--format".to_owned(),
        "pprof".to_owned(),
        "--output".to_owned(),
        out.display().to_string(),
    ]);
    run.expect_code(0);
    let p = decode(&out);
    let stacks: Vec<Vec<String>> = p.sample.iter().map(|x| stack(&p, x)).collect();
    // The first sample is stack 10's (the most bytes).
    assert_eq!(
        stacks[0].last().map(String::as_str),
        Some("0x0 -: [truncated: no unwind table for libc.so.6] :0"),
        "{stacks:#?}"
    );
    let truncated = stacks
        .iter()
        .filter(|s| s.iter().any(|l| l.contains("[truncated")))
        .count();
    assert_eq!(truncated, 1, "{stacks:#?}");
}
