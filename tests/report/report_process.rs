//! Reports on captured profiles by process, and symbolized again later
//! (issue 15: every stack names its process; issue 16: frames keep their
//! image's build id and file offset). Real captures under the kernel.

use std::ffi::OsString;
use std::fs;
use std::io::Read;
use std::path::Path;
use std::process::Command;

use flate2::read::GzDecoder;
use memtrail::internals::report::pprof::proto;
use prost::Message;
use serde_json::Value;

use crate::support::{self, capture, cmd, fixture, id, num, string};

/// `memtrail report PROFILE ARGS`: exit code, stdout, stderr.
fn report(profile: &Path, args: &[&str]) -> (i32, String, String) {
    let mut all: Vec<OsString> = vec!["report".into(), profile.into()];
    all.extend(args.iter().map(OsString::from));
    let (_, status, stdout, stderr) = support::memtrail(&all, b"");
    let code = status.code().expect("memtrail exited");
    (code, String::from_utf8(stdout).expect("UTF-8"), stderr)
}

/// The `bytes` of a JSON report's stacks, in order.
fn json_bytes(profile: &Path, args: &[&str]) -> Vec<u64> {
    let mut all = vec!["-f", "json"];
    all.extend(args);
    let (code, out, err) = report(profile, &all);
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON report");
    v["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| num(s, "bytes"))
        .collect()
}

/// The file name of a path.
fn base(path: &Path) -> &str {
    path.file_name()
        .and_then(|n| n.to_str())
        .expect("UTF-8 file name")
}

/// Check that a stack made before an exec names the program that ran
/// then, and one made after it the new program, in one process: exec_first
/// allocates 600011 bytes and execs exec_second, which allocates 600023
/// (issue 16: both stacks named the program exec'd last); `--exe` keeps
/// either by its name, though only exec_second is a process's `exe`.
#[test]
fn report_process_stacks_before_exec_keep_their_exe() {
    let first = fixture("exec_first");
    let second = fixture("exec_second");
    let run = capture(&cmd("exec_first", &[second.as_os_str()]));
    run.expect_code(5);
    let p = run.profile();
    let procs = p["processes"].as_array().expect("processes");
    assert_eq!(procs.len(), 1, "{procs:?}");
    let pid = num(&procs[0], "pid");
    let path = |p: &Path| p.to_str().expect("UTF-8").to_owned();
    assert_eq!(string(&procs[0], "exe"), path(&second));
    // The allocation sites; each program's loader mappings are a
    // direct-syscall site of its own, under that program.
    let mut stacks: Vec<(u64, u64, String)> = p["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| num(s, "allocations") > 0)
        .map(|s| (num(s, "bytes"), num(s, "pid"), string(s, "exe").to_owned()))
        .collect();
    stacks.sort();
    assert_eq!(
        stacks,
        [(600011, pid, path(&first)), (600023, pid, path(&second))]
    );
    let mut direct: Vec<String> = p["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["frames"][0]["function"] == "[no stack: direct syscall]")
        .map(|s| string(s, "exe").to_owned())
        .collect();
    direct.sort();
    assert_eq!(direct, [path(&first), path(&second)]);
    let profile = run.dir.path().join("profile.json");
    assert_eq!(json_bytes(&profile, &["--exe", base(&first)]), [600011]);
    assert_eq!(json_bytes(&profile, &["--exe", &path(&second)]), [600023]);
}

/// Check that each stack of a three-process tree (root, mid, leaf: each
/// exec'd in a forked child, each leaking one block) names its process's
/// pid and executable, ids are decimal strings, and that `--pid` and
/// `--exe` keep only those processes' stacks in the JSON, text, folded,
/// flame graph and pprof reports, pprof labelling the sample with both;
/// a pid the profile lacks is a usage error (issue 15).
#[test]
fn report_process_stacks_name_their_process() {
    let root_exe = fixture("tree_root");
    let mid_exe = fixture("tree_mid");
    let leaf_exe = fixture("tree_leaf");
    let run = capture(&cmd(
        "tree_root",
        &[mid_exe.as_os_str(), leaf_exe.as_os_str()],
    ));
    run.expect_code(0);
    let p = run.profile();
    let pid_of = |exe: &Path| -> u64 {
        let procs = p["processes"].as_array().expect("processes");
        let found: Vec<u64> = procs
            .iter()
            .filter(|e| string(e, "exe") == exe.to_str().expect("UTF-8"))
            .map(|e| num(e, "pid"))
            .collect();
        assert_eq!(found.len(), 1, "{exe:?} in {procs:?}");
        found[0]
    };
    let (root, mid, leaf) = (pid_of(&root_exe), pid_of(&mid_exe), pid_of(&leaf_exe));

    // The allocation sites (each process also has its loader's mappings
    // as a direct-syscall site).
    let mut stacks: Vec<(u64, u64, String)> = p["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| num(s, "allocations") > 0)
        .map(|s| {
            assert_ne!(id(s, "id"), 0, "{s}");
            (num(s, "bytes"), num(s, "pid"), string(s, "exe").to_owned())
        })
        .collect();
    stacks.sort();
    let path = |p: &Path| p.to_str().expect("UTF-8").to_owned();
    assert_eq!(
        stacks,
        [
            (700001, root, path(&root_exe)),
            (700013, mid, path(&mid_exe)),
            (700027, leaf, path(&leaf_exe)),
        ]
    );

    let profile = run.dir.path().join("profile.json");
    assert_eq!(json_bytes(&profile, &[]), [700027, 700013, 700001]);
    assert_eq!(json_bytes(&profile, &["--exe", base(&leaf_exe)]), [700027]);
    assert_eq!(json_bytes(&profile, &["--pid", &mid.to_string()]), [700013]);
    assert_eq!(
        json_bytes(
            &profile,
            &["--pid", &root.to_string(), "--exe", &path(&leaf_exe)]
        ),
        [700027, 700001]
    );

    let (code, text, err) = report(&profile, &["--exe", base(&mid_exe)]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(text.matches("\n#").count(), 1, "{text}");
    assert!(text.contains("tree_mid.c:"), "{text}");
    assert!(!text.contains("tree_leaf.c:") && !text.contains("tree_root.c:"));

    let (code, folded, err) = report(&profile, &["-f", "folded", "--pid", &leaf.to_string()]);
    assert_eq!(code, 0, "{err}");
    let values: Vec<&str> = folded
        .lines()
        .map(|l| l.rsplit(' ').next().expect("value"))
        .collect();
    assert_eq!(values, ["700027"], "{folded}");

    let (code, svg, err) = report(&profile, &["-f", "flamegraph", "--pid", &leaf.to_string()]);
    assert_eq!(code, 0, "{err}");
    assert!(svg.contains("tree_leaf.c") || svg.contains("main"), "{svg}");
    assert!(svg.contains("700,027"), "{svg}");
    let (_, svg_all, _) = report(&profile, &["-f", "flamegraph"]);
    assert!(svg_all.contains("2,100,041"), "{svg_all}");
    assert!(!svg.contains("2,100,041"));

    let out = run.dir.path().join("heap.pb.gz");
    let (code, _, err) = report(
        &profile,
        &[
            "-f",
            "pprof",
            "--exe",
            base(&leaf_exe),
            "-o",
            out.to_str().expect("UTF-8"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let mut raw = Vec::new();
    GzDecoder::new(&fs::read(&out).expect("pprof")[..])
        .read_to_end(&mut raw)
        .expect("gunzip");
    let pp = proto::Profile::decode(&raw[..]).expect("decode");
    let s = |i: i64| pp.string_table[usize::try_from(i).expect("index")].as_str();
    // The leaf's allocation site; its other site is the loader's mappings
    // (the direct-syscall site), which allocated nothing.
    let allocating: Vec<&proto::Sample> = pp.sample.iter().filter(|x| x.value[1] > 0).collect();
    assert_eq!((pp.sample.len(), allocating.len()), (2, 1));
    let labels: Vec<(&str, &str, i64)> = allocating[0]
        .label
        .iter()
        .map(|l| (s(l.key), s(l.str), l.num))
        .collect();
    assert_eq!(
        labels,
        [
            ("pid", "", i64::try_from(leaf).expect("pid")),
            ("exe", leaf_exe.to_str().expect("UTF-8"), 0)
        ]
    );

    let (code, out, err) = report(&profile, &["--pid", "1"]);
    assert_eq!(code, 2, "{out}");
    assert!(
        err.contains("has no process with pid 1 (its processes: "),
        "{err}"
    );
    let (code, _, err) = report(&profile, &["--exe", "no-such-program"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("has no process running no-such-program"),
        "{err}"
    );
}

/// Check that frames of a stripped binary, which have no function, keep
/// the binary's build id and file offsets, so `memtrail report
/// --debuginfo-dir DIR` names their functions and lines from the split
/// debug file at `DIR/.build-id/xx/rest.debug` (issue 16).
#[test]
fn report_debuginfo_dir_symbolizes_stripped_frames() {
    // Not while the fixture's debug file is installed system-wide.
    let _system_debug = SYSTEM_DEBUG.lock().unwrap_or_else(|e| e.into_inner());
    // Built with -g.
    let built = fixture("stacks");
    let dir = tempfile::tempdir().expect("tempdir");
    let stripped = dir.path().join("stacks-stripped");
    let debug = dir.path().join("stacks.debug");
    let objcopy = |args: &[&OsString]| {
        let out = Command::new("objcopy")
            .args(args)
            .output()
            .expect("objcopy");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    objcopy(&[
        &"--only-keep-debug".into(),
        &built.clone().into(),
        &debug.clone().into(),
    ]);
    objcopy(&[
        &"--strip-all".into(),
        &built.clone().into(),
        &stripped.clone().into(),
    ]);

    let run = capture(&[stripped.clone().into_os_string()]);
    run.expect_code(0);
    let module = stripped.to_str().expect("UTF-8");
    let own_frames = |p: &Value| -> Vec<Value> {
        p["stacks"]
            .as_array()
            .expect("stacks")
            .iter()
            .flat_map(|s| s["frames"].as_array().expect("frames").clone())
            .filter(|f| f["module"] == module)
            .collect()
    };
    let frames = own_frames(run.profile());
    // 4 stacks: main, the site and (for site_shared) the path, and _start.
    assert!(frames.len() >= 12, "{frames:?}");
    let build_id = string(&frames[0], "build_id").to_owned();
    assert!(
        build_id.len() == 40 && build_id.bytes().all(|b| b.is_ascii_hexdigit()),
        "{build_id}"
    );
    // One load address: `offset` is that of `addr - 1` in the file.
    let base = |f: &Value| num(f, "addr") - 1 - num(f, "offset");
    for f in &frames {
        assert_eq!(f["function"], Value::Null, "stripped: {f}");
        assert_eq!(string(f, "build_id"), build_id, "{f}");
        assert_eq!(base(f), base(&frames[0]), "{f}");
    }
    assert_eq!(base(&frames[0]) % 4096, 0);

    let debuginfo = dir.path().join("debuginfo");
    let (head, rest) = build_id.split_at(2);
    let slot = debuginfo.join(".build-id").join(head);
    fs::create_dir_all(&slot).expect("mkdir");
    fs::rename(&debug, slot.join(format!("{rest}.debug"))).expect("place debug file");

    let profile = run.dir.path().join("profile.json");
    let (code, out, err) = report(
        &profile,
        &[
            "-f",
            "json",
            "--debuginfo-dir",
            debuginfo.to_str().expect("UTF-8"),
        ],
    );
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).expect("JSON");
    let mut sites: Vec<(u64, Vec<String>)> = v["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| {
            let names = s["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .filter(|f| f["module"] == module)
                .map(|f| f["function"].as_str().unwrap_or("?").to_owned())
                .collect();
            (num(s, "bytes"), names)
        })
        .collect();
    sites.sort();
    let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        sites,
        [
            (22222, names(&["site_shared", "path_two", "main", "_start"])),
            (33333, names(&["site_small", "main", "_start"])),
            (44444, names(&["site_shared", "path_one", "main", "_start"])),
            (100000, names(&["site_big", "main", "_start"])),
        ]
    );

    pprof_symbolizes_from_mappings(&profile, &built, &stripped);

    let (code, _, err) = report(&profile, &["--debuginfo-dir", "/nonexistent"]);
    assert_eq!(code, 2);
    assert!(
        err.contains("--debuginfo-dir /nonexistent: not a directory"),
        "{err}"
    );
}

/// `go tool pprof -symbolize=local` finds the functions of a stripped
/// image's frames in its unstripped build through the pprof report's
/// mapping table (address range and file offset of the code): skipped
/// without Go. Go 1.19's pprof reads no build id from binaries with an
/// 8-byte aligned note (all of Debian 12's), so the mappings' build ids are
/// cleared first and the build is found by file name in
/// `PPROF_BINARY_PATH`.
fn pprof_symbolizes_from_mappings(profile: &Path, built: &Path, stripped: &Path) {
    if Command::new("go").arg("version").output().is_err() {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("heap.pb.gz");
    let (code, _, err) = report(
        profile,
        &["-f", "pprof", "-o", out.to_str().expect("UTF-8")],
    );
    assert_eq!(code, 0, "{err}");
    let mut raw = Vec::new();
    GzDecoder::new(&fs::read(&out).expect("pprof")[..])
        .read_to_end(&mut raw)
        .expect("gunzip");
    let mut pp = proto::Profile::decode(&raw[..]).expect("decode");
    for m in &mut pp.mapping {
        m.build_id = 0;
    }
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &pp.encode_to_vec()).expect("gzip");
    fs::write(&out, gz.finish().expect("gzip")).expect("write");

    let bins = dir.path().join("bins");
    fs::create_dir(&bins).expect("mkdir");
    fs::copy(built, bins.join(base(stripped))).expect("copy the build");
    let run = Command::new("go")
        .args([
            "tool",
            "pprof",
            "-symbolize=local",
            "-top",
            "-nodefraction=0",
        ])
        .arg(&out)
        .env("PPROF_BINARY_PATH", &bins)
        .env("PPROF_TMPDIR", dir.path())
        .output()
        .expect("go tool pprof");
    let text = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    for name in [
        "site_big",
        "site_small",
        "site_shared",
        "path_one",
        "path_two",
        "main",
    ] {
        assert!(
            text.lines()
                .any(|l| l.split_whitespace().last() == Some(name)),
            "{name} not in:\n{text}\n{stderr}"
        );
    }
}

/// Held by the tests that need to know whether the `stacks` fixture's
/// debug file is installed under /usr/lib/debug.
static SYSTEM_DEBUG: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Removes a file when dropped (a debug file installed for a test).
struct Installed(std::path::PathBuf);

impl Drop for Installed {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// A stripped copy of the `stacks` fixture in `dir` and its split debug
/// file (the build's DWARF), and the stripped image's build id.
fn stripped_with_debug(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf, String) {
    let built = fixture("stacks");
    let stripped = dir.join("stacks-stripped");
    let debug = dir.join("stacks.debug");
    for args in [
        [
            OsString::from("--only-keep-debug"),
            built.clone().into(),
            debug.clone().into(),
        ],
        [
            OsString::from("--strip-all"),
            built.clone().into(),
            stripped.clone().into(),
        ],
    ] {
        let out = Command::new("objcopy")
            .args(&args)
            .output()
            .expect("objcopy");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = Command::new("readelf")
        .args(["-n"])
        .arg(&stripped)
        .output()
        .expect("readelf");
    let notes = String::from_utf8_lossy(&out.stdout);
    let build_id = notes
        .lines()
        .find_map(|l| l.trim().strip_prefix("Build ID: "))
        .expect("a build id")
        .to_owned();
    (stripped, debug, build_id)
}

/// A frame's function, file name and line.
type SourceFrame = (String, String, u64);

/// The (function, file name, line) of the frames of `module` in the
/// stacks of `p`, site by site, largest bytes first.
fn module_lines(p: &Value, module: &str) -> Vec<(u64, Vec<SourceFrame>)> {
    let mut sites: Vec<(u64, Vec<SourceFrame>)> = p["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| {
            let frames = s["frames"]
                .as_array()
                .expect("frames")
                .iter()
                .filter(|f| f["module"] == module)
                .map(|f| {
                    let file = f["file"].as_str().unwrap_or("?");
                    let file = file.rsplit('/').next().unwrap_or(file).to_owned();
                    (
                        f["function"].as_str().unwrap_or("?").to_owned(),
                        file,
                        f["line"].as_u64().unwrap_or(0),
                    )
                })
                .collect();
            (num(s, "bytes"), frames)
        })
        .filter(|(_, frames): &(u64, Vec<_>)| !frames.is_empty())
        .collect();
    sites.sort();
    sites
}

/// Check that a capture of a stripped image finds its debug file as gdb
/// does (issue 23): by build id under /usr/lib/debug/.build-id, with no
/// flag, and under `memtrail run --debuginfo-dir DIR`: the image's frames
/// get functions, files and lines (the file installed under /usr/lib/debug
/// is removed afterwards).
#[test]
fn capture_finds_debug_files_by_build_id() {
    let _system_debug = SYSTEM_DEBUG.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().expect("tempdir");
    let (stripped, debug, build_id) = stripped_with_debug(dir.path());
    let module = stripped.to_str().expect("UTF-8").to_owned();
    let (head, rest) = build_id.split_at(2);
    let slot = Path::new("/usr/lib/debug/.build-id").join(head);
    fs::create_dir_all(&slot).expect("mkdir under /usr/lib/debug");
    let installed = Installed(slot.join(format!("{rest}.debug")));
    fs::copy(&debug, &installed.0).expect("install the debug file");

    let check = |p: &Value| {
        let sites = module_lines(p, &module);
        let named: Vec<(u64, Vec<String>)> = sites
            .iter()
            .map(|(b, f)| (*b, f.iter().map(|f| f.0.clone()).collect()))
            .collect();
        let names = |n: &[&str]| n.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
        assert_eq!(
            named,
            [
                (22222, names(&["site_shared", "path_two", "main", "_start"])),
                (33333, names(&["site_small", "main", "_start"])),
                (44444, names(&["site_shared", "path_one", "main", "_start"])),
                (100000, names(&["site_big", "main", "_start"])),
            ]
        );
        // Every frame but _start's (assembly) has its line in stacks.c.
        for (_, frames) in &sites {
            for (function, file, line) in frames.iter().filter(|f| f.0 != "_start") {
                assert_eq!(file, "stacks.c", "{function}");
                assert!(*line > 0, "{function}");
            }
        }
    };
    let run = capture(&[stripped.clone().into_os_string()]);
    run.expect_code(0);
    check(run.profile());
    drop(installed);

    // Elsewhere, named by --debuginfo-dir.
    let debuginfo = dir.path().join("debuginfo");
    let slot = debuginfo.join(".build-id").join(head);
    fs::create_dir_all(&slot).expect("mkdir");
    fs::copy(&debug, slot.join(format!("{rest}.debug"))).expect("place debug file");
    let run = support::capture_flags(
        &["--debuginfo-dir", debuginfo.to_str().expect("UTF-8")],
        &[stripped.into_os_string()],
        b"",
        &[],
    );
    run.expect_code(0);
    check(run.profile());
}
