//! `memtrail report` failures: an unreadable profile (66), an invalid one
//! (65), bad flags (2), an unwritable output (73), and a reader that closes
//! the pipe early (not a failure, 0). A failure leaves no file behind. No
//! kernel needed.

use std::fs::{self, File};
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};

use serde_json::json;

use crate::support::report::{measured, memtrail, sites, write_profile};
use crate::support::{MEMTRAIL, dir_entries};

/// Check that a profile that cannot be read (missing, a directory) makes
/// memtrail exit 66 with a message naming it, and writes no output.
#[test]
fn report_unreadable_profile_exits_66() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("report.txt");
    for profile in [dir.path().join("missing.json"), dir.path().to_owned()] {
        let run = memtrail(&[
            "report".as_ref(),
            profile.as_os_str(),
            "--output".as_ref(),
            out.as_os_str(),
        ]);
        run.expect_code(66);
        assert_eq!(
            run.stderr.lines().next().expect("a message"),
            format!(
                "memtrail: error: cannot read the profile {}: {}",
                profile.display(),
                if profile.is_dir() {
                    "Is a directory (os error 21)"
                } else {
                    "No such file or directory (os error 2)"
                }
            )
        );
        assert!(run.stdout.is_empty());
        assert!(dir_entries(dir.path()).is_empty(), "files left");
    }
}

/// Check that a file that is not a valid memtrail profile (not JSON, not an
/// object, another format, another version, a missing field, a mistyped
/// field) makes memtrail exit 65 with a message saying what is wrong,
/// leaving an existing output file as it was.
#[test]
fn report_invalid_profile_exits_65() {
    let mut other_format = sites();
    other_format["format"] = json!("pprof");
    let mut no_format = sites();
    no_format.as_object_mut().expect("object").remove("format");
    let mut version_1 = sites();
    version_1["version"] = json!(1);
    let mut version_4 = sites();
    version_4["version"] = json!(4);
    let mut version_string = sites();
    version_string["version"] = json!("2");
    let mut numeric_id = sites();
    numeric_id["stacks"][0]["id"] = json!(10);
    let mut no_totals = sites();
    no_totals.as_object_mut().expect("object").remove("totals");
    let mut bad_frame = sites();
    bad_frame["stacks"][0]["frames"][0]["line"] = json!("twelve");
    let cases: Vec<(&str, Vec<u8>, String)> = vec![
        (
            "not JSON",
            b"{\"format\": ".to_vec(),
            "is not a valid memtrail profile: EOF while parsing a value at line 1 column 11".into(),
        ),
        (
            "empty",
            Vec::new(),
            "is not a valid memtrail profile: EOF while parsing a value at line 1 column 0".into(),
        ),
        (
            "a number",
            b"42".to_vec(),
            "is not a valid memtrail profile: invalid type: integer `42`, \
             expected a memtrail profile (a JSON object) at line 1 column 2"
                .into(),
        ),
        (
            "another format",
            serde_json::to_vec(&other_format).expect("json"),
            "is not a memtrail profile: its \"format\" is \"pprof\", expected \"memtrail-profile\""
                .into(),
        ),
        (
            "no format",
            serde_json::to_vec(&no_format).expect("json"),
            "is not a memtrail profile: its \"format\" is missing, expected \"memtrail-profile\""
                .into(),
        ),
        (
            "version 1 (issue 16: ids became strings)",
            serde_json::to_vec(&version_1).expect("json"),
            "is a profile of version 1; this memtrail reads versions 2 to 3 (version 1 profiles \
             lack each stack's process and image build ids: capture again)"
                .into(),
        ),
        (
            "version 4",
            serde_json::to_vec(&version_4).expect("json"),
            "is a profile of version 4; this memtrail reads versions 2 to 3".into(),
        ),
        (
            "version as a string",
            serde_json::to_vec(&version_string).expect("json"),
            "is a profile of version \"2\"; this memtrail reads versions 2 to 3".into(),
        ),
        (
            "a stack id as a number (issue 16)",
            serde_json::to_vec(&numeric_id).expect("json"),
            "is not a valid memtrail profile: invalid type: integer `10`, expected a string".into(),
        ),
        (
            "no totals",
            serde_json::to_vec(&no_totals).expect("json"),
            "is not a valid memtrail profile: missing field `totals`".into(),
        ),
        (
            "mistyped line",
            serde_json::to_vec(&bad_frame).expect("json"),
            "is not a valid memtrail profile: invalid type: string \"twelve\", expected u32".into(),
        ),
    ];
    for (what, bytes, message) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let profile = dir.path().join("profile.json");
        fs::write(&profile, &bytes).expect("write");
        let out = dir.path().join("report.txt");
        fs::write(&out, "old report\n").expect("write");
        let run = memtrail(&[
            "report".as_ref(),
            profile.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        run.expect_code(65);
        let expected = format!("memtrail: error: {} {message}", profile.display());
        assert!(
            run.stderr.starts_with(&expected),
            "{what}: {:?} does not start with {expected:?}",
            run.stderr
        );
        assert_eq!(run.stderr.lines().count(), 1, "{what}: one line");
        assert_eq!(
            dir_entries(dir.path()),
            ["profile.json", "report.txt"],
            "{what}"
        );
        assert_eq!(fs::read_to_string(&out).expect("read"), "old report\n");
    }
}

/// Check that an unknown format or metric, a bad `--top` and a missing
/// profile argument are usage errors (exit 2) naming the possible values.
#[test]
fn report_bad_flags_exit_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile = write_profile(dir.path(), &sites());
    let p = profile.to_str().expect("UTF-8 path");
    for (args, needle) in [
        (
            vec!["report", p, "--format", "svg"],
            "[possible values: text, json, flamegraph, pprof, folded, timeline, profile]",
        ),
        (
            vec!["report", p, "--by", "time"],
            "[possible values: bytes, count, peak, leaked, temporary, mapped, mapped-peak, mapped-exit, brk]",
        ),
        (vec!["report", p, "--top", "-1"], "unexpected argument '-1'"),
        (vec!["report", p, "--top", "ten"], "invalid digit"),
        (vec!["report"], "<PROFILE.json>"),
    ] {
        let run = memtrail(&args);
        run.expect_code(2);
        assert!(run.stderr.contains(needle), "{args:?}: {}", run.stderr);
        assert!(run.stdout.is_empty());
    }
    assert_eq!(dir_entries(dir.path()), ["profile.json"]);
}

