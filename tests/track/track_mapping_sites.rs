//! Anonymous mappings and program break growth made outside allocator
//! calls, attributed to the call stacks that made them through libc's
//! `mmap` and `sbrk` (issue 15, "mmap and processes in the reports"):
//! exact per-site metrics in the profile and in every report format.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::Path;

use flate2::read::GzDecoder;
use memtrail::internals::report::pprof::proto;
use prost::Message;
use serde_json::Value;

use crate::support::{self, Mappings, capture, field, fixture, fixture_with_flags, memtrail, num};

const PAGE: u64 = 4096;

const DIRECT: &str = "[no stack: direct syscall]";

/// A site's metrics: (mmaps, mapped, at peak, at exit, brk, allocations,
/// bytes).
type Row = [u64; 7];

const FIELDS: [&str; 7] = [
    "mmaps",
    "mapped_bytes",
    "mapped_bytes_at_peak",
    "mapped_bytes_at_exit",
    "brk_bytes",
    "allocations",
    "bytes",
];

/// Every stack's metrics summed per innermost function.
fn by_function(profile: &Value) -> BTreeMap<String, Row> {
    let mut out: BTreeMap<String, Row> = BTreeMap::new();
    for s in field(profile, "stacks").as_array().expect("stacks") {
        let f = s["frames"][0]["function"]
            .as_str()
            .unwrap_or("?")
            .to_owned();
        let row = out.entry(f).or_default();
        for (i, name) in FIELDS.iter().enumerate() {
            row[i] += num(s, name);
        }
    }
    out
}

fn run_fixture() -> support::Capture {
    let exe = fixture_with_flags("mmap_sites", support::NO_FP);
    let run = capture(&[exe.into_os_string()]);
    run.expect_code(0);
    run
}

/// The baseline fixture's mappings: what the dynamic loader maps before
/// main, by direct syscalls.
fn baseline() -> Mappings {
    let run = capture(&[fixture("baseline").into_os_string()]);
    run.expect_code(0);
    Mappings::of(field(run.profile(), "mappings"))
}

