//! `memtrail report --format pprof` on the hand-written profile of
//! `tests/fixtures/report/sites.json` (stacks listed in `report_support`):
//! decoded back with memtrail's own prost types, and read by
//! `go tool pprof` when Go is installed. No kernel needed.

mod report_support;

use std::io::{Read, Write};
use std::path::Path;
use std::process::Command;

use flate2::read::GzDecoder;
use memtrail::render::pprof::proto;
use prost::Message;

use report_support::{memtrail, sites, write_profile};

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
            ("inuse_space", "bytes"),
            ("leaked_objects", "count"),
            ("leaked_space", "bytes"),
            ("temporary_objects", "count"),
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
            &[1000, 6_000_000, 3_000_000, 0, 0, 0][..],
            &[200, 2_500_000, 500_000, 5, 500_000, 0],
            &[299, 1_499_999, 500_000, 2, 100_000, 0],
            &[100, 500_000, 0, 0, 0, 0],
            &[1, 1, 0, 0, 0, 0],
            &[1, 1, 0, 0, 0, 0],
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

    let mappings: Vec<(u64, &str, [bool; 4])> = p
        .mapping
        .iter()
        .map(|m| {
            (
                m.id,
                s(m.filename),
                [
                    m.has_functions,
                    m.has_filenames,
                    m.has_line_numbers,
                    m.has_inline_frames,
                ],
            )
        })
        .collect();
    assert_eq!(
        mappings,
        [
            (1, SHOP, [true; 4]),
            (2, LIBC, [false, false, false, false])
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