/// Output paths memtrail cannot create, even as root.
fn unwritable(scratch: &Path) -> Vec<(String, std::path::PathBuf)> {
    let file = scratch.join("a-file");
    fs::write(&file, "").expect("write file");
    let existing_dir = scratch.join("a-dir");
    fs::create_dir(&existing_dir).expect("mkdir");
    vec![
        ("missing directory".into(), "/nonexistent/dir/r.txt".into()),
        ("parent is a file".into(), file.join("r.txt")),
        ("a directory".into(), existing_dir),
        ("sysfs".into(), "/sys/memtrail-test-report.txt".into()),
    ]
}

/// Check that an `--output` that cannot be written makes memtrail exit 73,
/// in every format, and leaves nothing behind.
#[test]
fn report_unwritable_output_exits_73() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let profile = write_profile(scratch.path(), &sites());
    let cases = unwritable(scratch.path());
    let before = dir_entries(scratch.path());
    for (what, out) in &cases {
        for format in ["text", "json", "folded", "flamegraph", "pprof"] {
            let run = memtrail(&[
                "report".as_ref(),
                profile.as_os_str(),
                "-f".as_ref(),
                format.as_ref(),
                "-o".as_ref(),
                out.as_os_str(),
            ]);
            run.expect_code(73);
            assert!(
                run.stderr
                    .starts_with(&format!("memtrail: error: cannot write {}", out.display())),
                "{what}: {}",
                run.stderr
            );
            assert!(run.stdout.is_empty());
        }
        assert_eq!(dir_entries(scratch.path()), before, "{what}: files left");
    }
    assert_eq!(
        dir_entries(&scratch.path().join("a-dir")),
        Vec::<String>::new()
    );
}

