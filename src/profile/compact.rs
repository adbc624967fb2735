//! The profile's `stacks` as written since version 3 (issue 24), and as
//! read from both versions; schema in docs/profile.md ("Allocation
//! stacks").
//!
//! Version 2 wrote every stack with its frames in full: a gcc run's 10,700
//! stacks held 220,000 frames, but only 6,500 distinct ones, naming 1,500
//! functions in 7 modules; the frames were 92 % of its 52 MB. Version 3
//! writes, as pprof's profile.proto does, each string once (`strings`),
//! each module (path and build id: pprof's mapping) and each function (name
//! and source file) once as rows of string ids, each distinct frame once as
//! a row of those ids (`frames`: pprof's location), and each stack
//! (`entries`) as a list of frame ids, its process's executable a string
//! id and only its metrics that are not 0.
//!
//! In memory a stack keeps its frames whole ([`StackEntry::frames`]), their
//! strings shared: a profile read from either version holds each string
//! once.

use std::collections::HashSet;
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use serde::de::{self, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::unwind::StackEnd;
use super::{Frame, StackEntry, StackMetrics, id_string, required};

/// A module: pprof's mapping. `null` ids are unknown (no file, no build id).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct ModuleRow {
    #[serde(deserialize_with = "required")]
    path: Option<u32>,
    #[serde(deserialize_with = "required")]
    build_id: Option<u32>,
}

/// A function: its name and source file, as string ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct FunctionRow {
    #[serde(deserialize_with = "required")]
    name: Option<u32>,
    #[serde(deserialize_with = "required")]
    file: Option<u32>,
}

/// A frame: [`Frame`] with its module and function as row ids (`null` when
/// every field of that row would be).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
struct FrameRow {
    addr: u64,
    #[serde(deserialize_with = "required")]
    module: Option<u32>,
    #[serde(deserialize_with = "required")]
    function: Option<u32>,
    #[serde(deserialize_with = "required")]
    line: Option<u32>,
    inlined: bool,
    #[serde(deserialize_with = "required")]
    offset: Option<u64>,
    /// [`Frame::fp_step`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    fp_step: bool,
}

/// One stack as written.
#[derive(Serialize)]
struct EntryOut {
    #[serde(serialize_with = "id_string::serialize")]
    id: u64,
    pid: u32,
    /// A string id.
    exe: u32,
    /// Frame ids, innermost first.
    frames: Vec<u32>,
    #[serde(skip_serializing_if = "StackEnd::is_complete")]
    end: StackEnd,
    /// The metrics that are not 0 (not their default).
    #[serde(flatten)]
    metrics: NonZero,
}

/// The compact `stacks`, as written.
#[derive(Serialize)]
struct TablesOut<'a> {
    strings: Vec<&'a str>,
    modules: Vec<ModuleRow>,
    functions: Vec<FunctionRow>,
    frames: Vec<FrameRow>,
    entries: Vec<EntryOut>,
}

/// Rows numbered in order of first use.
struct Interner<K> {
    ids: foldhash::HashMap<K, u32>,
    rows: Vec<K>,
}

impl<K: Copy + Eq + Hash> Interner<K> {
    fn new() -> Self {
        Self {
            ids: Default::default(),
            rows: Vec::new(),
        }
    }

    fn id(&mut self, key: K) -> u32 {
        let next = self.rows.len() as u32;
        *self.ids.entry(key).or_insert_with(|| {
            self.rows.push(key);
            next
        })
    }
}

/// The tables being built, and the frame ids of stacks.
struct Builder<'a> {
    strings: Interner<&'a str>,
    /// String ids by the address of a shared string: a stack's frames share
    /// their strings with other stacks' (a node capture's 8,700 stacks hold
    /// 260,000 frames naming 2,000 strings), so most fields cost a hash of
    /// one word, not of their bytes.
    shared: foldhash::HashMap<*const u8, u32>,
    /// Frame ids by the frame's fields, its strings by address.
    shared_frames: foldhash::HashMap<SharedFrame, u32>,
    /// Frame ids by the frame's address: stacks share their frames (a g++
    /// capture's 1.1 M frames are those of 9,200 addresses; Python frames
    /// are shared by code object and offset), so most cost a hash of one
    /// word; one a stack has alone (a pseudo-site's, an address in no
    /// known file) is looked up by its fields.
    by_address: foldhash::HashMap<*const Frame, u32>,
    modules: Interner<ModuleRow>,
    functions: Interner<FunctionRow>,
    frames: Interner<FrameRow>,
}

