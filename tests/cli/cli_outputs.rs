//! What `-o`/`--output`, `--events` and `--report-output` do with the path
//! they are given (issue 11, part 5): a regular file (or nothing) is
//! replaced whole, through symlinks; a FIFO, a character device or `-` is
//! written as a stream and stays what it was; anything else is refused
//! before the command starts (73); the same file twice is bad usage (2).

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;
use std::process::{Command, Stdio};

use crate::support::{MEMTRAIL, dir_entries, fixture, memtrail};
use serde_json::Value;

/// `memtrail run ARGS... -- touch_marker DIR/marker`.
fn run_marked(args: &[OsString], marker_dir: &Path) -> (i32, String) {
    let mut v: Vec<OsString> = vec!["run".into(), "-q".into()];
    v.extend_from_slice(args);
    v.push("--".into());
    v.push(fixture("touch_marker").into());
    v.push(marker_dir.join("marker").into());
    let (_, status, _, stderr) = memtrail(&v, b"");
    let code = status
        .code()
        .unwrap_or_else(|| panic!("memtrail killed: {status:?}\n{stderr}"));
    (code, stderr)
}

fn mknod(path: &Path, kind: libc::mode_t, major: u32, minor: u32) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path and plain integers.
    let ret = unsafe { libc::mknod(c.as_ptr(), kind | 0o644, libc::makedev(major, minor)) };
    assert_eq!(ret, 0, "mknod {}", path.display());
}

fn mkfifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
}

fn file_type(path: &Path) -> fs::FileType {
    fs::symlink_metadata(path).expect("lstat").file_type()
}

fn parse_profile(bytes: &[u8]) -> Value {
    let v: Value = serde_json::from_slice(bytes)
        .unwrap_or_else(|e| panic!("not a profile ({e}): {}", String::from_utf8_lossy(bytes)));
    assert_eq!(v["format"], "memtrail-profile");
    v
}

/// Check that an output onto a character device is written into the
/// device, which stays a device: a null device takes the profile (exit 0),
/// a full one fails the write (exit 73) (issue 11: `-o /dev/full` replaced
/// /dev/full with a regular file).
#[test]
fn cli_output_onto_character_device_streams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let null = dir.path().join("null");
    let full = dir.path().join("full");
    mknod(&null, libc::S_IFCHR, 1, 3);
    mknod(&full, libc::S_IFCHR, 1, 7);
    for flag in ["--output", "--events"] {
        let (code, stderr) = run_marked(&[flag.into(), null.clone().into()], dir.path());
        assert_eq!(code, 0, "{flag}: {stderr}");
        assert!(file_type(&null).is_char_device(), "{flag}: null replaced");
    }
    let (code, stderr) = run_marked(&["--output".into(), full.clone().into()], dir.path());
    assert_eq!(code, 73, "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "memtrail: error: cannot write {}: No space left on device (os error 28)\n",
            full.display()
        )
    );
    assert!(file_type(&full).is_char_device(), "full replaced");
    assert_eq!(dir_entries(dir.path()), ["full", "marker", "null"]);
}

/// Check that an output onto a FIFO is streamed to its reader and the FIFO
/// stays a FIFO, and that a FIFO nobody reads is refused (exit 73) before
/// the command starts instead of blocking memtrail (issue 11).
#[test]
fn cli_output_onto_fifo_streams() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);

    let (code, stderr) = run_marked(&["--output".into(), fifo.clone().into()], dir.path());
    assert_eq!(code, 73, "{stderr}");
    assert_eq!(
        stderr,
        format!(
            "memtrail: error: cannot write {}: no process has the FIFO open for reading \
             (start the reader first)\n",
            fifo.display()
        )
    );
    assert_eq!(dir_entries(dir.path()), ["fifo"], "the command ran");

    // A reader first (non-blocking, so it need not wait for a writer), and a
    // writer of our own that keeps the reader from seeing end-of-file before
    // memtrail opens the FIFO. The reader drains on a thread while memtrail
    // runs: the profile need not fit in the pipe (its capacity shrinks to
    // one page when the user's pipe allowance is spent).
    let reader = fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .expect("open the FIFO for reading");
    let holder = fs::OpenOptions::new()
        .write(true)
        .open(&fifo)
        .expect("open the FIFO for writing");
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fd = reader.as_raw_fd();
        let flags = libc::fcntl(fd, libc::F_GETFL);
        assert_eq!(libc::fcntl(fd, libc::F_SETFL, flags & !libc::O_NONBLOCK), 0);
    }
    let drain = std::thread::spawn(move || {
        let mut reader = reader;
        let mut bytes = Vec::new();
        reader.read_to_end(&mut bytes).expect("read the FIFO");
        bytes
    });
    let (code, stderr) = run_marked(&["--output".into(), fifo.clone().into()], dir.path());
    drop(holder);
    let bytes = drain.join().expect("reader thread");
    assert_eq!(code, 0, "{stderr}");
    parse_profile(&bytes);
    assert!(file_type(&fifo).is_fifo(), "the FIFO was replaced");
    assert_eq!(dir_entries(dir.path()), ["fifo", "marker"]);
}

