//! Profiles of version 3 (issue 24, "Profiles that scale"): compact stacks
//! (string, module, function and frame tables, stacks as frame ids), zstd
//! to a `.zst` name, and version 2 files (the fixture,
//! `tests/fixtures/report/sites.json`) still read the same.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::support::report::{memtrail, sites, write_profile};
use crate::support::{dir_entries, expand_stacks, fixture};

/// zstd's frame magic.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// `memtrail report PROFILE ARGS...`: its stdout, exit 0 asserted.
fn report_of(profile: &Path, args: &[&str]) -> Vec<u8> {
    let mut all = vec!["report".to_owned(), profile.display().to_string()];
    all.extend(args.iter().map(|a| (*a).to_owned()));
    let run = memtrail(&all);
    run.expect_code(0);
    run.stdout
}

/// Converts `profile` with `report --format profile` into `dir/name`.
fn convert(profile: &Path, dir: &Path, name: &str) -> PathBuf {
    let out = dir.join(name);
    let run = memtrail(&[
        "report".as_ref(),
        profile.as_os_str(),
        "--format".as_ref(),
        "profile".as_ref(),
        "--output".as_ref(),
        out.as_os_str(),
    ]);
    run.expect_code(0);
    assert!(run.stdout.is_empty() && run.stderr.is_empty(), "{run:?}");
    out
}

/// Check that `report --format profile` writes the version 2 fixture as
/// version 3: its 6 stacks' 19 frames as 12 distinct frames naming 6
/// functions in 2 modules, 15 strings in all; every stack a list of frame
/// ids, its `exe` a string id, only its metrics that are not 0; and that
/// these tables written out again are the fixture's stacks exactly.
#[test]
fn report_compact_tables_hold_the_same_stacks() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v2 = write_profile(dir.path(), &sites());
    let v3 = convert(&v2, dir.path(), "v3.json");
    let doc: Value = serde_json::from_slice(&fs::read(&v3).expect("read")).expect("JSON");
    assert_eq!(doc["version"], 3);
    let tables = &doc["stacks"];
    let len = |t: &str| tables[t].as_array().expect(t).len();
    assert_eq!(
        [
            len("strings"),
            len("modules"),
            len("functions"),
            len("frames"),
            len("entries")
        ],
        [15, 2, 6, 12, 6]
    );
    assert_eq!(
        tables["modules"][0],
        json!({"path": 0, "build_id": 1}),
        "{tables:#}"
    );
    assert_eq!(tables["strings"][0], "/opt/shop/bin/shop");
    assert_eq!(
        tables["frames"][8],
        json!({"addr": 912080, "module": null, "function": null, "line": null,
               "inlined": false, "offset": null})
    );
    assert_eq!(
        tables["entries"][3],
        json!({"id": "40", "pid": 100, "exe": 0, "frames": [8, 9],
               "allocations": 1, "bytes": 1})
    );
    // Stacks 20 and 60 share their first and last frames, 20 and 30 main.
    assert_eq!(tables["entries"][1]["frames"], json!([4, 5, 3]));
    assert_eq!(tables["entries"][2]["frames"], json!([6, 7, 5, 3]));
    assert_eq!(tables["entries"][5]["frames"], json!([4, 11, 3]));
    let mut expanded = doc.clone();
    expand_stacks(&mut expanded);
    assert_eq!(expanded["stacks"], sites()["stacks"]);
    // Every other section as it was (with the fields the fixture predates
    // at their defaults).
    for (key, value) in sites().as_object().expect("object") {
        if key != "stacks" && key != "version" {
            assert!(holds(&doc[key], value), "{key}: {} lacks {value}", doc[key]);
        }
    }
}

/// Whether `a` has every field of `b` (at any depth), with its value.
fn holds(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Object(a), Value::Object(b)) => b
            .iter()
            .all(|(k, v)| a.get(k).is_some_and(|mine| holds(mine, v))),
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(x, y)| holds(x, y))
        }
        _ => a == b,
    }
}