/// Check that anonymous mmaps, munmaps, an mremap and sbrk growth made from
/// known functions are attributed to them exactly (mmaps, bytes mapped,
/// mapped at the mapping peak, mapped at exit, break growth); that a malloc
/// glibc serves by mmap is a heap allocation of its site and no mapping
/// site; that the dynamic loader's own mappings are the direct-syscall
/// site; and that the sites add up to the profile's mapping totals.
#[test]
fn track_mapping_sites_exact() {
    let base = baseline();
    let run = run_fixture();
    let profile = run.profile();
    let sites = by_function(profile);
    let want: BTreeMap<String, Row> = [
        ("map_region", [3, 23 * PAGE, 23 * PAGE, 16 * PAGE, 0, 0, 0]),
        ("map_other", [1, 13 * PAGE, 13 * PAGE, 0, 0, 0, 0]),
        ("map_late", [1, 8 * PAGE, 0, 6 * PAGE, 0, 0, 0]),
        ("grow_break", [0, 0, 0, 0, 20000, 0, 0]),
        ("big_block", [0, 0, 0, 0, 0, 1, 1 << 20]),
        (
            DIRECT,
            [
                base.mmaps,
                base.mapped_bytes,
                base.mapped_bytes_at_exit,
                base.mapped_bytes_at_exit,
                0,
                0,
                0,
            ],
        ),
    ]
    .into_iter()
    .map(|(f, row)| (f.to_owned(), row))
    .collect();
    assert_eq!(sites, want, "baseline: {base:?}");

    // The sites account for every mapping outside allocators.
    let maps = field(profile, "mappings");
    let sum = |i: usize| sites.values().map(|r| r[i]).sum::<u64>();
    assert_eq!(sum(0), num(maps, "mmaps"), "{maps}");
    assert_eq!(sum(1), num(maps, "mapped_bytes"), "{maps}");
    assert_eq!(sum(2), num(maps, "peak_mapped_bytes"), "{maps}");
    assert_eq!(sum(3), num(maps, "mapped_bytes_at_exit"), "{maps}");
    assert_eq!(num(maps, "brk_grown_bytes"), 20000, "{maps}");

    // The direct-syscall site is the process's, with its one frame.
    let direct: Vec<&Value> = profile["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .filter(|s| s["frames"][0]["function"] == DIRECT)
        .collect();
    assert_eq!(direct.len(), 1, "{direct:?}");
    assert_eq!(direct[0]["frames"].as_array().map(Vec::len), Some(1));
    assert!(
        direct[0]["exe"]
            .as_str()
            .is_some_and(|e| e.contains("mmap_sites")),
        "{}",
        direct[0]
    );
    // Every mapping site's stack reaches main.
    for s in profile["stacks"].as_array().expect("stacks") {
        let frames: Vec<&str> = s["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .filter_map(|f| f["function"].as_str())
            .collect();
        if frames[0] != DIRECT {
            assert_eq!(frames.get(1), Some(&"main"), "{frames:?}");
        }
    }
}

/// Check that without stacks (`--stack-depth 0`) there are no sites, the
/// direct-syscall one included, and the mapping totals stay.
#[test]
fn track_mapping_sites_no_stacks() {
    let exe = fixture_with_flags("mmap_sites", support::NO_FP);
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("profile.json");
    let args: Vec<OsString> = vec![
        "run".into(),
        "--stack-depth".into(),
        "0".into(),
        "--output".into(),
        out.clone().into(),
        "--".into(),
        exe.into_os_string(),
    ];
    let (_, status, _, stderr) = memtrail(&args, b"");
    assert_eq!(status.code(), Some(0), "{stderr}");
    let profile = support::read_profile(&out).expect("profile written");
    let profile = &profile;
    assert_eq!(field(profile, "stacks").as_array().map(Vec::len), Some(0));
    assert_eq!(num(field(profile, "mappings"), "brk_grown_bytes"), 20000);
}

/// Runs `memtrail report PROFILE ARGS`; returns stdout.
fn report(profile: &Path, args: &[&str]) -> Vec<u8> {
    let mut all: Vec<OsString> = vec!["report".into(), profile.into()];
    all.extend(args.iter().map(OsString::from));
    let (_, status, stdout, stderr) = memtrail(&all, b"");
    assert_eq!(status.code(), Some(0), "{args:?}: {stderr}");
    stdout
}

/// Folded stacks: (leaf function, value), sorted.
fn folded_leaves(out: &[u8]) -> Vec<(String, u64)> {
    let mut leaves: BTreeMap<String, u64> = BTreeMap::new();
    for line in std::str::from_utf8(out).expect("utf-8").lines() {
        let (stack, v) = line.rsplit_once(' ').expect("value");
        let leaf = stack.rsplit(';').next().unwrap_or(stack).to_owned();
        *leaves.entry(leaf).or_default() += v.parse::<u64>().expect("number");
    }
    leaves.into_iter().collect()
}

/// Check that `--by mapped`, `mapped-peak`, `mapped-exit` and `brk` rank
/// the mapping sites by those metrics in text, JSON, folded stacks and
/// flame graphs, and that pprof carries them as sample types with the
/// sites' exact values.
#[test]
fn track_mapping_sites_report_by() {
    let base = baseline();
    let run = run_fixture();
    let profile = run.dir.path().join("profile.json");

    let text = String::from_utf8(report(&profile, &["--by", "mapped"])).expect("utf-8");
    assert!(text.contains("by bytes mapped"), "{text}");
    assert!(
        text.contains("\n#1  92.0 KiB mapped (") && text.contains(", 3 mmaps), "),
        "{text}"
    );
    assert!(text.contains("\n    map_region at "), "{text}");
    let text = String::from_utf8(report(&profile, &["--by", "brk"])).expect("utf-8");
    assert!(
        text.contains("top 1 of 1 allocation site by program break growth"),
        "{text}"
    );
    assert!(
        text.contains("\n#1  19.5 KiB brk growth (100.0%)\n"),
        "{text}"
    );
    assert!(text.contains("\n    grow_break at "), "{text}");

    let json: Value = serde_json::from_slice(&report(
        &profile,
        &["--format", "json", "--by", "mapped-peak"],
    ))
    .expect("json");
    assert_eq!(json["by"], "mapped-peak");
    let peak = 36 * PAGE + base.peak_mapped_bytes;
    assert_eq!(json["total"], peak);
    let ranked: Vec<(&str, u64)> = json["stacks"]
        .as_array()
        .expect("stacks")
        .iter()
        .map(|s| {
            (
                s["frames"][0]["function"].as_str().unwrap_or("?"),
                num(s, "mapped_bytes_at_peak"),
            )
        })
        .collect();
    assert_eq!(ranked.iter().map(|r| r.1).sum::<u64>(), peak, "{ranked:?}");
    assert!(ranked.iter().all(|r| r.1 > 0), "{ranked:?}");

    let want = |rows: &[(&str, u64)]| -> Vec<(String, u64)> {
        let mut v: Vec<(String, u64)> = rows
            .iter()
            .filter(|r| r.1 > 0)
            .map(|(f, n)| ((*f).to_owned(), *n))
            .collect();
        v.sort();
        v
    };
    let folded = report(&profile, &["--format", "folded", "--by", "mapped-exit"]);
    assert_eq!(
        folded_leaves(&folded),
        want(&[
            ("map_region", 16 * PAGE),
            ("map_late", 6 * PAGE),
            (DIRECT, base.mapped_bytes_at_exit),
        ])
    );
    let folded = report(&profile, &["--format", "folded", "--by", "mapped"]);
    assert_eq!(
        folded_leaves(&folded),
        want(&[
            ("map_region", 23 * PAGE),
            ("map_other", 13 * PAGE),
            ("map_late", 8 * PAGE),
            (DIRECT, base.mapped_bytes),
        ])
    );

    let svg = String::from_utf8(report(&profile, &["--format", "flamegraph", "--by", "brk"]))
        .expect("utf-8");
    assert!(svg.contains("grow_break (20,000 bytes"), "{svg}");

    // pprof: every site, the mapping metrics as sample types 7 to 11.
    let gz = report(&profile, &["--format", "pprof", "--by", "mapped-peak"]);
    let mut raw = Vec::new();
    GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .expect("gunzip");
    let p = proto::Profile::decode(&raw[..]).expect("decode profile.proto");
    let s = |i: i64| p.string_table[usize::try_from(i).expect("index")].as_str();
    let types: Vec<&str> = p.sample_type.iter().map(|t| s(t.r#type)).collect();
    assert_eq!(
        types[7..],
        [
            "mapped_objects",
            "mapped_space",
            "mapped_inuse_space",
            "mapped_leaked_space",
            "brk_space"
        ]
    );
    assert_eq!(s(p.default_sample_type), "mapped_inuse_space");
    let mut leaves: BTreeMap<String, Vec<i64>> = BTreeMap::new();
    for sample in &p.sample {
        let leaf = p
            .location
            .iter()
            .find(|l| l.id == sample.location_id[0])
            .and_then(|l| l.line.last())
            .and_then(|line| p.function.iter().find(|f| f.id == line.function_id))
            .map_or("?", |f| s(f.name))
            .to_owned();
        let sum = leaves.entry(leaf).or_insert_with(|| vec![0; 5]);
        for (acc, v) in sum.iter_mut().zip(&sample.value[7..]) {
            *acc += v;
        }
    }
    let page = PAGE as i64;
    assert_eq!(
        leaves["map_region"],
        [3, 23 * page, 23 * page, 16 * page, 0]
    );
    assert_eq!(leaves["map_late"], [1, 8 * page, 0, 6 * page, 0]);
    assert_eq!(leaves["grow_break"], [0, 0, 0, 0, 20000]);
    assert_eq!(leaves["big_block"], [0, 0, 0, 0, 0]);
}

/// The instruction that ends at `ret` in `image` (a non-PIE executable:
/// addresses are its own), as objdump shows it.
fn call_before(image: &Path, ret: u64) -> String {
    let out = std::process::Command::new("objdump")
        .arg("-d")
        .arg(format!("--start-address={:#x}", ret - 5))
        .arg(format!("--stop-address={ret:#x}"))
        .arg(image)
        .output()
        .expect("run objdump (binutils)");
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.lines().last().unwrap_or_default().to_owned()
}

/// Check that the distro python3.11's obmalloc arenas (1 MiB anonymous
/// mmaps made by `_PyObject_ArenaMmap` for `new_arena`, outside any
/// allocator memtrail probes) are attributed to complete stacks that go up
/// through `Py_BytesMain` to libc's call of main: every arena mmap of the
/// event stream has a stack, whose innermost frame returns from a call to
/// libc's mmap, and the sites' mmaps and bytes are exactly the arenas'.
#[test]
fn track_mapping_sites_python_arenas() {
    let python = Path::new("/usr/bin/python3.11");
    let run = capture(&[
        python.into(),
        "-c".into(),
        "x=[str(i)*3 for i in range(200000)]".into(),
    ]);
    run.expect_code(0);
    let events = run.events();
    let root = support::stream_root(events);
    let arenas: Vec<&Value> = support::of_pid(events, root)
        .into_iter()
        .filter(|e| support::kind(e) == "mmap" && num(e, "size") == 1 << 20)
        .filter(|e| e["in_allocator"] == false)
        .collect();
    // 200000 strings of 3 to 18 characters: ~60 bytes each.
    assert!(arenas.len() >= 10, "{} arenas", arenas.len());
    let mut ids: Vec<&str> = arenas
        .iter()
        .map(|e| {
            e["stack_id"]
                .as_str()
                .unwrap_or_else(|| panic!("no stack: {e}"))
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();

    let profile = run.profile();
    let (mut mmaps, mut bytes) = (0, 0);
    for id in ids {
        let s = profile["stacks"]
            .as_array()
            .expect("stacks")
            .iter()
            .find(|s| s["id"] == id)
            .unwrap_or_else(|| panic!("stack {id} not in the profile"));
        assert!(s.get("end").is_none(), "the walk ended early: {s}");
        let frames = s["frames"].as_array().expect("frames");
        assert_eq!(frames[0]["module"], "/usr/bin/python3.11", "{s}");
        let call = call_before(python, num(&frames[0], "addr"));
        assert!(
            call.contains("call") && call.contains("<mmap64@plt>"),
            "{call}"
        );
        let names: Vec<&str> = frames
            .iter()
            .filter_map(|f| f["function"].as_str())
            .collect();
        let tail = &names[names.len().saturating_sub(4)..];
        assert_eq!(
            tail,
            [
                "Py_BytesMain",
                "__libc_start_call_main",
                "__libc_start_main_impl",
                "_start"
            ],
            "{names:?}"
        );
        mmaps += num(s, "mmaps");
        bytes += num(s, "mapped_bytes");
    }
    assert_eq!(mmaps, arenas.len() as u64);
    assert_eq!(bytes, (arenas.len() as u64) << 20);

    // Every mapping outside allocators has a site.
    let maps = field(profile, "mappings");
    let sum = |key: &str| -> u64 {
        profile["stacks"]
            .as_array()
            .expect("stacks")
            .iter()
            .map(|s| num(s, key))
            .sum()
    };
    assert_eq!(sum("mmaps"), num(maps, "mmaps"), "{maps}");
    assert_eq!(sum("mapped_bytes"), num(maps, "mapped_bytes"), "{maps}");
    assert_eq!(
        sum("mapped_bytes_at_peak"),
        num(maps, "peak_mapped_bytes"),
        "{maps}"
    );
}

/// Check that `memtrail compare` of two profiles names a site whose
/// mappings grew: the fixture's `map_other` mapping 4 more pages is the
/// anonymous mmap peak's regression (+16384 bytes), shown at that site.
#[test]
fn track_mapping_sites_compare_names_the_site() {
    let exe = fixture_with_flags("mmap_sites", support::NO_FP);
    let base = capture(&[exe.clone().into_os_string()]);
    base.expect_code(0);
    let more = capture(&[exe.into_os_string(), "more".into()]);
    more.expect_code(0);
    let args: Vec<OsString> = vec![
        "compare".into(),
        base.dir.path().join("profile.json").into(),
        more.dir.path().join("profile.json").into(),
    ];
    let (_, status, stdout, stderr) = memtrail(&args, b"");
    let stdout = String::from_utf8(stdout).expect("utf-8");
    assert_eq!(status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("0 allocations (0 B), +16,384 B mapped at map_other ("),
        "{stdout}"
    );
}
