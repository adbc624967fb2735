//! The compact binary event stream (`--events FILE.mtev`) and its reader,
//! `memtrail events` (issue 15); its checksum, and the reader's rules for
//! inputs and outputs (issue 28). Runs go through [`support::memtrail_bin`]
//! (`MEMTRAIL_BIN` runs another build).

use std::ffi::OsString;
use std::io::Write;
use std::path::Path;
use std::process::Command;

use crate::support::{self, cmd, fixture, kind, memtrail_bin, num, sized};
use memtrail::internals::bpf::record::{Body, Header, Kind, Mem, Record};
use memtrail::internals::events::{Encoder, LEVEL};
use serde_json::Value;

/// `memtrail run -q ARGS -- CMD`; panics unless it exits with `code` (the
/// command's).
fn run(args: &[OsString], command: &[OsString], code: i32) {
    let out = Command::new(memtrail_bin())
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
    let out = Command::new(memtrail_bin())
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
        // mmap and mprotect: the protection (`prot` in the JSON lines).
        old_addr: get("old_addr") | get("prot"),
        old_size: get("old_size"),
        // A decimal string in the JSON lines (profile version 2).
        stack_id: v.get("stack_id").map_or(0, |_| support::id(v, "stack_id")),
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
    let mut zstd = memtrail::internals::events::compressor(file).expect("zstd");
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
                filename = support::string(&v, "filename").to_owned();
                Body::Exec {
                    filename: filename.as_bytes(),
                }
            }
            (Kind::Exit, None) => Body::Exit {
                exit_code: support::int(&v, "exit_code") as i32,
            },
            (Kind::Rss, None) => Body::Rss {
                rss: num(&v, "rss_bytes"),
                peak: num(&v, "peak_rss_bytes"),
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
    assert_eq!(head[..4], memtrail::internals::events::ZSTD_MAGIC);
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

/// `memtrail events FILE`: exit code, stdout, stderr.
fn events(file: &Path) -> (i32, Vec<u8>, String) {
    let out = Command::new(memtrail_bin())
        .arg("events")
        .arg(file)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run memtrail events");
    (
        out.status.code().expect("exited"),
        out.stdout,
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The binary stream of a small capture (malloc_once: an exec, a malloc, a
/// free, mappings and an exit) and its JSON lines.
fn small_stream(dir: &Path) -> (Vec<u8>, Vec<u8>) {
    let bin = dir.join("small.mtev");
    run(
        &[
            "--events".into(),
            bin.clone().into(),
            "-o".into(),
            "/dev/null".into(),
        ],
        &cmd("malloc_once", &[]),
        0,
    );
    let (code, lines, stderr) = events(&bin);
    assert_eq!(code, 0, "{stderr}");
    (std::fs::read(&bin).expect("read the stream"), lines)
}

/// Check that no single-bit flip of a stream decodes into other events
/// (issue 28: 7 of 150 flips decoded with exit 0 into different events):
/// flipping each bit of a capture's stream in turn, `memtrail events`
/// either exits 65, naming the record (or offset) where the corruption
/// was found, or prints exactly the events of the intact stream (a flip
/// zstd's frame header does not care about).
#[test]
fn events_binary_bit_flips_never_decode_wrong() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (stream, lines) = small_stream(dir.path());
    let bits = stream.len() * 8;
    let wrong = std::sync::Mutex::new(Vec::new());
    let refused = std::sync::atomic::AtomicUsize::new(0);
    let workers = 4;
    std::thread::scope(|scope| {
        for w in 0..workers {
            let (stream, lines, wrong, refused) = (&stream, &lines, &wrong, &refused);
            let file = dir.path().join(format!("flip-{w}.mtev"));
            scope.spawn(move || {
                for bit in (w..bits).step_by(workers) {
                    let mut b = stream.clone();
                    b[bit / 8] ^= 1 << (bit % 8);
                    std::fs::write(&file, &b).expect("write the flipped stream");
                    let (code, out, stderr) = events(&file);
                    let ok = match code {
                        0 => out == *lines,
                        65 => {
                            refused.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                            stderr.starts_with("memtrail: error: ")
                                && (stderr.contains("record ")
                                    || stderr.contains("not a memtrail binary event stream"))
                        }
                        _ => false,
                    };
                    if !ok {
                        wrong
                            .lock()
                            .unwrap()
                            .push(format!("bit {bit}: exit {code}: {stderr}"));
                    }
                }
            });
        }
    });
    let wrong = wrong.into_inner().unwrap();
    assert!(
        wrong.is_empty(),
        "{} of {bits} flips: {wrong:#?}",
        wrong.len()
    );
    // Almost every flip is caught, not ignored.
    let refused = refused.into_inner();
    assert!(refused * 10 > bits * 9, "{refused} of {bits} refused");
}

/// Check that a stream cut short, at any length, is corrupt (exit 65)
/// and said to be cut short, not "not a memtrail binary event stream"
/// (issue 28), and never a shorter capture.
#[test]
fn events_binary_truncated_exits_65() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (stream, _) = small_stream(dir.path());
    let cut = dir.path().join("cut.mtev");
    for len in 1..stream.len() {
        std::fs::write(&cut, &stream[..len]).expect("write");
        let (code, out, stderr) = events(&cut);
        assert_eq!(code, 65, "{len} of {} bytes: {stderr}", stream.len());
        assert!(
            stderr.contains("the event stream ends early")
                && stderr.contains("the file was cut short"),
            "{len}: {stderr}"
        );
        // Lines written before the cut was found are whole ones.
        assert!(out.is_empty() || out.ends_with(b"\n"), "{len}");
    }
}

/// Check that a version 1 stream (no zstd checksum, written before issue
/// 28) is still read, and that a version 2 stream whose frame lacks the
/// checksum is refused as corrupt (65).
#[test]
fn events_binary_reads_version_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let rec = Record {
        hdr: Header {
            ts_ns: 7,
            pid: 42,
            tid: 43,
            kind: Kind::Malloc,
            in_allocator: false,
        },
        body: Body::Mem(Mem {
            addr: 4096,
            size: 100,
            old_addr: 0,
            old_size: 0,
            stack_id: 0,
        }),
    };
    for version in [1u8, 2] {
        let path = dir.path().join(format!("v{version}.mtev"));
        let mut zstd = zstd::stream::write::Encoder::new(Vec::new(), LEVEL).expect("zstd");
        let mut header = Encoder::header();
        header[4] = version;
        zstd.write_all(&header).expect("header");
        Encoder::default().encode(&rec, &mut zstd).expect("encode");
        std::fs::write(&path, zstd.finish().expect("finish")).expect("write");
        let (code, out, stderr) = events(&path);
        if version == 1 {
            assert_eq!(code, 0, "{stderr}");
            assert_eq!(
                String::from_utf8_lossy(&out),
                "{\"ts_ns\":7,\"pid\":42,\"tid\":43,\"kind\":\"malloc\",\"addr\":4096,\"size\":100}\n"
            );
        } else {
            assert_eq!(code, 65, "{stderr}");
            assert!(
                stderr.contains("a version 2 stream whose zstd frame has no checksum"),
                "{stderr}"
            );
        }
    }
    // What memtrail writes now is version 2, with the checksum.
    let (stream, _) = small_stream(dir.path());
    assert_eq!(stream[..4], memtrail::internals::events::ZSTD_MAGIC);
    assert_ne!(stream[4] & 0x04, 0, "the frame's Content_Checksum_flag");
}

/// Check that `memtrail events` reads only a regular file (issue 28: the
/// same rules as every reader): a FIFO is not waited on, a device not read
/// (exit 66, naming the file); and that it never writes over its input:
/// `events X -o X`, through a symlink too, is refused (exit 73) and X stays
/// as it was.
#[test]
fn events_binary_inputs_and_outputs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    for (input, why) in [
        (fifo.as_path(), "not a regular file (a FIFO)"),
        (
            Path::new("/dev/zero"),
            "not a regular file (a character device)",
        ),
    ] {
        let mut child = Command::new(memtrail_bin())
            .arg("events")
            .arg(input)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("spawn");
        // A bound on failure, not a timing assumption.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while child.try_wait().expect("try_wait").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{}: memtrail still runs after 60 s", input.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(66), "{stderr}");
        assert_eq!(
            stderr,
            format!(
                "memtrail: error: cannot read the event stream {}: {why}\n",
                input.display()
            )
        );
    }
    let (stream, _) = small_stream(dir.path());
    let x = dir.path().join("small.mtev");
    let link = dir.path().join("link.mtev");
    std::os::unix::fs::symlink(&x, &link).expect("symlink");
    for output in [&x, &link] {
        let out = Command::new(memtrail_bin())
            .arg("events")
            .arg(&x)
            .arg("-o")
            .arg(output)
            .output()
            .expect("run memtrail events");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(73), "{stderr}");
        assert!(
            stderr.contains("it is the event stream being read")
                && stderr.contains("never writes over an input"),
            "{stderr}"
        );
        assert_eq!(std::fs::read(&x).expect("read"), stream);
    }
}
