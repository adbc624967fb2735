//! Compiles `bpf/*.bpf.c` into libbpf skeletons in `OUT_DIR`, generates the
//! pprof message types from `proto/profile.proto`, and names the git commit
//! built from for `memtrail --version`.
//!
//! protoc comes from the `protoc-bin-vendored` crate, not from the system:
//! the build needs no package beyond the BPF toolchain, and every machine
//! compiles the schema with the same protoc.
//!
//! clang comes from `$CLANG`, else `clang-19`, else `clang`; with none of them
//! the build stops with the package to install.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

use libbpf_cargo::SkeletonBuilder;

const PROGRAMS: &[&str] = &["memtrail", "ringtest", "floor"];

fn find_clang() -> PathBuf {
    if let Some(clang) = env::var_os("CLANG") {
        return PathBuf::from(clang);
    }
    for candidate in ["clang-19", "clang"] {
        let found = Command::new(candidate)
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success());
        if found {
            return PathBuf::from(candidate);
        }
    }
    panic!(
        "memtrail needs clang to compile its BPF programs, and none was found \
         (tried $CLANG, clang-19, clang). On Debian: apt-get install clang-19 \
         libelf-dev zlib1g-dev pkg-config"
    );
}

/// Runs `git ARGS` in the crate's directory; its trimmed output, if it
/// succeeded.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
        .filter(|s| !s.is_empty())
}

/// Sets `MEMTRAIL_GIT_COMMIT` for `memtrail --version`: the commit built
/// from, or `unknown` outside a git checkout (a source archive). Rebuilt
/// when HEAD moves: HEAD itself, the branch it names, packed refs.
fn git_commit() {
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    println!(
        "cargo:rustc-env=MEMTRAIL_GIT_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
    if commit.is_none() {
        return;
    }
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["symbolic-ref", "-q", "HEAD"]));
    for name in watched {
        // Only files that exist: cargo reruns the script on every build
        // for one that does not.
        if let Some(path) =
            git(&["rev-parse", "--git-path", &name]).filter(|path| Path::new(path).exists())
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}

/// Generates `perftools.profiles.rs` in `OUT_DIR` from the pprof schema.
fn pprof_types() {
    const SCHEMA: &str = "proto/profile.proto";
    println!("cargo:rerun-if-changed={SCHEMA}");
    let protoc = protoc_bin_vendored::protoc_bin_path()
        .unwrap_or_else(|err| panic!("no vendored protoc for this host: {err}"));
    prost_build::Config::new()
        .protoc_executable(protoc)
        .compile_protos(&[SCHEMA], &["proto"])
        .unwrap_or_else(|err| panic!("compiling {SCHEMA}: {err}"));
}

/// Builds the preload shim (`preload/*.c`, `memtrail run --preload`) into
/// `OUT_DIR/memtrail_preload.so`, which the binary embeds: one shared
/// object from every C file there, over `bpf/memtrail.h` (the records and
/// constants it shares with the BPF program; bpf/ is watched by `main`).
fn preload_shim(clang: &Path, out: &Path) {
    const DIR: &str = "preload";
    let mut sources = Vec::new();
    for entry in std::fs::read_dir(DIR).expect("preload/ exists") {
        let path = entry.expect("readable preload/ entry").path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("c") => sources.push(path.clone()),
            Some("h") => {}
            _ => continue,
        }
        println!("cargo:rerun-if-changed={}", path.display());
    }
    // The same object whatever order the directory lists its files in.
    sources.sort();
    let so = out.join("memtrail_preload.so");
    let status = Command::new(clang)
        .args([
            "-O2",
            "-fPIC",
            "-shared",
            "-fno-omit-frame-pointer",
            "-mno-red-zone",
            "-fvisibility=hidden",
            "-Wall",
            "-Werror",
            "-Ibpf",
            "-Wl,-z,now",
            "-o",
        ])
        .arg(&so)
        .args(&sources)
        .status()
        .unwrap_or_else(|err| panic!("running {}: {err}", clang.display()));
    assert!(
        status.success(),
        "building the preload shim ({DIR}/*.c) failed"
    );
}

fn main() {
    git_commit();
    pprof_types();
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = find_clang();
    println!("cargo:rerun-if-env-changed=CLANG");
    preload_shim(&clang, &out);
    for entry in std::fs::read_dir("bpf").expect("bpf/ exists") {
        let path = entry.expect("readable bpf/ entry").path();
        if matches!(path.extension().and_then(|e| e.to_str()), Some("c" | "h")) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
    }
    for name in PROGRAMS {
        let src = Path::new("bpf").join(format!("{name}.bpf.c"));
        let skel = out.join(format!("{name}.skel.rs"));
        SkeletonBuilder::new()
            .source(&src)
            .clang(&clang)
            .clang_args([
                "-O2",
                "-g",
                "-Wall",
                "-Werror",
                "-D__TARGET_ARCH_x86",
                "-Ibpf",
            ])
            .build_and_generate(&skel)
            .unwrap_or_else(|err| panic!("building {}: {err:#}", src.display()));
    }
}
