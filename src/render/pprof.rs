//! The pprof report: a gzipped `profile.proto` (github.com/google/pprof,
//! `proto/profile.proto`) that `go tool pprof`, Pyroscope and Parca read.
//!
//! - Sample types, in this order: `alloc_objects/count` (allocations),
//!   `alloc_space/bytes` (bytes), `inuse_space/bytes` (live at the tree's
//!   peak), `leaked_objects/count` and `leaked_space/bytes` (live at exit),
//!   `temporary_objects/count` (temporary allocations).
//!   `default_sample_type` is the `--by` metric's.
//! - One sample per site, every site (a site of value 0 for one metric
//!   still has the others), ranked by the `--by` metric; `location_id[0]`
//!   is the innermost frame.
//! - One location per distinct address: an address whose frames include
//!   inlined functions is one location with one line per function, the
//!   inlined ones first and the function they were inlined into last.
//!   A frame without a function name is a location without lines.
//! - One function per distinct (name, file); one mapping per module, with
//!   no address range (the profile has none) and `has_*` flags saying what
//!   its frames resolved, so pprof does not try to symbolize them again.
//!
//! The message types are written by hand from `profile.proto` with prost's
//! derive macros: field tags must match that file.

use std::collections::HashMap;
use std::io::{self, Write};

use flate2::Compression;
use flate2::write::GzEncoder;
use prost::Message;

use super::Metric;
use super::sites::ranked;
use crate::report::{Frame, Profile, StackMetrics};

/// The pprof messages memtrail writes (a subset of `profile.proto`'s
/// fields; unknown fields are skipped when decoding).
pub mod proto {
    /// `perftools.profiles.Profile`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Profile {
        #[prost(message, repeated, tag = "1")]
        pub sample_type: Vec<ValueType>,
        #[prost(message, repeated, tag = "2")]
        pub sample: Vec<Sample>,
        #[prost(message, repeated, tag = "3")]
        pub mapping: Vec<Mapping>,
        #[prost(message, repeated, tag = "4")]
        pub location: Vec<Location>,
        #[prost(message, repeated, tag = "5")]
        pub function: Vec<Function>,
        /// `string_table[0]` is always "".
        #[prost(string, repeated, tag = "6")]
        pub string_table: Vec<String>,
        #[prost(int64, tag = "7")]
        pub drop_frames: i64,
        #[prost(int64, tag = "8")]
        pub keep_frames: i64,
        #[prost(int64, tag = "9")]
        pub time_nanos: i64,
        #[prost(int64, tag = "10")]
        pub duration_nanos: i64,
        #[prost(message, optional, tag = "11")]
        pub period_type: Option<ValueType>,
        #[prost(int64, tag = "12")]
        pub period: i64,
        #[prost(int64, repeated, tag = "13")]
        pub comment: Vec<i64>,
        #[prost(int64, tag = "14")]
        pub default_sample_type: i64,
    }

    /// `perftools.profiles.ValueType`: indices into the string table.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ValueType {
        #[prost(int64, tag = "1")]
        pub r#type: i64,
        #[prost(int64, tag = "2")]
        pub unit: i64,
    }

    /// `perftools.profiles.Sample`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Sample {
        /// Leaf first.
        #[prost(uint64, repeated, tag = "1")]
        pub location_id: Vec<u64>,
        #[prost(int64, repeated, tag = "2")]
        pub value: Vec<i64>,
        #[prost(message, repeated, tag = "3")]
        pub label: Vec<Label>,
    }

    /// `perftools.profiles.Label`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Label {
        #[prost(int64, tag = "1")]
        pub key: i64,
        #[prost(int64, tag = "2")]
        pub str: i64,
        #[prost(int64, tag = "3")]
        pub num: i64,
        #[prost(int64, tag = "4")]
        pub num_unit: i64,
    }

    /// `perftools.profiles.Mapping`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Mapping {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub memory_start: u64,
        #[prost(uint64, tag = "3")]
        pub memory_limit: u64,
        #[prost(uint64, tag = "4")]
        pub file_offset: u64,
        #[prost(int64, tag = "5")]
        pub filename: i64,
        #[prost(int64, tag = "6")]
        pub build_id: i64,
        #[prost(bool, tag = "7")]
        pub has_functions: bool,
        #[prost(bool, tag = "8")]
        pub has_filenames: bool,
        #[prost(bool, tag = "9")]
        pub has_line_numbers: bool,
        #[prost(bool, tag = "10")]
        pub has_inline_frames: bool,
    }

    /// `perftools.profiles.Location`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Location {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(uint64, tag = "2")]
        pub mapping_id: u64,
        #[prost(uint64, tag = "3")]
        pub address: u64,
        /// Inlined functions first, the function they were inlined into
        /// last.
        #[prost(message, repeated, tag = "4")]
        pub line: Vec<Line>,
        #[prost(bool, tag = "5")]
        pub is_folded: bool,
    }

    /// `perftools.profiles.Line`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Line {
        #[prost(uint64, tag = "1")]
        pub function_id: u64,
        #[prost(int64, tag = "2")]
        pub line: i64,
    }

    /// `perftools.profiles.Function`.
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Function {
        #[prost(uint64, tag = "1")]
        pub id: u64,
        #[prost(int64, tag = "2")]
        pub name: i64,
        #[prost(int64, tag = "3")]
        pub system_name: i64,
        #[prost(int64, tag = "4")]
        pub filename: i64,
        #[prost(int64, tag = "5")]
        pub start_line: i64,
    }
}

