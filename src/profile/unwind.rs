//! How stacks were walked and why they ended: the profile's `unwind`
//! section's vocabulary (the walker and its tables are the `unwind` module's).

use std::fmt;

use std::path::PathBuf;

/// `--unwind`: how stacks are walked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Unwind tables where an image has them, frame pointers elsewhere.
    #[default]
    Auto,
    /// Frame pointers only.
    Fp,
    /// Unwind tables only: a frame without one ends the stack.
    Dwarf,
}

impl Mode {
    /// Whether images need tables.
    pub fn uses_tables(self) -> bool {
        self != Mode::Fp
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Auto => "auto",
            Mode::Fp => "fp",
            Mode::Dwarf => "dwarf",
        })
    }
}

/// Why a stack walk stopped (`enum mt_stack_end`).
#[derive(
    Clone,
    Copy,
    Debug,
    Default,
    PartialEq,
    Eq,
    Hash,
    PartialOrd,
    Ord,
    serde::Serialize,
    serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum StackEnd {
    /// The outermost frame (or the end of a frame-pointer chain).
    #[default]
    Complete,
    /// `--stack-depth` frames kept, and there were more.
    DepthLimit,
    /// A frame in code without an unwind table.
    NoTable,
    /// Stack memory could not be read (or made no sense).
    Unreadable,
    /// A return address outside the executable mappings.
    NotCode,
    /// A CFI rule the BPF unwinder does not evaluate.
    Unsupported,
    /// The process's mappings were locked by another thread.
    MappingsBusy,
    /// The stack began at its last frame, switched to from another: a
    /// coroutine's (makecontext's trampoline), or a stack segment whose
    /// caller's frame is below it (issue 41).
    StackSwitch,
}

impl StackEnd {
    /// Whether the walk reached the outermost frame.
    pub fn is_complete(&self) -> bool {
        *self == StackEnd::Complete
    }

    /// Words for the summary.
    pub fn describe(self) -> &'static str {
        match self {
            StackEnd::Complete => "complete",
            StackEnd::DepthLimit => "--stack-depth reached",
            StackEnd::NoTable => "code without unwind table or frame pointer",
            StackEnd::Unreadable => "unreadable stack",
            StackEnd::NotCode => "return address outside code",
            StackEnd::Unsupported => "unsupported unwind rule",
            StackEnd::MappingsBusy => "mappings locked",
            StackEnd::StackSwitch => "stack switch (a coroutine or stack segment began there)",
        }
    }
}

/// What became of one image's table.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Outcome {
    /// Loaded: `rows` rows from `source`, compiled now or read from the
    /// cache.
    Loaded {
        rows: u32,
        source: String,
        cached: bool,
    },
    /// No call frame information: frames there take frame-pointer steps.
    NoCfi,
    /// No call frame information, and no code of its own to walk through
    /// (a data-only library: no exported function, its C runtime's glue
    /// only).
    NoCode,
    /// More rows than the maps had room left for.
    TooBig { rows: u32, room: u32 },
    /// The image could not be read or its CFI parsed.
    Failed { reason: String },
}

/// One image's table, for the profile and the summary.
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct ImageTable {
    pub image: PathBuf,
    #[serde(flatten)]
    pub outcome: Outcome,
    /// Time to compile (or read from the cache) and load, in microseconds.
    pub micros: u64,
    /// Where its table starts in the tables' shared array of slots (a
    /// loaded table): a later image may get the slots of a released one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slot: Option<u64>,
    /// Whether the table was released during the capture, no process
    /// mapping the image any more (issue 23); an image mapped again later
    /// has a new entry.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub released: bool,
}

/// The unwind tables' memory over a capture (issue 23): slots are rows and
/// page index entries, 8 bytes each, in shards of locked memory that stay
/// allocated until the capture ends; released tables' slots are reused.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TableMemory {
    /// The most slots in use at once.
    pub peak_slots: u64,
    /// Slots ever allocated (the highest slot used, plus one).
    pub extent_slots: u64,
    /// Locked memory of the shards, in bytes.
    pub locked_bytes: u64,
    /// Tables released because no process mapped their image any more.
    pub released: u64,
}
