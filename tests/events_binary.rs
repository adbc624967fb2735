//! The compact binary event stream (`--events FILE.mtev`) and its reader,
//! `memtrail events` (issue 15).

mod common;

use std::ffi::OsString;
use std::io::Write;
use std::process::Command;

use common::{MEMTRAIL, cmd, fixture, kind, num, sized};
use memtrail::events::{Encoder, LEVEL};
use memtrail::record::{Body, Header, Kind, Mem, Record};
use serde_json::Value;

/// `memtrail run -q ARGS -- CMD`; panics unless it exits with `code` (the
/// command's).
fn run(args: &[OsString], command: &[OsString], code: i32) {
    let out = Command::new(MEMTRAIL)
        .args(["run", "-q"])
        .args(args)
        .arg("--")
        .args(command)
        .output()
        .expect("run memtrail");
    assert_eq!(
        out.status.code(),
        Some(code),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `memtrail events FILE`: its stdout, once it exited 0.
fn convert(file: &std::path::Path) -> String {
    let out = Command::new(MEMTRAIL)
        .arg("events")
        .arg(file)
        .output()
        .expect("run memtrail events");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).expect("UTF-8")
}

/// A JSON line of the event stream back as a record.
fn record_of(v: &Value) -> (Header, Option<Mem>, Value) {
    let k = kind(v);
    let kind = (0..64)
        .filter_map(Kind::from_raw)
        .find(|x| x.name() == k)
        .unwrap_or_else(|| panic!("unknown kind {k}"));
    let get = |key: &str| v.get(key).and_then(Value::as_u64).unwrap_or(0);
    let hdr = Header {
        ts_ns: get("ts_ns"),
        pid: get("pid") as u32,
        tid: get("tid") as u32,
        kind,
        in_allocator: v.get("in_allocator").and_then(Value::as_bool) == Some(true),
    };
    let mem = v.get("addr").map(|_| Mem {
        addr: get("addr"),
        size: get("size"),
        old_addr: get("old_addr"),
        old_size: get("old_size"),
        // A decimal string in the JSON lines (profile version 2).
        stack_id: v.get("stack_id").map_or(0, |_| common::id(v, "stack_id")),
    });
    (hdr, mem, v.clone())
}

/// Check that a capture's JSON lines (a fork, an exec, exits, mmap and brk
/// included), encoded as a binary stream, come back from `memtrail events`
/// byte for byte.
#[test]
fn events_binary_round_trip_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let jsonl = dir.path().join("e.jsonl");
    run(
        &[
            "--events".into(),
            jsonl.clone().into(),
            "-o".into(),
            "/dev/null".into(),
        ],
        &cmd("exec_first", &[fixture("exec_second").as_os_str()]),
        // exec_second's own status.
        5,
    );
    let text = std::fs::read_to_string(&jsonl).expect("read the JSON lines");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    for k in ["malloc", "free", "exec", "exit", "mmap"] {
        assert!(lines.iter().any(|e| kind(e) == k), "no {k} in {text}");
    }
    let bin = dir.path().join("e.mtev");
    let file = std::fs::File::create(&bin).expect("create");
    let mut zstd = zstd::stream::write::Encoder::new(file, LEVEL).expect("zstd");
    zstd.write_all(&Encoder::header()).expect("header");
    let mut enc = Encoder::default();
    for v in &lines {
        let (hdr, mem, v) = record_of(v);
        let filename;
        let body = match (hdr.kind, mem) {
            (_, Some(m)) => Body::Mem(m),
            (Kind::Fork, None) => Body::Fork {
                child_pid: num(&v, "child_pid") as u32,
            },
            (Kind::Exec, None) => {
                filename = common::string(&v, "filename").to_owned();
                Body::Exec {
                    filename: filename.as_bytes(),
                }
            }
            (Kind::Exit, None) => Body::Exit {
                exit_code: common::int(&v, "exit_code") as i32,
            },
            _ => panic!("unexpected line {v}"),
        };
        enc.encode(&Record { hdr, body }, &mut zstd)
            .expect("encode");
    }
    zstd.finish().expect("finish");
    assert_eq!(convert(&bin), text);
}

/// Check that `--events FILE.mtev` writes the binary stream of a capture
/// with exactly its events (the fork fixture: 4 mallocs of known sizes, 2
/// frees, a fork and 2 exits), which `memtrail events` reads back.
#[test]
fn events_binary_capture_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("e.mtev");
    run(
        &[
            "--events".into(),
            bin.clone().into(),
            "-o".into(),
            "/dev/null".into(),
        ],
        &cmd("fork", &[]),
        0,
    );
    let head = std::fs::read(&bin).expect("read the stream");
    assert_eq!(head[..4], memtrail::events::ZSTD_MAGIC);
    let events: Vec<Value> = convert(&bin)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON"))
        .collect();
    for size in [500009, 500029, 500057, 300007] {
        assert_eq!(sized(&events, "malloc", size).len(), 1, "{size}");
    }
    let count = |k: &str| events.iter().filter(|e| kind(e) == k).count();
    assert_eq!(count("malloc"), 4);
    assert_eq!(count("free"), 2);
    assert_eq!(count("fork"), 1);
    assert_eq!(count("exit"), 2);
}

/// Check that 200 000 malloc/free pairs take at most 10 bytes an event in
/// the binary stream (the JSON lines take ~107).
#[test]
fn events_binary_size_per_event() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bin = dir.path().join("e.mtev");
    run(
        &[
            "--events".into(),
            bin.clone().into(),
            "--events-format".into(),
            "binary".into(),
            "--pressure-timeout".into(),
            "inf".into(),
            "-o".into(),
            "/dev/null".into(),
        ],
        &cmd("pairs", &["200000".as_ref()]),
        0,
    );
    let bytes = std::fs::metadata(&bin).expect("stream").len();
    let text = convert(&bin);
    let events = text.lines().count() as u64;
    let pairs = text
        .lines()
        .filter(|l| l.contains(r#""kind":"free""#))
        .count();
    assert_eq!(pairs, 200_000);
    assert!(
        bytes <= 10 * events,
        "{bytes} bytes for {events} events: {:.2} a event",
        bytes as f64 / events as f64
    );
}
