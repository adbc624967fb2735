//! Exit codes of memtrail's own failures. Otherwise memtrail exits with the
//! command's code (128 + N when a signal N killed it).

/// Bad command-line usage.
pub const USAGE: i32 = 2;
/// `memtrail report`: the profile is not a valid memtrail profile.
pub const PROFILE_INVALID: i32 = 65;
/// `memtrail report`: the profile cannot be read.
pub const PROFILE_UNREADABLE: i32 = 66;
/// memtrail itself failed.
pub const INTERNAL: i32 = 70;
/// Events were lost: the capture is incomplete and no report was written.
pub const LOST: i32 = 71;
/// Missing privileges or kernel feature.
pub const UNSUPPORTED: i32 = 72;
/// An output path cannot be written.
pub const OUTPUT: i32 = 73;
/// Another tracer's uprobe conflicts with ours.
pub const CONFLICT: i32 = 74;
/// An image the command loaded could not be examined or probed.
pub const ATTACH: i32 = 75;
/// A pressure pause did not recover within --pressure-timeout.
pub const PRESSURE: i32 = 76;
/// `memtrail attach`: a pressure pause did not recover within
/// --pressure-timeout; memtrail detached, leaving the process running.
pub const DETACHED: i32 = 77;
/// `memtrail attach`: no process memtrail can attach to has that PID.
pub const NO_PROCESS: i32 = 78;
/// `memtrail run --preload`: a tracked process corrupted its preload ring
/// file; the profile was written, names the process and marks its counts
/// incomplete.
pub const RING_FAULT: i32 = 79;
/// The command is not executable.
pub const NOT_EXECUTABLE: i32 = 126;
/// The command was not found.
pub const NOT_FOUND: i32 = 127;