/// Check that `--output --force` replaces an existing file with the whole
/// report and leaves no temporary file, and that stdout then stays empty
/// (without --force the file is refused: tests/cli/cli_outputs.rs).
#[test]
fn report_output_replaces_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile = write_profile(dir.path(), &sites());
    let out = dir.path().join("sites.folded");
    fs::write(&out, "old\n").expect("write");
    let run = memtrail(&[
        "report".as_ref(),
        profile.as_os_str(),
        "-f".as_ref(),
        "folded".as_ref(),
        "--by".as_ref(),
        "leaked".as_ref(),
        "--output".as_ref(),
        out.as_os_str(),
        "--force".as_ref(),
    ]);
    run.expect_code(0);
    assert!(run.stdout.is_empty() && run.stderr.is_empty(), "{run:?}");
    assert_eq!(
        fs::read_to_string(&out).expect("read"),
        "libc.so.6+0x29d8f;main;load_config 500000\nlibc.so.6+0x29d8f;main;load_config;parse:token 100000\n"
    );
    assert_eq!(dir_entries(dir.path()), ["profile.json", "sites.folded"]);
}

/// Check that a reader closing stdout early (`memtrail report | head`)
/// ends memtrail quietly with exit 0, and that a stdout that cannot be
/// written (`> /dev/full`) is exit 73.
#[test]
fn report_closed_stdout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut doc = sites();
    let template = doc["stacks"][0].clone();
    // ~3 MB of JSON: far more than a pipe holds.
    doc["stacks"] = (0..5000)
        .map(|i| {
            let mut s = template.clone();
            s["id"] = json!(i.to_string());
            s
        })
        .collect();
    let profile = write_profile(dir.path(), &doc);

    let mut child = Command::new(MEMTRAIL)
        .args(["report".as_ref(), profile.as_os_str()])
        .args(["--format", "json"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn memtrail");
    let mut first = [0u8; 1];
    let mut stdout = child.stdout.take().expect("stdout");
    stdout.read_exact(&mut first).expect("read the first byte");
    assert_eq!(&first, b"{");
    drop(stdout);
    let out = child.wait_with_output().expect("wait");
    assert_eq!(out.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&out.stderr), "");

    let full = File::options()
        .write(true)
        .open("/dev/full")
        .expect("open /dev/full");
    let out = Command::new(MEMTRAIL)
        .args(["report".as_ref(), profile.as_os_str()])
        .stdin(Stdio::null())
        .stdout(full)
        .output()
        .expect("run memtrail");
    assert_eq!(out.status.code(), Some(73));
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        "memtrail: error: writing the report to standard output failed: \
         No space left on device (os error 28)\n"
    );
}