/// Check that `-` writes the output to memtrail's standard output and
/// creates no file named `-` (issue 11).
#[test]
fn cli_output_dash_is_stdout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = Command::new(MEMTRAIL)
        .current_dir(dir.path())
        .args(["run", "-q", "-o", "-", "--"])
        .arg(fixture("touch_marker"))
        .arg("marker")
        .stdin(Stdio::null())
        .output()
        .expect("run memtrail");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    parse_profile(&out.stdout);
    assert_eq!(dir_entries(dir.path()), ["marker"]);
}

/// Check that an output path that is a symlink replaces (with --force) the
/// file the link names, in the target's directory, and leaves the link a
/// link; a dangling link creates its target (issue 11: the link was
/// replaced by a file).
#[test]
fn cli_output_through_symlink_replaces_target() {
    let links = tempfile::tempdir().expect("tempdir");
    let targets = tempfile::tempdir().expect("tempdir");
    let profile = targets.path().join("profile.json");
    fs::write(&profile, "old\n").expect("write");
    let events = targets.path().join("events.jsonl");
    std::os::unix::fs::symlink(&profile, links.path().join("p")).expect("symlink to the profile");
    // Relative, dangling, and through a second link.
    std::os::unix::fs::symlink(
        Path::new("..")
            .join(targets.path().file_name().expect("name"))
            .join("events.jsonl"),
        links.path().join("e1"),
    )
    .expect("symlink to the events");
    std::os::unix::fs::symlink("e1", links.path().join("e")).expect("symlink to e1");
    let (code, stderr) = run_marked(
        &[
            "--force".into(),
            "--output".into(),
            links.path().join("p").into(),
            "--events".into(),
            links.path().join("e").into(),
        ],
        targets.path(),
    );
    assert_eq!(code, 0, "{stderr}");
    for link in ["p", "e", "e1"] {
        assert!(
            file_type(&links.path().join(link)).is_symlink(),
            "{link} was replaced"
        );
    }
    assert_eq!(dir_entries(links.path()), ["e", "e1", "p"]);
    assert_eq!(
        dir_entries(targets.path()),
        ["events.jsonl", "marker", "profile.json"]
    );
    parse_profile(&fs::read(&profile).expect("read the profile"));
    let stream = fs::read_to_string(&events).expect("read the events");
    assert!(stream.lines().count() > 0, "empty event stream");
}