/// A [`Frame`] whose strings are known by their address (borrowed while
/// the tables are built: equal addresses are equal strings).
#[derive(PartialEq, Eq, Hash)]
struct SharedFrame {
    addr: u64,
    strings: [Option<*const u8>; 4],
    line: Option<u32>,
    inlined: bool,
    offset: Option<u64>,
    fp_step: bool,
}

impl<'a> Builder<'a> {
    fn string(&mut self, s: &'a Option<Arc<str>>) -> Option<u32> {
        let s = s.as_ref()?;
        // Borrowed for 'a: no other string lives at this address meanwhile.
        let strings = &mut self.strings;
        Some(
            *self
                .shared
                .entry(s.as_ptr())
                .or_insert_with(|| strings.id(s)),
        )
    }

    fn shared_frame(&mut self, f: &'a Arc<Frame>) -> u32 {
        if let Some(&id) = self.by_address.get(&Arc::as_ptr(f)) {
            return id;
        }
        let id = self.frame(f);
        // `f` is borrowed: its address names no other frame meanwhile.
        self.by_address.insert(Arc::as_ptr(f), id);
        id
    }

    fn frame(&mut self, f: &'a Frame) -> u32 {
        // Frames repeat across stacks with the same shared strings: one
        // lookup of the frame, its strings by address, finds most.
        let shared = |s: &Option<Arc<str>>| s.as_ref().map(|s| s.as_ptr());
        let key = SharedFrame {
            addr: f.addr,
            strings: [
                shared(&f.module),
                shared(&f.build_id),
                shared(&f.function),
                shared(&f.file),
            ],
            line: f.line,
            inlined: f.inlined,
            offset: f.offset,
            fp_step: f.fp_step,
        };
        if let Some(&id) = self.shared_frames.get(&key) {
            return id;
        }
        let id = self.frame_row(f);
        self.shared_frames.insert(key, id);
        id
    }

    fn frame_row(&mut self, f: &'a Frame) -> u32 {
        let module = ModuleRow {
            path: self.string(&f.module),
            build_id: self.string(&f.build_id),
        };
        let function = FunctionRow {
            name: self.string(&f.function),
            file: self.string(&f.file),
        };
        let row = FrameRow {
            addr: f.addr,
            module: (module.path.is_some() || module.build_id.is_some())
                .then(|| self.modules.id(module)),
            function: (function.name.is_some() || function.file.is_some())
                .then(|| self.functions.id(function)),
            line: f.line,
            inlined: f.inlined,
            offset: f.offset,
            fp_step: f.fp_step,
        };
        self.frames.id(row)
    }
}

