//! `memtrail run` as a command: its command line, exit codes, outputs,
//! signals, summary and status line, capabilities and sudo. One module per
//! area of the command line, all in this one binary (`cargo test --test
//! cli`). `memtrail attach` (`cli_attach`) is a binary of its own: it checks
//! that a process outside its capture carries no breakpoint, which the
//! system-wide captures here would put there.
//!
//! `cli_uprobe_conflict` makes its ref_ctr_offset conflicts on a private
//! copy of libc that no other capture maps, and serializes its own tests.

#[path = "../support/mod.rs"]
mod support;

mod cli_caps;
mod cli_errors;
mod cli_exit;
mod cli_meta;
mod cli_outputs;
mod cli_profile;
mod cli_signals;
mod cli_status;
mod cli_sudo;
mod cli_summary;
mod cli_uprobe_conflict;
mod cli_usage;