/// Check that two outputs naming the same file, by the same path or
/// different ones (`..`, a hard link, a symlink, `-` and /dev/stdout), are
/// bad usage (exit 2) before the command starts, and leave the file as it
/// was (issue 11).
#[test]
fn cli_output_same_file_twice_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    fs::create_dir(d.join("sub")).expect("mkdir");
    fs::write(d.join("x.json"), "old\n").expect("write");
    fs::hard_link(d.join("x.json"), d.join("hard.json")).expect("hard link");
    std::os::unix::fs::symlink("x.json", d.join("soft.json")).expect("symlink");
    let p = |s: &str| OsString::from(d.join(s));
    let cases: Vec<(&str, &str, OsString, OsString)> = vec![
        ("--output", "--events", p("new.json"), p("new.json")),
        ("--output", "--events", p("new.json"), p("sub/../new.json")),
        ("--output", "--events", p("x.json"), p("hard.json")),
        ("--events", "--report-output", p("soft.json"), p("x.json")),
        ("--output", "--report-output", p("x.json"), p("soft.json")),
        ("--output", "--events", "-".into(), "/dev/stdout".into()),
    ];
    for (first, second, a, b) in cases {
        let mut args: Vec<OsString> = vec![first.into(), a.clone(), second.into(), b.clone()];
        if first == "--report-output" || second == "--report-output" {
            args.extend(["--report".into(), "text".into()]);
        }
        let (code, stderr) = run_marked(&args, d);
        assert_eq!(code, 2, "{a:?} {b:?}: {stderr}");
        assert_eq!(
            stderr,
            format!(
                "memtrail: error: {first} and {second} name the same file ({}): give each \
                 output its own\n",
                if b == "-" {
                    "standard output".into()
                } else {
                    Path::new(&b).display().to_string()
                }
            ),
            "{a:?} {b:?}"
        );
        assert_eq!(
            dir_entries(d),
            ["hard.json", "soft.json", "sub", "x.json"],
            "{a:?} {b:?}"
        );
        assert_eq!(fs::read_to_string(d.join("x.json")).expect("read"), "old\n");
    }
}

/// Check that a block device, a socket and a directory are refused as
/// outputs (exit 73) before the command starts, and stay as they were.
#[test]
fn cli_output_unwritable_kinds_exit_73() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    mknod(&d.join("blk"), libc::S_IFBLK, 7, 0);
    let _socket = std::os::unix::net::UnixListener::bind(d.join("sock")).expect("bind");
    fs::create_dir(d.join("dir")).expect("mkdir");
    for (name, why) in [
        (
            "blk",
            "it is a block device; memtrail writes regular files, FIFOs, character \
             devices and - (standard output)",
        ),
        (
            "sock",
            "it is a socket; memtrail writes regular files, FIFOs, character devices \
             and - (standard output)",
        ),
        ("dir", "is a directory"),
    ] {
        for flag in ["--output", "--events"] {
            let (code, stderr) = run_marked(&[flag.into(), d.join(name).into()], d);
            assert_eq!(code, 73, "{name} {flag}: {stderr}");
            assert_eq!(
                stderr,
                format!(
                    "memtrail: error: cannot write {}: {why}\n",
                    d.join(name).display()
                )
            );
        }
    }
    assert!(file_type(&d.join("blk")).is_block_device());
    assert!(file_type(&d.join("sock")).is_socket());
    assert_eq!(dir_entries(d), ["blk", "dir", "sock"], "the command ran");
    assert!(dir_entries(&d.join("dir")).is_empty());
}

/// Check that a capture's outputs are put in place together or not at all,
/// and that the summary is printed either way (issue 28: `run -o /dev/full
/// --events ev.jsonl` exited 73, yet wrote ev.jsonl and printed no
/// summary): whichever output cannot be written (the profile, the event
/// stream, the --report file), no file output appears, the summary has the
/// capture's numbers, and the error names the files left unwritten.
#[test]
fn cli_outputs_commit_together_or_not_at_all() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let full = d.join("full");
    mknod(&full, libc::S_IFCHR, 1, 7);
    let (p, e, r) = (d.join("p.json"), d.join("ev.jsonl"), d.join("r.json"));
    let cases: Vec<(Vec<OsString>, Vec<&Path>)> = vec![
        (
            vec![
                "-o".into(),
                full.clone().into(),
                "--events".into(),
                e.clone().into(),
            ],
            vec![&e],
        ),
        (
            vec![
                "-o".into(),
                p.clone().into(),
                "--events".into(),
                full.clone().into(),
            ],
            vec![&p],
        ),
        (
            vec![
                "-o".into(),
                p.clone().into(),
                "--events".into(),
                e.clone().into(),
                "--report".into(),
                "json".into(),
                "--report-output".into(),
                full.clone().into(),
            ],
            vec![&e, &p],
        ),
        (
            vec![
                "-o".into(),
                p.clone().into(),
                "--report".into(),
                "folded".into(),
                "--report-output".into(),
                r.clone().into(),
                "--events".into(),
                full.clone().into(),
            ],
            vec![&p, &r],
        ),
    ];
    for (args, unwritten) in cases {
        let mut v: Vec<OsString> = vec!["run".into()];
        v.extend(args.iter().cloned());
        v.extend(["--".into(), fixture("malloc_once").into()]);
        let (_, status, _, stderr) = memtrail(&v, b"");
        assert_eq!(status.code(), Some(73), "{args:?}: {stderr}");
        // The summary, with the capture's numbers, before the error.
        assert!(
            stderr.starts_with("memtrail: ") && stderr.contains("\n  allocations "),
            "{args:?}: {stderr}"
        );
        let names: Vec<String> = unwritten.iter().map(|p| p.display().to_string()).collect();
        let last = stderr.lines().last().expect("the error");
        assert_eq!(
            last,
            format!(
                "memtrail: error: cannot write {}: No space left on device (os error 28); so {} \
                 {} not written either (outputs are written together or not at all)",
                full.display(),
                names.join(", "),
                if names.len() == 1 { "was" } else { "were" }
            ),
            "{args:?}"
        );
        assert!(!stderr.contains("profile written to"), "{args:?}: {stderr}");
        assert_eq!(dir_entries(d), ["full"], "{args:?}: a file appeared");
    }
}