/// The metrics that are not 0 (their default), by name, as a JSON
/// object's entries; the same names and values as serde's derive writes
/// (`nonzero_same_as_derived` below), without a JSON value per metric.
struct NonZero(Vec<(&'static str, u64)>);

impl NonZero {
    fn of(m: &StackMetrics) -> Self {
        // Every field named: a metric added to StackMetrics fails to build
        // here until it is written.
        let StackMetrics {
            allocations,
            bytes,
            live_bytes_at_peak,
            live_allocations_at_peak,
            live_bytes_at_exit,
            live_allocations_at_exit,
            temporary_allocations,
            mmaps,
            mapped_bytes,
            reserved_bytes,
            reserved_bytes_at_exit,
            mapped_bytes_at_peak,
            mapped_bytes_at_exit,
            brk_bytes,
        } = *m;
        let all = [
            ("allocations", allocations),
            ("bytes", bytes),
            ("live_bytes_at_peak", live_bytes_at_peak),
            ("live_allocations_at_peak", live_allocations_at_peak),
            ("live_bytes_at_exit", live_bytes_at_exit),
            ("live_allocations_at_exit", live_allocations_at_exit),
            ("temporary_allocations", temporary_allocations),
            ("mmaps", mmaps),
            ("mapped_bytes", mapped_bytes),
            ("reserved_bytes", reserved_bytes),
            ("reserved_bytes_at_exit", reserved_bytes_at_exit),
            ("mapped_bytes_at_peak", mapped_bytes_at_peak),
            ("mapped_bytes_at_exit", mapped_bytes_at_exit),
            ("brk_bytes", brk_bytes),
        ];
        Self(all.into_iter().filter(|&(_, v)| v != 0).collect())
    }
}

impl Serialize for NonZero {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_map(self.0.iter().copied())
    }
}

/// Writes `stacks` compact (see the module docs).
pub fn serialize<S: Serializer>(stacks: &[StackEntry], s: S) -> Result<S::Ok, S::Error> {
    let mut b = Builder {
        strings: Interner::new(),
        shared: Default::default(),
        shared_frames: Default::default(),
        by_address: Default::default(),
        modules: Interner::new(),
        functions: Interner::new(),
        frames: Interner::new(),
    };
    let mut entries = Vec::with_capacity(stacks.len());
    for st in stacks {
        entries.push(EntryOut {
            id: st.id,
            pid: st.pid,
            exe: b.strings.id(&st.exe),
            frames: st.frames.iter().map(|f| b.shared_frame(f)).collect(),
            end: st.end,
            metrics: NonZero::of(&st.metrics),
        });
    }
    TablesOut {
        strings: b.strings.rows,
        modules: b.modules.rows,
        functions: b.functions.rows,
        frames: b.frames.rows,
        entries,
    }
    .serialize(s)
}

/// The most rows a table of the compact `stacks` may have (strings,
/// modules, functions, frames, stacks): 2^22 (4.2 M; a gcc capture has
/// 10,700 stacks and 6,500 frames). Memory reading a profile follows its
/// bytes, but a row of a few bytes can cost tens in memory: the caps bound
/// what a document, compressed or not, can make a reader allocate
/// (issue 40).
pub const MAX_TABLE_ROWS: usize = 1 << 22;

/// The most frames one stack may have: 2^16 (a capture's stacks have at
/// most 128 native frames, each a few inlined and Python frames).
pub const MAX_STACK_FRAMES: usize = 1 << 16;

/// The most frames the stacks of a profile may have in all: 2^24 (16.8 M;
/// a g++ capture's 9,200 stacks have 1.1 M). An id of two bytes in the
/// document is a word in memory: issue 40's 91 KB file of 1 GB of frame
/// ids took over 4 GB.
pub const MAX_FRAME_REFS: usize = 1 << 24;

/// One stack as read from the compact form.
struct EntryIn {
    id: u64,
    pid: u32,
    exe: u32,
    /// Its frame ids, in [`EntriesIn::ids`].
    frames: std::ops::Range<usize>,
    end: StackEnd,
    metrics: StackMetrics,
}

/// Metric `name` of `m`, if it is one.
fn metric<'m>(m: &'m mut StackMetrics, name: &str) -> Option<&'m mut u64> {
    Some(match name {
        "allocations" => &mut m.allocations,
        "bytes" => &mut m.bytes,
        "live_bytes_at_peak" => &mut m.live_bytes_at_peak,
        "live_allocations_at_peak" => &mut m.live_allocations_at_peak,
        "live_bytes_at_exit" => &mut m.live_bytes_at_exit,
        "live_allocations_at_exit" => &mut m.live_allocations_at_exit,
        "temporary_allocations" => &mut m.temporary_allocations,
        "mmaps" => &mut m.mmaps,
        "mapped_bytes" => &mut m.mapped_bytes,
        "reserved_bytes" => &mut m.reserved_bytes,
        "reserved_bytes_at_exit" => &mut m.reserved_bytes_at_exit,
        "mapped_bytes_at_peak" => &mut m.mapped_bytes_at_peak,
        "mapped_bytes_at_exit" => &mut m.mapped_bytes_at_exit,
        "brk_bytes" => &mut m.brk_bytes,
        _ => return None,
    })
}

/// A stack's frame ids, at most [`MAX_STACK_FRAMES`], appended to the
/// ids of the stacks read before it (one list for all: not an allocation
/// per stack); where they are in it.
struct FrameIds<'a>(&'a mut Vec<u32>);