/// Check that a profile missing any field, `null`able ones included, is
/// invalid (exit 65, naming the field), as `memtrail report --help` says
/// (issue 11: a profile without `stacks`, `pressure` or `exit.code` was
/// reported on).
#[test]
fn report_missing_fields_exit_65() {
    let cases: &[(&[&str], &str)] = &[
        (&["stacks"], "stacks"),
        (&["pressure"], "pressure"),
        (&["exit", "code"], "code"),
        (&["exit", "signal"], "signal"),
        (&["lost_events", "attach"], "attach"),
        (&["processes", "0", "exit_code"], "exit_code"),
        (&["processes", "0", "end_ns"], "end_ns"),
        (&["stacks", "0", "frames", "0", "file"], "file"),
        (&["stacks", "0", "frames", "0", "module"], "module"),
        (&["stacks", "0", "frames", "0", "inlined"], "inlined"),
        (&["stacks", "0", "frames", "0", "build_id"], "build_id"),
        (&["stacks", "0", "frames", "0", "offset"], "offset"),
        (&["stacks", "0", "pid"], "pid"),
        (&["stacks", "0", "exe"], "exe"),
        (
            &["stacks", "0", "live_allocations_at_peak"],
            "live_allocations_at_peak",
        ),
    ];
    for (at, field) in cases {
        let mut doc = sites();
        let (last, parents) = at.split_last().expect("a path");
        let mut v = &mut doc;
        for key in parents {
            v = match key.parse::<usize>() {
                Ok(i) => &mut v[i],
                Err(_) => &mut v[*key],
            };
        }
        assert!(
            v.as_object_mut().expect("object").remove(*last).is_some(),
            "{at:?} not in the fixture"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let profile = write_profile(dir.path(), &doc);
        let run = memtrail(&["report".as_ref(), profile.as_os_str()]);
        run.expect_code(65);
        let expected = format!(
            "memtrail: error: {} is not a valid memtrail profile: missing field `{field}`",
            profile.display()
        );
        assert!(
            run.stderr.starts_with(&expected),
            "{at:?}: {:?} does not start with {expected:?}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{at:?}");
    }
}

/// Check that a profile path that is not a regular file (a FIFO, which is
/// not waited on, or a device like /dev/zero, which is not read) or a file
/// larger than the 1 GiB cap is unreadable (exit 66) and writes nothing
/// (issue 11: `report FIFO` blocked and `report /dev/zero` grew to 3.8 GB).
#[test]
fn report_special_files_exit_66() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    // Sparse: takes no disk.
    let big = dir.path().join("big.json");
    File::create(&big)
        .and_then(|f| f.set_len((1 << 30) + 1))
        .expect("create a sparse file");
    let out = dir.path().join("report.txt");
    for (profile, why) in [
        (fifo.as_path(), "not a regular file (a FIFO)"),
        (big.as_path(), "larger than the 1 GiB a profile may have"),
        (
            Path::new("/dev/zero"),
            "not a regular file (a character device)",
        ),
    ] {
        let mut child = Command::new(MEMTRAIL)
            .args([
                "report".as_ref(),
                profile.as_os_str(),
                "-o".as_ref(),
                out.as_os_str(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn memtrail");
        // A bound on failure, not a timing assumption: memtrail must not
        // block or read without end.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while child.try_wait().expect("try_wait").is_none() {
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("{}: memtrail still runs after 60 s", profile.display());
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let run = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert_eq!(
            run.status.code(),
            Some(66),
            "{}: {stderr}",
            profile.display()
        );
        assert_eq!(
            stderr,
            format!(
                "memtrail: error: cannot read the profile {}: {why}\n",
                profile.display()
            )
        );
        assert!(run.stdout.is_empty());
        assert_eq!(dir_entries(dir.path()), ["big.json", "fifo"]);
    }
}

/// Check that `memtrail report` never writes over the profile it reads
/// (issue 28: `report P.json -o P.json` exited 0 and destroyed it): the
/// same path, a symlink to it, a hard link, and standard output appended
/// to it are refused (exit 73, the profile as it was, no file left).
#[test]
fn report_output_is_its_input_exits_73() {
    let dir = tempfile::tempdir().expect("tempdir");
    let profile = write_profile(dir.path(), &sites());
    let before = fs::read(&profile).expect("read");
    let link = dir.path().join("link.json");
    std::os::unix::fs::symlink(&profile, &link).expect("symlink");
    let hard = dir.path().join("hard.json");
    fs::hard_link(&profile, &hard).expect("hard link");
    let cases = [
        (profile.clone(), profile.clone()),
        (profile.clone(), link.clone()),
        (link.clone(), profile.clone()),
        (hard.clone(), profile.clone()),
    ];
    for (input, output) in &cases {
        for format in ["text", "json"] {
            let run = memtrail(&[
                "report".as_ref(),
                input.as_os_str(),
                "-f".as_ref(),
                format.as_ref(),
                "-o".as_ref(),
                output.as_os_str(),
            ]);
            run.expect_code(73);
            assert_eq!(
                run.stderr,
                format!(
                    "memtrail: error: cannot write {}: it is the profile being read ({}): \
                     memtrail never writes over an input; name another output\n",
                    output.display(),
                    input.display()
                )
            );
            assert_eq!(fs::read(&profile).expect("read"), before, "{output:?}");
        }
    }
    // Standard output appended to the profile (`>> P.json`).
    let append = File::options()
        .append(true)
        .open(&profile)
        .expect("open for appending");
    let bin = std::env::var_os("MEMTRAIL_BIN").unwrap_or_else(|| MEMTRAIL.into());
    let out = Command::new(bin)
        .args(["report".as_ref(), profile.as_os_str()])
        .stdin(Stdio::null())
        .stdout(append)
        .output()
        .expect("run memtrail");
    assert_eq!(out.status.code(), Some(73));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .starts_with("memtrail: error: cannot write standard output: it is the profile"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(fs::read(&profile).expect("read"), before);
    assert_eq!(
        dir_entries(dir.path()),
        ["hard.json", "link.json", "profile.json"]
    );
}

/// Check that `--suppressions` reads only a regular file of at most 1 MiB
/// with at most 10,000 patterns of at most 1,024 bytes (issue 40: a FIFO
/// hung, /dev/zero took 2 GB, 8 MB of `leak:*a*b*…` over 2 GB): each
/// other file is a usage error (2) naming the file and what is wrong,
/// before the profile is read, with no output left; and that a 1 MiB file
/// of patterns of 500 `*`s each is matched against every frame in small
/// memory (under 150 MB; it took gigabytes as regexes).
#[test]
fn report_suppressions_bounded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let profile = write_profile(d, &sites());
    let fifo = d.join("fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let big = d.join("big.supp");
    fs::write(&big, format!("#{}\n", "x".repeat(1 << 20))).expect("write");
    let many = d.join("many.supp");
    let lines: String = (0..10_001).map(|i| format!("leak:f{i}\n")).collect();
    fs::write(&many, lines).expect("write");
    let long = d.join("long.supp");
    fs::write(&long, format!("# fine\nleak:{}\n", "a".repeat(1025))).expect("write");
    let out = d.join("report.txt");
    for (supp, why) in [
        (fifo.as_path(), "not a regular file (a FIFO)".to_owned()),
        (
            Path::new("/dev/zero"),
            "not a regular file (a character device)".to_owned(),
        ),
        (
            big.as_path(),
            "larger than the 1 MiB a suppression file may have".to_owned(),
        ),
        (
            many.as_path(),
            format!(
                "{}:10001: more than 10000 patterns (in all --suppressions files)",
                many.display()
            ),
        ),
        (
            long.as_path(),
            format!(
                "{}:2: a pattern of 1025 bytes: at most 1024 are read",
                long.display()
            ),
        ),
    ] {
        let run = measured(&[
            "report".as_ref(),
            profile.as_os_str(),
            "--suppressions".as_ref(),
            supp.as_os_str(),
            "-o".as_ref(),
            out.as_os_str(),
        ]);
        assert_eq!(run.code, Some(2), "{}: {}", supp.display(), run.stderr);
        assert!(
            run.stderr.contains(&why),
            "{}: {}",
            supp.display(),
            run.stderr
        );
        assert!(!out.exists());
    }

    // 1,000 patterns of 1,000 bytes, each `*a*b*…` almost matching every
    // frame's strings: matched, in bounded memory.
    let stars = d.join("stars.supp");
    let pattern: String = (0..499)
        .map(|i| format!("*{}", (b'a' + (i % 26) as u8) as char))
        .collect();
    let text: String = (0..1000).map(|_| format!("leak:{pattern}*\n")).collect();
    assert!(text.len() <= 1 << 20 && pattern.len() < 1024);
    fs::write(&stars, text).expect("write");
    let run = measured(&[
        "report".as_ref(),
        profile.as_os_str(),
        "--suppressions".as_ref(),
        stars.as_os_str(),
        "--by".as_ref(),
        "leaked".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(run.code, Some(0), "{}", run.stderr);
    assert!(
        run.max_rss_kib < 150 << 10,
        "peak RSS {} KiB",
        run.max_rss_kib
    );
}

/// A version 3 profile of `sites.json`'s, its `stacks` replaced by tables
/// naming one frame, and one stack whose `frames` are `FRAMES` (to be
/// replaced by the caller).
fn compact_with_frames_hole(dir: &Path) -> (String, String) {
    let v2 = write_profile(dir, &sites());
    let v3 = dir.join("v3.json");
    memtrail(&[
        "report".as_ref(),
        v2.as_os_str(),
        "--format".as_ref(),
        "profile".as_ref(),
        "-o".as_ref(),
        v3.as_os_str(),
    ])
    .expect_code(0);
    let mut doc: serde_json::Value =
        serde_json::from_slice(&fs::read(&v3).expect("read")).expect("JSON");
    doc["stacks"] = json!({
        "strings": ["/opt/shop/bin/shop"],
        "modules": [],
        "functions": [],
        "frames": [{"addr": 4096, "module": null, "function": null, "line": null,
                    "inlined": false, "offset": null}],
        "entries": [{"id": "1", "pid": 100, "exe": 0, "frames": "FRAMES", "allocations": 1,
                     "bytes": 1}],
    });
    let text = serde_json::to_string(&doc).expect("serialize");
    let (head, tail) = text.split_once("\"FRAMES\"").expect("the hole");
    (head.to_owned(), tail.to_owned())
}

/// Check that a small zstd profile is bounded by what it inflates to, not
/// its size on disk (issue 40: a 91 KB file of 1 GB of frame ids took
/// over 4 GB): 256 MiB of frame ids in a few KiB are refused once past
/// what the file may inflate to (100 times its size, at least 16 MiB),
/// exit 66, in under 150 MB; and that a stack of more frames than any
/// capture writes (65,536) is an invalid profile (65), however it is
/// written.
#[test]
fn report_zstd_bomb_bounded() {
    use std::io::Write;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path();
    let (head, tail) = compact_with_frames_hole(d);
    let bomb = d.join("bomb.json.zst");
    let mut z = zstd::stream::write::Encoder::new(File::create(&bomb).expect("create"), 3)
        .expect("encoder");
    z.write_all(head.as_bytes()).expect("write");
    z.write_all(b"[").expect("write");
    let chunk = "0,".repeat(1 << 19);
    for _ in 0..256 {
        z.write_all(chunk.as_bytes()).expect("write");
    }
    z.write_all(b"0]").expect("write");
    z.write_all(tail.as_bytes()).expect("write");
    z.finish().expect("finish");
    let size = fs::metadata(&bomb).expect("stat").len();
    assert!(size < 200 << 10, "{size} bytes");
    let out = d.join("report.txt");
    let run = measured(&[
        "report".as_ref(),
        bomb.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert_eq!(run.code, Some(66), "{}", run.stderr);
    assert!(!out.exists(), "a report was left");
    assert!(
        run.stderr.contains(&format!(
            "larger than the 16 MiB a profile of {size} compressed bytes may inflate to"
        )),
        "{}",
        run.stderr
    );
    assert!(
        run.max_rss_kib < 150 << 10,
        "peak RSS {} KiB",
        run.max_rss_kib
    );

    // 65,537 frames in one stack, plain and compressed.
    let ids = format!("[{}0]", "0,".repeat(1 << 16));
    let plain = d.join("deep.json");
    fs::write(&plain, format!("{head}{ids}{tail}")).expect("write");
    let packed = d.join("deep.json.zst");
    fs::write(
        &packed,
        zstd::encode_all(fs::read(&plain).expect("read").as_slice(), 3).expect("zstd"),
    )
    .expect("write");
    for p in [&plain, &packed] {
        let run = measured(&["report".as_ref(), p.as_os_str()]);
        assert_eq!(run.code, Some(65), "{}", run.stderr);
        assert!(
            run.stderr.contains("more than 65536 frames in a stack"),
            "{}",
            run.stderr
        );
    }
    // One fewer reads.
    let ok = d.join("ok.json");
    let ids = format!("[{}0]", "0,".repeat((1 << 16) - 1));
    fs::write(&ok, format!("{head}{ids}{tail}")).expect("write");
    memtrail(&["report".as_ref(), ok.as_os_str()]).expect_code(0);
}