/// Check that every command writing a file takes `--force` with `run`'s
/// meaning (issue 26: `report -o FILE --force` was refused while `run`
/// needed it): an existing file is refused (exit 73, left as it was)
/// without it, and replaced with it; by `report`, `events`, `compare` and
/// `bench` (`--from` and a run, refused before anything ran).
#[test]
fn cli_output_force_on_every_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = |name: &str| dir.path().join(name).into_os_string();
    let (_, status, _, stderr) = memtrail(
        &[
            "run".into(),
            "-q".into(),
            "-o".into(),
            p("p.json"),
            "--events".into(),
            p("e.mtev"),
            "--".into(),
            fixture("touch_marker").into(),
            p("marker"),
        ],
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    let bench_dir = dir.path().join("bench");
    let (_, status, _, stderr) = memtrail(
        &[
            "bench".into(),
            "-q".into(),
            "--dir".into(),
            bench_dir.clone().into(),
            "--".into(),
            "/bin/true".into(),
        ],
        b"",
    );
    assert_eq!(status.code(), Some(0), "{stderr}");
    let results = bench_dir.join("new/results.json").into_os_string();
    let out = dir.path().join("out");
    let commands: [(&str, Vec<OsString>); 5] = [
        ("report", vec!["report".into(), p("p.json")]),
        ("events", vec!["events".into(), p("e.mtev")]),
        ("compare", vec!["compare".into(), p("p.json"), p("p.json")]),
        (
            "bench --from",
            vec!["bench".into(), "--from".into(), results],
        ),
        (
            "bench",
            vec![
                "bench".into(),
                "-q".into(),
                "--dir".into(),
                bench_dir.into(),
                "--".into(),
                fixture("touch_marker").into(),
                p("bench-marker"),
            ],
        ),
    ];
    for (what, args) in commands {
        fs::write(&out, "old\n").expect("write");
        let mut refused = args.clone();
        // Before a command's `--`, if it has one.
        let at = refused
            .iter()
            .position(|a| a == "--")
            .unwrap_or(refused.len());
        refused.splice(at..at, ["-o".into(), out.clone().into_os_string()]);
        let (_, status, _, stderr) = memtrail(&refused, b"");
        assert_eq!(status.code(), Some(73), "{what}: {stderr}");
        assert!(
            stderr.contains("it exists, and memtrail replaces a file only with --force"),
            "{what}: {stderr}"
        );
        assert_eq!(fs::read_to_string(&out).expect("read"), "old\n", "{what}");
        assert!(!dir.path().join("bench-marker").exists(), "{what} ran");

        let mut forced = refused;
        forced.insert(at, "--force".into());
        let (_, status, _, stderr) = memtrail(&forced, b"");
        assert_eq!(status.code(), Some(0), "{what} --force: {stderr}");
        let text = fs::read_to_string(&out).expect("read");
        assert!(text != "old\n" && !text.is_empty(), "{what}: not replaced");
    }
}