/// Check that every report format, by every metric it takes, makes the
/// same bytes of the version 3 profile, plain and zstd, as of the version
/// 2 fixture it came from; that the `.zst` one is zstd; and that converting
/// either again gives the plain version 3 file byte for byte.
#[test]
fn report_compact_reports_match_version_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v2 = write_profile(dir.path(), &sites());
    let v3 = convert(&v2, dir.path(), "v3.json");
    let zst = convert(&v2, dir.path(), "v3.json.zst");
    let compressed = fs::read(&zst).expect("read");
    assert_eq!(compressed[..4], ZSTD_MAGIC);
    assert!(compressed.len() < fs::read(&v3).expect("read").len());
    for format in ["text", "json", "folded", "flamegraph", "pprof", "timeline"] {
        for by in ["bytes", "count", "peak", "leaked"] {
            let args = ["--format", format, "--by", by, "--top", "0"];
            let old = report_of(&v2, &args);
            assert!(!old.is_empty(), "{format} --by {by}");
            assert_eq!(report_of(&v3, &args), old, "{format} --by {by}: plain");
            assert_eq!(report_of(&zst, &args), old, "{format} --by {by}: zstd");
        }
    }
    let plain = fs::read(&v3).expect("read");
    for again in [&v3, &zst] {
        assert_eq!(report_of(again, &["--format", "profile"]), plain);
    }
    assert_eq!(
        dir_entries(dir.path()),
        ["profile.json", "v3.json", "v3.json.zst"]
    );
}

/// Check that a version 3 profile cut short or with a bad frame id, and a
/// zstd one cut short or corrupt, make `memtrail report` exit 65 with a
/// message that says what is wrong, as other invalid profiles do.
#[test]
fn report_compact_corrupt_exits_65() {
    let dir = tempfile::tempdir().expect("tempdir");
    let v2 = write_profile(dir.path(), &sites());
    let plain = fs::read(convert(&v2, dir.path(), "v3.json")).expect("read");
    let zst = fs::read(convert(&v2, dir.path(), "v3.json.zst")).expect("read");
    let mut bad_id: Value = serde_json::from_slice(&plain).expect("JSON");
    bad_id["stacks"]["entries"][1]["frames"][0] = json!(12);
    let mut bad_string: Value = serde_json::from_slice(&plain).expect("JSON");
    bad_string["stacks"]["modules"][1]["path"] = json!(99);
    let mut flipped = zst.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0xff;
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "cut short",
            plain[..plain.len() / 2].to_vec(),
            "is not a valid memtrail profile: EOF while parsing",
        ),
        (
            "a frame id past the table",
            serde_json::to_vec(&bad_id).expect("JSON"),
            "is not a valid memtrail profile: stacks: frame 12 is not in the table (it has 12 rows)",
        ),
        (
            "a string id past the table",
            serde_json::to_vec(&bad_string).expect("JSON"),
            "is not a valid memtrail profile: stacks: string 99 is not in the table (it has 15 rows)",
        ),
        (
            "zstd cut short",
            zst[..zst.len() - 8].to_vec(),
            "is not a valid memtrail profile: its zstd compression is corrupt or cut short",
        ),
        (
            "zstd corrupt",
            flipped,
            "is not a valid memtrail profile: its zstd compression is corrupt or cut short",
        ),
    ];
    for (what, bytes, message) in cases {
        let profile = dir.path().join("bad.json");
        fs::write(&profile, &bytes).expect("write");
        let run = memtrail(&["report".as_ref(), profile.as_os_str()]);
        run.expect_code(65);
        let expected = format!("memtrail: error: {} {message}", profile.display());
        assert!(
            run.stderr.starts_with(&expected),
            "{what}: {:?} does not start with {expected:?}",
            run.stderr
        );
        assert_eq!(run.stderr.lines().count(), 1, "{what}: one line");
        assert!(run.stdout.is_empty(), "{what}");
    }
}

/// Check that a capture written to a `.zst` name is zstd-compressed
/// version 3, and that `memtrail report` of it makes exactly the text and
/// pprof reports `run --report` rendered from the profile in memory.
#[test]
fn report_compact_capture_to_zst() {
    let built = fixture("stacks");
    for format in ["text", "pprof"] {
        let dir = tempfile::tempdir().expect("tempdir");
        let profile = dir.path().join("p.json.zst");
        let out = dir.path().join("report");
        let run = memtrail(&[
            "run".as_ref(),
            "-q".as_ref(),
            "--output".as_ref(),
            profile.as_os_str(),
            "--report".as_ref(),
            format.as_ref(),
            "--report-output".as_ref(),
            out.as_os_str(),
            "--".as_ref(),
            built.as_os_str(),
        ]);
        run.expect_code(0);
        let bytes = fs::read(&profile).expect("profile written");
        assert_eq!(bytes[..4], ZSTD_MAGIC, "{format}");
        let doc: Value =
            serde_json::from_slice(&report_of(&profile, &["--format", "profile"])).expect("JSON");
        assert_eq!(doc["version"], 3);
        assert!(
            !doc["stacks"]["entries"]
                .as_array()
                .expect("entries")
                .is_empty()
        );
        let written = fs::read(&out).expect("report written");
        assert_eq!(
            written,
            report_of(&profile, &["--format", format]),
            "{format}"
        );
    }
}
