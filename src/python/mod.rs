//! Python functions in stacks (issue 25): CPython 3.11 to 3.13.
//!
//! The BPF walk appends a thread's Python frames to a stack that went
//! through an interpreter's code (`mt_py_walk`): each a code object's
//! address and an instruction offset, in groups, one per run of the
//! interpreter loop (`_PyEval_EvalFrameDefault`), innermost first
//! (`MT_PY_FRAME` in `bpf/memtrail.h`). This module:
//!
//! - recognizes interpreter images (the python executable or libpython:
//!   the one exporting `_PyRuntime`) and gives BPF where `_PyRuntime` is and
//!   the offsets its walk reads ([`Interpreter`], `py_images`): per-version
//!   tables for 3.11 and 3.12, the interpreter's own `_Py_DebugOffsets` for
//!   3.13;
//! - names code objects while their process lives ([`Resolver`]: qualified
//!   name, file, and line from the location table), cached by (process,
//!   address) and checked against a reused address on every use;
//! - splices each group in place of the interpreter-loop frame it stands
//!   for ([`splice`]), native frames above and below kept.
//!
//! What it reads of a process are plain memory reads of /proc/PID/mem: a
//! process that changed or lost its code objects gives unnamed frames,
//! never wrong ones (each name is read with the object it belongs to).
//!
//! Everything here comes from a tracked process, which may be a fake or a
//! corrupted interpreter (issue 40): a layout is taken only if memtrail's
//! readers can read every offset it gives ([`check_layout`]), records and
//! stack words are decoded totally, and what is read or kept of one process
//! is bounded (`code.rs`).

use std::path::Path;
use std::sync::Arc;

use crate::bpf::skel::memtrail::types::mt_py_image;
use crate::profile::Frame;
use crate::symbolize::Places;

mod code;
mod cold;
mod linetable;
mod tls;
pub use code::Resolver;
pub use cold::ColdParts;

/// `MT_PY_FRAME`: a word of a stack record that is a Python frame.
pub const PY_FRAME: u64 = 1 << 63;
const OFF_SHIFT: u32 = 47;
const CODE_MASK: u64 = (1 << OFF_SHIFT) - 1;
/// `MT_PY_NONE`.
const NONE: u16 = 0xffff;

/// The module Python frames name (in place of a file).
pub const MODULE: &str = crate::profile::PYTHON_MODULE;

/// The native function whose frames the Python groups stand for (its
/// `.cold` part included).
const EVAL_LOOP: &str = "_PyEval_EvalFrameDefault";

/// Offsets the BPF walk reads (`struct mt_py_offsets`), in its order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WalkOffsets {
    pub runtime_interp_head: u16,
    pub interp_threads_head: u16,
    pub tstate_next: u16,
    pub tstate_thread_id: u16,
    pub tstate_frame: u16,
    pub cframe_frame: u16,
    pub frame_code: u16,
    pub frame_instr: u16,
    pub frame_previous: u16,
    pub frame_owner: u16,
    pub frame_is_entry: u16,
    pub code_adaptive: u16,
    /// `_PyRuntime.gilstate.tstate_current` (3.11; `NONE` later).
    pub runtime_tstate: u16,
    /// `PyThreadState.datastack_chunk`: the chunk the thread's newest
    /// frames are in (the preload shim reads them there without a check).
    pub tstate_datastack: u16,
}

/// Offsets userspace reads in code and string objects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeOffsets {
    pub filename: u16,
    pub qualname: u16,
    pub firstlineno: u16,
    pub linetable: u16,
    /// `sizeof(PyASCIIObject)`: where a compact ASCII string's characters
    /// start.
    pub ascii_data: u16,
    /// `sizeof(PyCompactUnicodeObject)`.
    pub compact_data: u16,
}

/// A CPython interpreter image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Interpreter {
    /// 3.`minor`.
    pub minor: u8,
    /// `_PyRuntime`'s address minus the address of the image's file
    /// offset 0 in a process (the value BPF adds a mapping's to).
    pub runtime: u64,
    pub walk: WalkOffsets,
    pub code: CodeOffsets,
    /// 3.12+: the `tls_index` of `_Py_tss_tstate` (the thread-local
    /// current thread state), as `runtime`; 0 when not found (the walk
    /// then searches the interpreter's list of threads).
    pub tls_index: u64,
}

