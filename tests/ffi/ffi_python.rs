//! The C ABI from Python (issue 13): examples/regions.py, a ctypes client,
//! asserts a region's exact counts in a Python program.

use std::path::Path;
use std::process::Command;

/// Check that the Python ctypes example, tracking its own interpreter,
/// gets exactly 3 allocations, 1 free and their bytes from a region with 3
/// mallocs and 1 free.
#[test]
fn ffi_python_region_exact() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    // target/<profile>/deps/ffi_python-HASH -> target/<profile>.
    let exe = std::env::current_exe().expect("test executable");
    let lib = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("libmemtrail.so");
    assert!(
        lib.exists(),
        "no {}: run `cargo build --lib` first (scripts/test.sh does)",
        lib.display()
    );
    let out = Command::new("python3")
        .arg(root.join("examples/regions.py"))
        .env("MEMTRAIL_LIB", &lib)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{:?}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        stdout.trim(),
        "allocations=3 frees=1 allocated_bytes=600 freed_bytes=200 peak_live_bytes=600 \
         live_allocations=2 live_bytes=400"
    );
}