/// The sample types, in sample value order, and the metric each reads.
pub const SAMPLE_TYPES: [(&str, &str); 6] = [
    ("alloc_objects", "count"),
    ("alloc_space", "bytes"),
    ("inuse_space", "bytes"),
    ("leaked_objects", "count"),
    ("leaked_space", "bytes"),
    ("temporary_objects", "count"),
];

/// The sample type that stands for a `--by` metric.
pub fn sample_type_of(by: Metric) -> &'static str {
    match by {
        Metric::Count => "alloc_objects",
        Metric::Bytes => "alloc_space",
        Metric::Peak => "inuse_space",
        Metric::Leaked => "leaked_space",
        Metric::Temporary => "temporary_objects",
    }
}

fn sample_values(m: &StackMetrics) -> Vec<i64> {
    [
        m.allocations,
        m.bytes,
        m.live_bytes_at_peak,
        m.live_allocations_at_exit,
        m.live_bytes_at_exit,
        m.temporary_allocations,
    ]
    .into_iter()
    .map(|v| i64::try_from(v).unwrap_or(i64::MAX))
    .collect()
}

/// Identity of a location: its address, mapping and lines.
type LocationKey = (u64, u64, Vec<(u64, i64)>);

/// Builds the profile message, interning strings, functions, locations and
/// mappings.
#[derive(Default)]
struct Builder {
    out: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64), u64>,
    locations: HashMap<LocationKey, u64>,
    mappings: HashMap<String, usize>,
}