impl<'de> de::DeserializeSeed<'de> for FrameIds<'_> {
    type Value = std::ops::Range<usize>;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for FrameIds<'_> {
    type Value = std::ops::Range<usize>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of at most {MAX_STACK_FRAMES} frames in a stack")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let start = self.0.len();
        while let Some(id) = seq.next_element()? {
            if self.0.len() - start == MAX_STACK_FRAMES {
                return Err(de::Error::custom(format!(
                    "more than {MAX_STACK_FRAMES} frames in a stack (a memtrail profile has far \
                     fewer)"
                )));
            }
            self.0.push(id);
        }
        Ok(start..self.0.len())
    }
}

/// A key of a stack, copied into the key itself (no allocation): keys of
/// up to 32 bytes (memtrail's longest has 24); a longer one, no key
/// memtrail knows, reads as "".
struct EntryKey {
    bytes: [u8; 32],
    len: usize,
}

impl EntryKey {
    fn as_str(&self) -> &str {
        std::str::from_utf8(&self.bytes[..self.len]).unwrap_or("")
    }
}

impl<'de> Deserialize<'de> for EntryKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Key;
        impl Visitor<'_> for Key {
            type Value = EntryKey;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: de::Error>(self, key: &str) -> Result<EntryKey, E> {
                let mut k = EntryKey {
                    bytes: [0; 32],
                    len: 0,
                };
                if let Some(to) = k.bytes.get_mut(..key.len()) {
                    to.copy_from_slice(key.as_bytes());
                    k.len = key.len();
                }
                Ok(k)
            }
        }
        d.deserialize_identifier(Key)
    }
}

/// Reads an [`EntryIn`] key by key: its metrics are its other keys (those
/// not 0), read as numbers; a key it does not know is skipped unread.
struct EntryVisitor<'a>(&'a mut Vec<u32>);

impl<'de> Visitor<'de> for EntryVisitor<'_> {
    type Value = EntryIn;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a stack (an object)")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<EntryIn, A::Error> {
        let (mut id, mut pid, mut exe, mut frames) = (None, None, None, None);
        let mut end = StackEnd::default();
        let mut metrics = StackMetrics::default();
        // Keys read in place (a profile's ~12,000 stacks have ~7 each).
        while let Some(key) = map.next_key::<EntryKey>()? {
            match key.as_str() {
                "id" => id = Some(map.next_value_seed(IdString)?),
                "pid" => pid = Some(map.next_value()?),
                "exe" => exe = Some(map.next_value()?),
                "frames" => frames = Some(map.next_value_seed(FrameIds(&mut *self.0))?),
                "end" => end = map.next_value()?,
                name => match metric(&mut metrics, name) {
                    Some(v) => *v = map.next_value()?,
                    None => {
                        map.next_value::<de::IgnoredAny>()?;
                    }
                },
            }
        }
        Ok(EntryIn {
            id: id.ok_or_else(|| de::Error::missing_field("id"))?,
            pid: pid.ok_or_else(|| de::Error::missing_field("pid"))?,
            exe: exe.ok_or_else(|| de::Error::missing_field("exe"))?,
            frames: frames.ok_or_else(|| de::Error::missing_field("frames"))?,
            end,
            metrics,
        })
    }
}

impl<'de> de::DeserializeSeed<'de> for EntryVisitor<'_> {
    type Value = EntryIn;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<EntryIn, D::Error> {
        d.deserialize_map(self)
    }
}

/// A stack id, as [`id_string`] reads it.
struct IdString;

impl<'de> de::DeserializeSeed<'de> for IdString {
    type Value = u64;

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<u64, D::Error> {
        id_string::deserialize(d)
    }
}

/// A list of at most `max` elements, refused as soon as it has more (not
/// once it is read whole).
struct Bounded<T> {
    max: usize,
    /// What the elements are, for the message.
    what: &'static str,
    _t: std::marker::PhantomData<T>,
}

impl<T> Bounded<T> {
    fn new(max: usize, what: &'static str) -> Self {
        Self {
            max,
            what,
            _t: std::marker::PhantomData,
        }
    }
}

