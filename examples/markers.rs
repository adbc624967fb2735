//! Region markers in a Rust program tracked from outside: the probes
//! `include/memtrail_usdt.h` makes, from the macros the memtrail crate
//! exports (or `include!("memtrail_usdt.rs")` without the crate). Each
//! marker is a `nop` with an ELF note; nothing is called.
//!
//! Run as root (or with memtrail's capabilities):
//! `cargo build --release --example markers`, then
//! `memtrail run -o markers.json -- target/release/examples/markers`.
//! Region "load": 2 allocations (3,000 bytes), 1 free, 1 block of 1,000
//! bytes live at its end; "lookup", entered 4 times: 4 allocations and 4
//! frees of 64 bytes. `tests/examples.rs` checks those counts exactly.

use std::hint::black_box;

use memtrail::{memtrail_region_begin, memtrail_region_end};

fn load() -> Vec<u8> {
    let scratch = black_box(vec![1u8; 2000]);
    let mut table = Vec::with_capacity(1000);
    table.extend_from_slice(&scratch[..1000]);
    table
}

fn lookup(table: &[u8], key: usize) -> bool {
    let copy = black_box(table[key..key + 64].to_vec());
    copy[0] == 1
}

fn main() {
    memtrail_region_begin!("load");
    let table = load();
    memtrail_region_end!();

    let mut hits = 0;
    for key in 0..4 {
        memtrail_region_begin!("lookup");
        hits += usize::from(lookup(&table, key));
        memtrail_region_end!();
    }
    assert_eq!(hits, 4);
}