impl Builder {
    fn new() -> Self {
        let mut b = Self::default();
        b.string("");
        b
    }

    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.out.string_table.len() as i64;
        self.out.string_table.push(s.to_owned());
        self.strings.insert(s.to_owned(), i);
        i
    }

    fn function(&mut self, name: &str, file: Option<&str>) -> u64 {
        let name = self.string(name);
        let file = self.string(file.unwrap_or(""));
        let next = self.out.function.len() as u64 + 1;
        let id = *self.functions.entry((name, file)).or_insert(next);
        if id == next {
            self.out.function.push(proto::Function {
                id,
                name,
                system_name: name,
                filename: file,
                start_line: 0,
            });
        }
        id
    }

    /// The mapping of `module` (index into `out.mapping`).
    fn mapping(&mut self, module: &str) -> usize {
        if let Some(&i) = self.mappings.get(module) {
            return i;
        }
        let filename = self.string(module);
        let i = self.out.mapping.len();
        self.out.mapping.push(proto::Mapping {
            id: i as u64 + 1,
            memory_start: 0,
            memory_limit: 0,
            file_offset: 0,
            filename,
            build_id: 0,
            has_functions: false,
            has_filenames: false,
            has_line_numbers: false,
            has_inline_frames: false,
        });
        self.mappings.insert(module.to_owned(), i);
        i
    }

    /// The location of one address: `frames` are the frames of that
    /// address, inlined ones first.
    fn location(&mut self, frames: &[Frame]) -> u64 {
        let addr = frames[0].addr;
        let mut lines = Vec::new();
        for f in frames {
            if let Some(func) = f.function.as_deref().filter(|s| !s.is_empty()) {
                let function_id = self.function(func, f.file.as_deref());
                lines.push(proto::Line {
                    function_id,
                    line: f.line.map_or(0, i64::from),
                });
            }
        }
        let mapping = frames.iter().find_map(|f| f.module.as_deref()).map(|m| {
            let i = self.mapping(m);
            let mapping = &mut self.out.mapping[i];
            mapping.has_functions |= !lines.is_empty();
            mapping.has_filenames |= frames.iter().any(|f| f.file.is_some());
            mapping.has_line_numbers |= frames.iter().any(|f| f.line.is_some());
            mapping.has_inline_frames |= frames.iter().any(|f| f.inlined);
            mapping.id
        });
        let mapping_id = mapping.unwrap_or(0);
        let key = (
            addr,
            mapping_id,
            lines.iter().map(|l| (l.function_id, l.line)).collect(),
        );
        let next = self.out.location.len() as u64 + 1;
        let id = *self.locations.entry(key).or_insert(next);
        if id == next {
            self.out.location.push(proto::Location {
                id,
                mapping_id,
                address: addr,
                line: lines,
                is_folded: false,
            });
        }
        id
    }
}

/// Splits a site's frames (innermost first) into the frames of each
/// address: a run of inlined frames and the frame they were inlined into,
/// all at one address.
fn by_address(frames: &[Frame]) -> Vec<&[Frame]> {
    let mut groups = Vec::new();
    let mut start = 0;
    for (i, f) in frames.iter().enumerate() {
        let last = i + 1 == frames.len();
        if !f.inlined || last || frames[i + 1].addr != f.addr {
            groups.push(&frames[start..=i]);
            start = i + 1;
        }
    }
    groups
}

/// Builds the pprof message of `profile`.
pub fn build(profile: &Profile, by: Metric, limit: Option<usize>) -> proto::Profile {
    let mut b = Builder::new();
    for (ty, unit) in SAMPLE_TYPES {
        let sample_type = proto::ValueType {
            r#type: b.string(ty),
            unit: b.string(unit),
        };
        b.out.sample_type.push(sample_type);
    }
    for site in ranked(profile, by, limit, true) {
        let location_id = by_address(site.frames)
            .into_iter()
            .map(|frames| b.location(frames))
            .collect();
        b.out.sample.push(proto::Sample {
            location_id,
            value: sample_values(&site.metrics),
            label: Vec::new(),
        });
    }
    let comment = format!("memtrail run -- {}", profile.command.join(" "));
    let comment = b.string(&comment);
    b.out.comment.push(comment);
    b.out.default_sample_type = b.string(sample_type_of(by));
    b.out.duration_nanos = i64::try_from(profile.duration_ns).unwrap_or(i64::MAX);
    b.out
}

pub(super) fn write(
    profile: &Profile,
    by: Metric,
    limit: Option<usize>,
    w: &mut dyn Write,
) -> io::Result<()> {
    let bytes = build(profile, by, limit).encode_to_vec();
    let mut gz = GzEncoder::new(w, Compression::default());
    gz.write_all(&bytes)?;
    gz.finish()?;
    Ok(())
}
