//! Compiles `bpf/*.bpf.c` into libbpf skeletons in `OUT_DIR`.
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

fn main() {
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = find_clang();
    println!("cargo:rerun-if-env-changed=CLANG");
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