impl<'de, T: Deserialize<'de>> Visitor<'de> for Bounded<T> {
    type Value = Vec<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "a list of at most {} {}", self.max, self.what)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<T>, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element()? {
            if out.len() == self.max {
                return Err(de::Error::custom(format!(
                    "more than {} {} (a memtrail profile has far fewer)",
                    self.max, self.what
                )));
            }
            out.push(v);
        }
        Ok(out)
    }
}

/// A table of at most [`MAX_TABLE_ROWS`] rows.
fn rows<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    d.deserialize_seq(Bounded::new(MAX_TABLE_ROWS, "rows in a table of stacks"))
}

/// The stacks, at most [`MAX_TABLE_ROWS`], with at most
/// [`MAX_FRAME_REFS`] frames in all.
fn entries<'de, D: Deserializer<'de>>(d: D) -> Result<EntriesIn, D::Error> {
    struct Entries;
    impl<'de> Visitor<'de> for Entries {
        type Value = EntriesIn;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a list of stacks")
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<EntriesIn, A::Error> {
            let mut out = Vec::new();
            let mut ids = Vec::new();
            while let Some(e) = seq.next_element_seed(EntryVisitor(&mut ids))? {
                if out.len() == MAX_TABLE_ROWS || ids.len() > MAX_FRAME_REFS {
                    return Err(de::Error::custom(format!(
                        "more than {MAX_TABLE_ROWS} stacks or {MAX_FRAME_REFS} frames in all \
                         (a memtrail profile has far fewer)"
                    )));
                }
                out.push(e);
            }
            Ok(EntriesIn { list: out, ids })
        }
    }
    d.deserialize_seq(Entries)
}

/// The stacks as read, and the frame ids of them all.
#[derive(Default)]
struct EntriesIn {
    list: Vec<EntryIn>,
    ids: Vec<u32>,
}

/// The compact `stacks`, as read.
#[derive(Deserialize)]
struct TablesIn {
    #[serde(deserialize_with = "rows")]
    strings: Vec<Arc<str>>,
    #[serde(deserialize_with = "rows")]
    modules: Vec<ModuleRow>,
    #[serde(deserialize_with = "rows")]
    functions: Vec<FunctionRow>,
    #[serde(deserialize_with = "rows")]
    frames: Vec<FrameRow>,
    #[serde(deserialize_with = "entries")]
    entries: EntriesIn,
}

/// Row `id` of the table `what`, or the error naming it.
fn row<'t, T>(table: &'t [T], id: u32, what: &str) -> Result<&'t T, String> {
    table.get(id as usize).ok_or_else(|| {
        format!(
            "stacks: {what} {id} is not in the table (it has {} rows)",
            table.len()
        )
    })
}

impl TablesIn {
    fn string(&self, id: Option<u32>) -> Result<Option<Arc<str>>, String> {
        id.map(|id| row(&self.strings, id, "string").cloned())
            .transpose()
    }

    /// Every frame row as a [`Frame`], for the stacks to share.
    fn frames(&self) -> Result<Vec<Arc<Frame>>, String> {
        self.frames
            .iter()
            .map(|f| {
                let module = match f.module {
                    Some(id) => *row(&self.modules, id, "module")?,
                    None => ModuleRow {
                        path: None,
                        build_id: None,
                    },
                };
                let function = match f.function {
                    Some(id) => *row(&self.functions, id, "function")?,
                    None => FunctionRow {
                        name: None,
                        file: None,
                    },
                };
                Ok(Arc::new(Frame {
                    addr: f.addr,
                    module: self.string(module.path)?,
                    function: self.string(function.name)?,
                    file: self.string(function.file)?,
                    line: f.line,
                    inlined: f.inlined,
                    build_id: self.string(module.build_id)?,
                    offset: f.offset,
                    fp_step: f.fp_step,
                }))
            })
            .collect()
    }

    /// The stacks, their frames resolved.
    fn resolve(mut self) -> Result<Vec<StackEntry>, String> {
        let frames = self.frames()?;
        let EntriesIn { list, ids } = std::mem::take(&mut self.entries);
        let mut stacks = Vec::with_capacity(list.len());
        for e in list {
            let of_stack = ids.get(e.frames.clone()).unwrap_or_default();
            stacks.push(StackEntry {
                id: e.id,
                pid: e.pid,
                exe: Arc::clone(row(&self.strings, e.exe, "string")?),
                frames: {
                    let mut stack = Vec::with_capacity(of_stack.len());
                    for &id in of_stack {
                        stack.push(row(&frames, id, "frame")?.clone());
                    }
                    stack
                },
                end: e.end,
                metrics: e.metrics,
            });
        }
        Ok(stacks)
    }
}

