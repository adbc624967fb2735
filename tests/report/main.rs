//! Reports and benchmarks: `memtrail report` in every format and its
//! failures, reports of real captures, `memtrail run --report`, the
//! timeline, `memtrail bench` and `memtrail compare`
//! (`cargo test --test report`).

#[path = "../support/mod.rs"]
mod support;

mod bench_compare;
mod bench_runs;
mod report_compact;
mod report_errors;
mod report_formats;
mod report_groups;
mod report_pprof;
mod report_process;
mod report_run;
mod report_timeline;