/// 3.11's layouts (CPython's `Include/internal` headers, x86_64, the
/// default build: offsetof of each field).
const WALK_3_11: WalkOffsets = WalkOffsets {
    runtime_interp_head: 40,
    interp_threads_head: 16,
    tstate_next: 8,
    tstate_thread_id: 152,
    tstate_frame: 56,
    cframe_frame: 8,
    frame_code: 32,
    frame_instr: 56,
    frame_previous: 48,
    frame_owner: 69,
    frame_is_entry: 68,
    code_adaptive: 184,
    runtime_tstate: 576,
    tstate_datastack: 296,
};
const CODE_3_11: CodeOffsets = CodeOffsets {
    filename: 112,
    qualname: 128,
    firstlineno: 72,
    linetable: 136,
    ascii_data: 48,
    compact_data: 72,
};
pub(crate) const WALK_3_12: WalkOffsets = WalkOffsets {
    runtime_interp_head: 40,
    interp_threads_head: 72,
    tstate_next: 8,
    tstate_thread_id: 136,
    tstate_frame: 56,
    cframe_frame: 0,
    frame_code: 0,
    frame_instr: 56,
    frame_previous: 8,
    frame_owner: 70,
    frame_is_entry: NONE,
    code_adaptive: 192,
    runtime_tstate: NONE,
    tstate_datastack: 232,
};
pub(crate) const CODE_3_12: CodeOffsets = CodeOffsets {
    filename: 112,
    qualname: 128,
    firstlineno: 68,
    linetable: 136,
    ascii_data: 40,
    compact_data: 56,
};

/// What the interpreter image at `path` is, if it is one this module
/// walks: None for other images, and (with a note naming the image) for
/// interpreters it does not know or whose layout it cannot read safely.
pub fn interpreter(path: &Path) -> Option<Interpreter> {
    let name = path.file_name()?.to_str()?;
    if !name.contains("python") {
        return None; // only python executables and libpython export it
    }
    let data = crate::sys::map_file(path).ok()?;
    // The image is a tracked program's: its parse is total (issue 40), and
    // a panic of the ELF reader it uses is caught all the same.
    let why = match std::panic::catch_unwind(|| parse_interpreter(&data)) {
        Ok(Ok(found)) => return found,
        Ok(Err(why)) => why,
        Err(_) => "its ELF headers could not be read".to_owned(),
    };
    tracing::warn!(
        target: crate::profile::NOTE,
        image = %path.display(),
        why,
        "no Python frames in stacks through this interpreter"
    );
    None
}

/// The interpreter an ELF image is: Ok(None) when it exports no
/// `_PyRuntime`, Err(why) for one this module cannot walk (its layout
/// checked: [`check_layout`]).
pub fn parse_interpreter(data: &[u8]) -> Result<Option<Interpreter>, String> {
    use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags};
    let Ok(file) = object::File::parse(data) else {
        return Ok(None);
    };
    let symbol = |name: &str| {
        file.dynamic_symbols()
            .find(|s| s.is_definition() && s.name() == Ok(name))
    };
    let Some(runtime) = symbol("_PyRuntime") else {
        return Ok(None);
    };
    // The bytes of a symbol's initial value in the file.
    let bytes_of = |sym: &object::Symbol<'_, '_>, len: u64| -> Option<&[u8]> {
        let section = file.section_by_index(sym.section_index()?).ok()?;
        section.data_range(sym.address(), len).ok().flatten()
    };
    let version = symbol("Py_Version")
        .and_then(|s| bytes_of(&s, 4))
        .map(|b| u32::from_le_bytes(b.try_into().unwrap_or_default()))
        .ok_or("no Py_Version: CPython before 3.11")?;
    let (major, minor) = (version >> 24, (version >> 16) & 0xff);
    // The executable segment: BPF knows the mapping of its code.
    let exec = file
        .segments()
        .find(|seg| matches!(seg.flags(), SegmentFlags::Elf { p_flags } if p_flags & 1 != 0))
        .ok_or("no executable segment")?;
    let page = |a: u64| a & !0xfff;
    let (offset, _) = exec.file_range();
    let load_delta = page(exec.address()).wrapping_sub(page(offset));
    let (walk, code) = match (major, minor) {
        (3, 11) => (WALK_3_11, CODE_3_11),
        (3, 12) => (WALK_3_12, CODE_3_12),
        (3, 13) => debug_offsets(bytes_of(&runtime, 44 * 8).ok_or("no _Py_DebugOffsets")?)?,
        _ => return Err(format!("CPython {major}.{minor} (3.11 to 3.13 are walked)")),
    };
    check_layout(&walk, &code).map_err(|why| format!("CPython {major}.{minor}: {why}"))?;
    let tls_index = if minor >= 12 {
        tls::index(&file).map_or(0, |at| at.wrapping_sub(load_delta))
    } else {
        0 // 3.11 finds the thread state as the GIL's holder
    };
    Ok(Some(Interpreter {
        minor: minor as u8,
        runtime: runtime.address().wrapping_sub(load_delta),
        walk,
        code,
        tls_index,
    }))
}