/// Shares equal strings of the frames read from a version 2 document.
#[derive(Default)]
struct Strings(HashSet<Arc<str>>);

impl Strings {
    fn share(&mut self, s: &mut Option<Arc<str>>) {
        if let Some(new) = s.take() {
            *s = Some(match self.0.get(&*new) {
                Some(known) => Arc::clone(known),
                None => {
                    self.0.insert(Arc::clone(&new));
                    new
                }
            });
        }
    }

    fn share_frames(&mut self, frames: &mut [Arc<Frame>]) {
        for f in frames {
            let f = Arc::make_mut(f);
            self.share(&mut f.module);
            self.share(&mut f.function);
            self.share(&mut f.file);
            self.share(&mut f.build_id);
        }
    }
}

/// Reads either form of `stacks`.
struct StacksVisitor;

impl<'de> Visitor<'de> for StacksVisitor {
    type Value = Vec<StackEntry>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("the stacks: their tables (version 3) or a list of stacks (version 2)")
    }

    /// Version 2: every stack with its frames; their strings are shared
    /// as each stack is read, so memory follows the distinct strings.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut strings = Strings::default();
        let mut stacks = Vec::new();
        let mut frames = 0usize;
        while let Some(mut stack) = seq.next_element::<StackEntry>()? {
            frames += stack.frames.len();
            if stacks.len() == MAX_TABLE_ROWS || frames > MAX_FRAME_REFS {
                return Err(de::Error::custom(format!(
                    "more than {MAX_TABLE_ROWS} stacks or {MAX_FRAME_REFS} frames in all \
                     (a memtrail profile has far fewer)"
                )));
            }
            strings.share_frames(&mut stack.frames);
            stacks.push(stack);
        }
        Ok(stacks)
    }

    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Self::Value, A::Error> {
        TablesIn::deserialize(de::value::MapAccessDeserializer::new(map))?
            .resolve()
            .map_err(de::Error::custom)
    }
}

/// Reads `stacks` in either form (see the module docs).
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<StackEntry>, D::Error> {
    d.deserialize_any(StacksVisitor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value};

    /// NonZero writes what the derived Serialize writes, less the zeros.
    #[test]
    fn nonzero_same_as_derived() {
        let Ok(Value::Object(names)) = serde_json::to_value(StackMetrics::default()) else {
            panic!("metrics are an object");
        };
        let mut m = Map::new();
        for (i, name) in names.keys().enumerate() {
            m.insert(name.clone(), Value::from(i as u64 + 1));
        }
        let all: StackMetrics = serde_json::from_value(Value::Object(m.clone())).unwrap();
        let written = serde_json::to_value(NonZero::of(&all)).unwrap();
        assert_eq!(written, Value::Object(m.clone()));
        m.retain(|_, v| v.as_u64().is_some_and(|v| v % 2 == 0));
        let mut with_zeros = names.clone();
        with_zeros.extend(m.clone());
        let some: StackMetrics = serde_json::from_value(Value::Object(with_zeros)).unwrap();
        assert_eq!(
            serde_json::to_value(NonZero::of(&some)).unwrap(),
            Value::Object(m)
        );
        let none = serde_json::to_value(NonZero::of(&StackMetrics::default())).unwrap();
        assert_eq!(none, Value::Object(Map::new()));
    }

    /// The compact reader knows every metric the writer writes, each as
    /// its own field.
    #[test]
    fn metric_names_all_read() {
        let Ok(Value::Object(names)) = serde_json::to_value(StackMetrics::default()) else {
            panic!("metrics are an object");
        };
        let mut m = StackMetrics::default();
        for (i, name) in names.keys().enumerate() {
            *metric(&mut m, name).expect("known metric") = i as u64 + 1;
        }
        let back = serde_json::to_value(m).unwrap();
        for (i, name) in names.keys().enumerate() {
            assert_eq!(back[name], i as u64 + 1, "{name}");
        }
        assert!(metric(&mut m, "frames").is_none());
    }
}
