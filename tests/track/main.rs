//! What `memtrail run` tracks, counted exactly: every allocator entry
//! point, C++, leaks and peaks, temporaries, threads, processes, mappings,
//! clock readings, start-up, and nothing left behind. One module per
//! behaviour (`cargo test --test track`).

#[path = "../support/mod.rs"]
mod support;

mod track_apis;
mod track_cleanup;
mod track_clock;
mod track_cxx;
mod track_cxx_throw;
mod track_leaks;
mod track_mapping_sites;
mod track_mappings;
mod track_processes;
mod track_reserved;
mod track_resident;
mod track_startup;
mod track_temporary;
mod track_threads;