/// 3.13's offsets, from the `_Py_DebugOffsets` that starts `_PyRuntime`
/// (its layout in 3.13: 8-byte words, cookie "xdebugpy" first). Any bytes:
/// a word past them reads as an offset out of range.
pub fn debug_offsets(bytes: &[u8]) -> Result<(WalkOffsets, CodeOffsets), String> {
    let word = |i: usize| {
        bytes
            .get(i * 8..i * 8 + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(u64::MAX, u64::from_le_bytes)
    };
    if bytes.get(..8) != Some(b"xdebugpy".as_slice()) {
        return Err("_PyRuntime does not start with _Py_DebugOffsets".to_owned());
    }
    if word(2) != 0 {
        return Err("a free-threaded build".to_owned());
    }
    let at = |i: usize| -> Result<u16, String> {
        u16::try_from(word(i)).map_err(|_| format!("offset {i} out of range"))
    };
    let walk = WalkOffsets {
        runtime_interp_head: at(5)?,
        interp_threads_head: at(9)?,
        tstate_next: at(21)?,
        tstate_thread_id: at(24)?,
        tstate_frame: at(23)?,
        cframe_frame: NONE,
        frame_code: at(30)?,
        frame_instr: at(31)?,
        frame_previous: at(29)?,
        frame_owner: at(33)?,
        frame_is_entry: NONE,
        code_adaptive: at(43)?,
        runtime_tstate: NONE,
        tstate_datastack: at(26)?,
    };
    let code = CodeOffsets {
        filename: at(35)?,
        qualname: at(37)?,
        firstlineno: at(39)?,
        linetable: at(38)?,
        ..CODE_3_12
    };
    Ok((walk, code))
}

/// Records the image at `path` (device and inode `id`) in BPF's
/// `py_images` (`map`) if it is a Python interpreter: walks through its
/// code then find its frames. Before the image's code runs (its process
/// is held), with or without unwind tables. Returns what it recorded.
pub fn note_image(
    map: std::os::fd::BorrowedFd<'_>,
    path: &Path,
    id: crate::sys::FileId,
) -> Option<Interpreter> {
    let interp = interpreter(path)?;
    let key = crate::sys::image_key(id);
    let value = image_value(&interp);
    match crate::sys::bpf_map_update(map, &key, &value) {
        Ok(()) => {
            tracing::debug!(image = %path.display(), minor = interp.minor, "Python interpreter");
            Some(interp)
        }
        Err(err) => {
            tracing::warn!(image = %path.display(), %err, "no Python frames through this interpreter");
            None
        }
    }
}

/// Bytes of one layout of [`shim_layouts`].
pub const SHIM_LAYOUT: usize = 64;

/// The layouts the preload shim walks Python frames with in its process
/// (its ring path, issue 22), one per version: 3.minor (a `u32`), 4 bytes
/// of padding, then `struct mt_py_offsets` as BPF has it (`struct
/// ring_py_layout` in preload/ring.h). The versions whose
/// layout is known without their image: 3.11 and 3.12. (3.13's is read
/// from an image's `_Py_DebugOffsets`: the shim gets it by the image, as
/// [`shim_layout`] makes it, once memtrail has found that image.)
pub fn shim_layouts() -> [[u8; SHIM_LAYOUT]; 4] {
    let mut out = [[0u8; SHIM_LAYOUT]; 4];
    for (slot, (minor, walk, code)) in out.iter_mut().zip(KNOWN) {
        *slot = shim_layout(&Interpreter {
            minor,
            runtime: 0,
            walk,
            code,
            tls_index: 0,
        });
    }
    out
}

/// The versions whose layouts are known without their image.
const KNOWN: [(u8, WalkOffsets, CodeOffsets); 2] =
    [(11, WALK_3_11, CODE_3_11), (12, WALK_3_12, CODE_3_12)];

/// Whether [`shim_layouts`] has 3.`minor`'s layout.
pub fn shim_knows(minor: u8) -> bool {
    KNOWN.iter().any(|k| k.0 == minor)
}

/// `interp`'s layout as [`shim_layouts`] gives them (for an image whose
/// version has none there: the shim then finds it by the image).
pub fn shim_layout(interp: &Interpreter) -> [u8; SHIM_LAYOUT] {
    use crate::bpf::skel::memtrail::types::mt_py_offsets;
    use std::mem::offset_of;
    let mut slot = [0u8; SHIM_LAYOUT];
    let value = image_value(interp);
    let (at, len) = (offset_of!(mt_py_image, off), size_of::<mt_py_offsets>());
    slot[..4].copy_from_slice(&u32::from(interp.minor).to_ne_bytes());
    slot[8..8 + len].copy_from_slice(&value[at..at + len]);
    slot
}

/// `struct mt_py_image` for BPF's `py_images`.
pub fn image_value(interp: &Interpreter) -> [u8; size_of::<mt_py_image>()] {
    use std::mem::offset_of;
    let w = &interp.walk;
    let fields = [
        w.runtime_interp_head,
        w.interp_threads_head,
        w.tstate_next,
        w.tstate_thread_id,
        w.tstate_frame,
        w.cframe_frame,
        w.frame_code,
        w.frame_instr,
        w.frame_previous,
        w.frame_owner,
        w.frame_is_entry,
        w.code_adaptive,
    ];
    let c = &interp.code;
    let fields = fields.into_iter().chain([
        c.qualname,
        c.filename,
        c.firstlineno,
        c.linetable,
        c.ascii_data,
        c.compact_data,
    ]);
    let fields = fields
        .chain(window(w))
        .chain([w.runtime_tstate, w.tstate_datastack]);
    let mut value = [0u8; size_of::<mt_py_image>()];
    let at = offset_of!(mt_py_image, runtime);
    value[at..at + 8].copy_from_slice(&interp.runtime.to_ne_bytes());
    let at = offset_of!(mt_py_image, tls_index);
    value[at..at + 8].copy_from_slice(&interp.tls_index.to_ne_bytes());
    let mut at = offset_of!(mt_py_image, off);
    for f in fields {
        value[at..at + 2].copy_from_slice(&f.to_ne_bytes());
        at += 2;
    }
    value
}

/// The bytes of a frame BPF reads at once (`frame_win`, `frame_span` in
/// `struct mt_py_offsets`): from the first field it reads past the last
/// (the span saturated: [`check_layout`] refuses one past 72).
fn window(w: &WalkOffsets) -> [u16; 2] {
    // (offset, size): three pointers, two flag bytes.
    let fields = [
        (w.frame_code, 8),
        (w.frame_previous, 8),
        (w.frame_instr, 8),
        (w.frame_owner, 1),
        (w.frame_is_entry, 1),
    ];
    let fields = fields.into_iter().filter(|&(f, _)| f != NONE);
    let start = fields.clone().map(|(f, _)| f).min().unwrap_or(0);
    let end = fields
        .map(|(f, size)| u32::from(f) + size)
        .max()
        .unwrap_or(0);
    let span = (end - u32::from(start)).next_multiple_of(8);
    [start, u16::try_from(span).unwrap_or(u16::MAX)]
}

/// Whether the frame's fields fit the bytes BPF reads (72 at most, the
/// pointers 8-aligned from their start).
fn window_fits(w: &WalkOffsets) -> bool {
    let [start, span] = window(w);
    let aligned = |at: u16| at.wrapping_sub(start) % 8 == 0;
    span <= 72 && aligned(w.frame_code) && aligned(w.frame_previous) && aligned(w.frame_instr)
}

/// The largest offset of a field of `_PyRuntime` or an interpreter's state
/// (only BPF reads them, by `bpf_probe_read_user`: any but `NONE`; 3.13's
/// `PyInterpreterState.threads.head` is at 7344).
pub const MAX_RUNTIME_OFFSET: u16 = NONE - 1;
/// The largest offset of a thread state's or a frame's field (CPython's
/// are below 512): the preload shim checks the thread state's bytes up to
/// its last field once, then reads them in place.
pub const MAX_STATE_OFFSET: u16 = 4096;
/// The largest offset of a code object's field (CPython's: below 256): what
/// the reader of a live process reads of a code object at once.
pub const MAX_CODE_OFFSET: u16 = 1024;
/// The largest offset of a string's characters (CPython's: 40 to 72).
pub const MAX_STRING_OFFSET: u16 = 256;

/// Whether memtrail can read what a layout gives (issue 40: a layout read
/// from an image is the tracked program's): every offset memtrail's
/// readers use within their bounds above, the frame's fields in BPF's
/// window. Err names the first field that is not.
pub fn check_layout(w: &WalkOffsets, c: &CodeOffsets) -> Result<(), String> {
    // (name, offset, bound, may be NONE).
    let (runtime, state) = (MAX_RUNTIME_OFFSET, MAX_STATE_OFFSET);
    let (code, string) = (MAX_CODE_OFFSET, MAX_STRING_OFFSET);
    let fields = [
        ("runtime_interp_head", w.runtime_interp_head, runtime, false),
        ("interp_threads_head", w.interp_threads_head, runtime, false),
        ("runtime_tstate", w.runtime_tstate, runtime, true),
        ("tstate_next", w.tstate_next, state, false),
        ("tstate_thread_id", w.tstate_thread_id, state, false),
        ("tstate_frame", w.tstate_frame, state, false),
        ("tstate_datastack", w.tstate_datastack, state, false),
        ("cframe_frame", w.cframe_frame, state, true),
        ("frame_code", w.frame_code, state, false),
        ("frame_instr", w.frame_instr, state, false),
        ("frame_previous", w.frame_previous, state, false),
        ("frame_owner", w.frame_owner, state, false),
        ("frame_is_entry", w.frame_is_entry, state, true),
        ("code_adaptive", w.code_adaptive, code, false),
        ("code_filename", c.filename, code, false),
        ("code_qualname", c.qualname, code, false),
        ("code_firstlineno", c.firstlineno, code, false),
        ("code_linetable", c.linetable, code, false),
        ("str_ascii_data", c.ascii_data, string, false),
        ("str_compact_data", c.compact_data, string, false),
    ];
    for (name, at, bound, optional) in fields {
        if !(at <= bound || optional && at == NONE) {
            return Err(format!("{name} at offset {at}, past {bound}"));
        }
    }
    if !window_fits(w) {
        return Err("a frame layout the walk does not read".to_owned());
    }
    Ok(())
}

/// A Python frame's code object address and instruction offset (in code
/// units), if `word` of a stack record is one; a group's end is
/// `Some((0, 0))`.
pub fn decode(word: u64) -> Option<(u64, u32)> {
    (word & PY_FRAME != 0).then_some((word & CODE_MASK, ((word & !PY_FRAME) >> OFF_SHIFT) as u32))
}

/// Splits a stack record's words into its native frames and its Python
/// groups (raw words, innermost first).
pub fn split(words: &[u64]) -> (Vec<u64>, Vec<Vec<u64>>) {
    let native = words
        .iter()
        .copied()
        .take_while(|w| w & PY_FRAME == 0)
        .collect::<Vec<_>>();
    let mut groups = Vec::new();
    let mut group = Vec::new();
    for &w in &words[native.len()..] {
        match decode(w) {
            Some((0, _)) => groups.push(std::mem::take(&mut group)),
            Some(_) => group.push(w),
            None => break,
        }
    }
    if !group.is_empty() {
        groups.push(group); // cut by the depth: the rest of a run
    }
    (native, groups)
}

/// Whether a symbolized native frame is a run of the interpreter loop.
fn is_eval_loop(f: &Frame) -> bool {
    !f.inlined
        && f.function.as_deref().is_some_and(|name| {
            name.strip_prefix(EVAL_LOOP)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
        })
}

/// The addresses of `places` whose (outer) frame is a run of the
/// interpreter loop. A frame in the loop's cold part that the image's
/// symbols do not name (a stripped interpreter: [`ColdParts`]) is named
/// `_PyEval_EvalFrameDefault.cold` here, and is one.
pub fn loop_addresses(places: &mut Places, cold: &mut ColdParts) -> foldhash::HashSet<u64> {
    let mut loops = foldhash::HashSet::default();
    for (&ip, frames) in &mut places.0 {
        // The function the address's inlined calls were inlined into.
        let Some(f) = frames.last_mut().filter(|f| !f.inlined) else {
            continue;
        };
        if !is_eval_loop(f) {
            let (Some(module), Some(offset)) = (&f.module, f.offset) else {
                continue;
            };
            // Images that are no interpreter have no cold parts (`of` looks
            // at each image once).
            if !cold
                .of(module)
                .iter()
                .any(|&(lo, hi)| offset >= lo && offset < hi)
            {
                continue;
            }
            let f = Arc::make_mut(f);
            f.function = Some(format!("{EVAL_LOOP}.cold").into());
            f.file = None;
            f.line = None;
        }
        loops.insert(ip);
    }
    loops
}

/// A stack's frames: the frames of its addresses `ips` (`places`), the
/// n-th interpreter-loop address's (`loops`) replaced by the n-th of
/// `groups`; a loop frame without a group, or with an empty one (it had not
/// started a Python function yet), stays, with the frames inlined at its
/// address. Groups left over (the native walk ended before their loop
/// frames: frame-pointer steps through an interpreter built without frame
/// pointers) follow the native frames, unless `cut` (the walk stopped at
/// `--stack-depth`, which they would pass). Every frame is shared: the
/// places' and the groups' (the resolver makes a Python frame once).
pub fn splice(
    ips: &[u64],
    places: &Places,
    loops: &foldhash::HashSet<u64>,
    mut groups: Vec<Vec<Arc<Frame>>>,
    cut: bool,
    fp_steps: u128,
) -> Vec<Arc<Frame>> {
    /// What stands for one address.
    enum Part<'a> {
        Frames(&'a [Arc<Frame>]),
        Group(usize),
        Unknown(u64),
    }
    // The groups taken so far: the next is the n-th loop address's.
    let mut taken = 0;
    let parts: Vec<Part<'_>> = ips
        .iter()
        .map(|&ip| {
            if loops.contains(&ip) && taken < groups.len() {
                taken += 1;
                if !groups[taken - 1].is_empty() {
                    return Part::Group(taken - 1);
                }
            }
            places.of(ip).map_or(Part::Unknown(ip), Part::Frames)
        })
        .collect();
    let rest = if cut { groups.len() } else { taken }..groups.len();
    let len = parts
        .iter()
        .map(|part| match part {
            Part::Frames(frames) => frames.len(),
            Part::Group(group) => groups[*group].len(),
            Part::Unknown(_) => 1,
        })
        .sum::<usize>()
        + groups[rest.clone()].iter().map(Vec::len).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    for (n, part) in parts.into_iter().enumerate() {
        let at = out.len();
        match part {
            Part::Frames(frames) => out.extend_from_slice(frames),
            Part::Group(group) => {
                out.append(&mut groups[group]);
                continue;
            }
            Part::Unknown(ip) => out.push(Arc::new(Frame::unknown(ip))),
        }
        // The address's own function (its last frame, after those inlined
        // into it) says its caller came by frame pointer.
        if n < 128 && fp_steps >> n & 1 != 0 && out.len() > at {
            if let Some(last) = out.last_mut() {
                Arc::make_mut(last).fp_step = true;
            }
        }
    }
    for group in &mut groups[rest] {
        out.append(group);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields of the C struct that starts at `start` in `source`, by
    /// name, in order (one declaration a line, `type name;` or
    /// `type name[N];`).
    fn c_fields(source: &str, start: &str) -> Vec<String> {
        let at = source.find(start).expect(start);
        source[at + start.len()..]
            .lines()
            .map(|l| l.split("/*").next().unwrap().trim())
            .take_while(|l| !l.starts_with('}'))
            .filter(|l| l.ends_with(';'))
            .map(|l| {
                let name = l.trim_end_matches(';').split_whitespace().last().unwrap();
                name.split('[').next().unwrap().to_owned()
            })
            .collect()
    }

    /// Check that the preload shim reads the layouts memtrail writes:
    /// its `struct ring_py_layout` (preload/ring.h) is 3.minor, padding,
    /// then bpf/memtrail.h's `struct mt_py_offsets` itself (its size and
    /// offset checked there at build time; the code records it writes are
    /// the header's `struct mt_py_code_record`), and each layout holds
    /// 3.minor and the offsets where the shim reads them.
    #[test]
    fn python_shim_layouts_match_the_shim() {
        let shim = include_str!("../../preload/ring.h");
        let header = include_str!("../../bpf/memtrail.h");
        let offsets = c_fields(header, "struct mt_py_offsets {");
        assert_eq!(offsets.len(), 22);
        let layout = c_fields(shim, "struct ring_py_layout {");
        assert_eq!(layout, ["minor", "_pad", "off", "_size"]);
        assert!(shim.contains("struct mt_py_offsets off;"));
        let layouts = shim_layouts();
        assert_eq!(u32::from_ne_bytes(layouts[0][..4].try_into().unwrap()), 11);
        assert_eq!(u32::from_ne_bytes(layouts[1][..4].try_into().unwrap()), 12);
        assert!(layouts[2..].iter().all(|l| l.iter().all(|&b| b == 0)));
        // tstate_thread_id, the fourth field; runtime_tstate and
        // tstate_datastack, the last two.
        let field = |l: &[u8], i: usize| u16::from_ne_bytes([l[8 + 2 * i], l[9 + 2 * i]]);
        assert_eq!(field(&layouts[0], 3), WALK_3_11.tstate_thread_id);
        assert_eq!(field(&layouts[1], 20), WALK_3_12.runtime_tstate);
        assert_eq!(field(&layouts[0], 21), WALK_3_11.tstate_datastack);
    }

    /// Check that the known layouts pass the layout check, and that a
    /// field past what memtrail reads, a frame field past BPF's window and
    /// offsets near 2^16 (overflowing sums) are refused, never a panic
    /// (issue 40).
    #[test]
    fn python_layout_check_bounds_every_offset() {
        for (_, walk, code) in KNOWN {
            assert_eq!(check_layout(&walk, &code), Ok(()));
        }
        let code = CodeOffsets {
            firstlineno: 4000,
            ..CODE_3_12
        };
        let why = check_layout(&WALK_3_12, &code).unwrap_err();
        assert!(why.contains("code_firstlineno at offset 4000"), "{why}");
        for at in [80, 0xfff0, 0xfffe] {
            let walk = WalkOffsets {
                frame_owner: at,
                ..WALK_3_12
            };
            assert!(check_layout(&walk, &CODE_3_12).is_err(), "{at}");
            assert!(!window_fits(&walk));
        }
        let walk = WalkOffsets {
            frame_code: 0xfff9,
            frame_previous: 0xfff9,
            frame_instr: 0xfff9,
            frame_owner: 0xfffe,
            ..WALK_3_12
        };
        assert!(check_layout(&walk, &CODE_3_12).is_err());
        assert!(debug_offsets(b"xdebugpy").is_err());
        assert!(debug_offsets(b"").is_err());
    }

    fn named(name: &str, addr: u64, inlined: bool) -> Frame {
        Frame {
            function: Some(name.into()),
            inlined,
            ..Frame::unknown(addr)
        }
    }

    #[test]
    fn python_split_groups() {
        let f = |code: u64, off: u64| PY_FRAME | off << OFF_SHIFT | code;
        let words = [
            1,
            2,
            3,
            f(0x1000, 4),
            f(0x2000, 0),
            PY_FRAME,
            f(0x3000, 9),
            PY_FRAME,
        ];
        let (native, groups) = split(&words);
        assert_eq!(native, vec![1, 2, 3]);
        assert_eq!(
            groups,
            vec![vec![f(0x1000, 4), f(0x2000, 0)], vec![f(0x3000, 9)]]
        );
        assert_eq!(decode(f(0x1000, 4)), Some((0x1000, 4)));
        assert_eq!(decode(7), None);
    }

    /// The places of `frames` (each with its address), and the stack of
    /// their addresses in order.
    fn places_of(frames: Vec<Frame>) -> (Places, Vec<u64>) {
        let mut places = Places::default();
        let mut ips = Vec::new();
        for f in frames {
            if ips.last() != Some(&f.addr) {
                ips.push(f.addr);
            }
            places.0.entry(f.addr).or_default().push(Arc::new(f));
        }
        (places, ips)
    }

    /// A group of Python frames, each shared as the resolver makes them.
    fn group(frames: Vec<Frame>) -> Vec<Arc<Frame>> {
        frames.into_iter().map(Arc::new).collect()
    }

    fn names(frames: Vec<Arc<Frame>>) -> Vec<String> {
        frames
            .into_iter()
            .map(|f| f.function.as_deref().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn python_splice_replaces_loop_frames_in_order() {
        let (mut places, mut ips) = places_of(vec![
            named("malloc_caller", 1, false),
            named("inl", 2, true),
            named("_PyEval_EvalFrameDefault", 2, false),
            named("middle", 3, false),
            named("_PyEval_EvalFrameDefault.cold", 4, false),
            named("_PyEval_EvalFrameDefault", 5, false),
            named("main", 6, false),
        ]);
        // An address in no known file, and one the stack has twice.
        ips.insert(1, 7);
        ips.insert(4, 3);
        let groups = vec![
            group(vec![named("g", 0, false), named("f", 0, false)]),
            group(vec![named("m", 0, false)]),
        ];
        let loops = loop_addresses(&mut places, &mut ColdParts::default());
        assert_eq!(loops, [2, 4, 5].into_iter().collect());
        assert_eq!(
            names(splice(&ips, &places, &loops, groups.clone(), false, 0)),
            [
                "malloc_caller",
                "",
                "g",
                "f",
                "middle",
                "middle",
                "m",
                "_PyEval_EvalFrameDefault",
                "main"
            ]
        );
        // An empty group: the loop frame stays, with its inlined calls.
        let groups = vec![vec![], group(vec![named("m", 0, false)])];
        assert_eq!(
            names(splice(&ips, &places, &loops, groups.clone(), false, 0)),
            [
                "malloc_caller",
                "",
                "inl",
                "_PyEval_EvalFrameDefault",
                "middle",
                "middle",
                "m",
                "_PyEval_EvalFrameDefault",
                "main"
            ]
        );
    }

    #[test]
    fn python_splice_appends_groups_without_loop_frames() {
        // A frame-pointer walk that ended in the interpreter: its groups
        // follow the native frames it found.
        let (mut places, ips) = places_of(vec![
            named("malloc_caller", 1, false),
            named("other", 2, false),
        ]);
        let loops = loop_addresses(&mut places, &mut ColdParts::default());
        let groups = vec![
            group(vec![named("g", 0, false)]),
            group(vec![named("m", 0, false)]),
        ];
        assert_eq!(
            names(splice(&ips, &places, &loops, groups.clone(), false, 0)),
            ["malloc_caller", "other", "g", "m"]
        );
        // Cut by --stack-depth: none past it.
        let kept = splice(&ips[..1], &places, &loops, groups, true, 0);
        assert_eq!(names(kept), ["malloc_caller"]);
    }
}
