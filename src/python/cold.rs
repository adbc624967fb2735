//! The split-off parts of the interpreter loop (`_PyEval_EvalFrameDefault.cold`)
//! in an image whose symbol table is stripped (issue 25).
//!
//! GCC moves the unlikely paths of a function into a part of its own in
//! `.text.unlikely`, with an FDE of its own and, in a full symbol table, a
//! local symbol `NAME.cold`. A distribution's stripped interpreter (Debian's
//! python3.11) keeps only the dynamic symbols: an address in the loop's
//! cold part is then named after no function, or after the exported one
//! before it, and its Python frames had no loop frame to replace. The cold
//! part is found by the code: the FDEs the loop's own branches jump into
//! (not to their start only: that is a tail call of another function).

use std::collections::HashMap;
use std::sync::Arc;

/// File offset ranges: [start, end).
type Ranges = Arc<[(u64, u64)]>;

/// File-offset ranges of the interpreter loop's cold parts, by image path
/// (looked up once per symbolized address, `loop_addresses`).
#[derive(Default)]
pub struct ColdParts {
    by_image: HashMap<Arc<str>, Ranges>,
}

impl ColdParts {
    /// The cold parts of the image at `path` (none when it is no
    /// interpreter, or when its symbol table names them).
    pub fn of(&mut self, path: &Arc<str>) -> Ranges {
        self.by_image
            .entry(path.clone())
            .or_insert_with(|| find(std::path::Path::new(&**path)).into())
            .clone()
    }
}

/// The cold parts of the loop in the image at `path`, as file offsets.
fn find(path: &std::path::Path) -> Vec<(u64, u64)> {
    let is_python = path
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.contains("python"));
    if !is_python {
        return Vec::new();
    }
    let Ok(data) = crate::sys::map_file(path) else {
        return Vec::new();
    };
    std::panic::catch_unwind(|| parse(&data)).unwrap_or_default()
}

fn parse(data: &[u8]) -> Vec<(u64, u64)> {
    use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol, SegmentFlags};
    let Ok(file) = object::File::parse(data) else {
        return Vec::new();
    };
    let named = format!("{}.cold", super::EVAL_LOOP);
    if file.symbols().any(|s| s.name() == Ok(named.as_str())) {
        return Vec::new(); // the symbolizer names it
    }
    let Some(eval) = file
        .dynamic_symbols()
        .find(|s| s.is_definition() && s.name() == Ok(super::EVAL_LOOP))
    else {
        return Vec::new();
    };
    let (start, end) = (eval.address(), eval.address() + eval.size());
    let Some(code) = eval
        .section_index()
        .and_then(|i| file.section_by_index(i).ok())
        .and_then(|s| s.data_range(start, eval.size()).ok().flatten())
    else {
        return Vec::new();
    };
    let targets = branch_targets(code, start, end);
    let Some(eh) = file.section_by_name(".eh_frame") else {
        return Vec::new();
    };
    let fdes = fde_ranges(&file, &eh);
    let parts = fdes.into_iter().filter(|&(lo, hi)| {
        (hi <= start || lo >= end) && targets.iter().any(|&t| t > lo && t < hi)
    });
    // Addresses to file offsets, through the executable segment.
    let Some(exec) = file
        .segments()
        .find(|seg| matches!(seg.flags(), SegmentFlags::Elf { p_flags } if p_flags & 1 != 0))
    else {
        return Vec::new();
    };
    let (offset, size) = exec.file_range();
    let base = exec.address();
    parts
        .filter(|&(lo, hi)| lo >= base && hi <= base + size)
        .map(|(lo, hi)| (lo - base + offset, hi - base + offset))
        .collect()
}

/// Where the loop's jumps (not its calls) outside it go.
fn branch_targets(code: &[u8], start: u64, end: u64) -> Vec<u64> {
    use iced_x86::{Decoder, DecoderOptions, FlowControl};
    let mut decoder = Decoder::with_ip(64, code, start, DecoderOptions::NONE);
    let mut targets = Vec::new();
    for insn in &mut decoder {
        if matches!(
            insn.flow_control(),
            FlowControl::UnconditionalBranch | FlowControl::ConditionalBranch
        ) {
            let t = insn.near_branch_target();
            if t != 0 && (t < start || t >= end) {
                targets.push(t);
            }
        }
    }
    targets
}

/// Every FDE's [start, end) in `.eh_frame`.
fn fde_ranges(file: &object::File<'_>, eh: &object::Section<'_, '_>) -> Vec<(u64, u64)> {
    use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
    use object::{Object, ObjectSection};
    let Ok(bytes) = eh.data() else {
        return Vec::new();
    };
    let section = EhFrame::new(bytes, LittleEndian);
    let text = file.section_by_name(".text").map_or(0, |s| s.address());
    let bases = BaseAddresses::default()
        .set_eh_frame(eh.address())
        .set_text(text);
    let mut out = Vec::new();
    let mut entries = section.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        if let CieOrFde::Fde(partial) = entry
            && let Ok(fde) = partial.parse(EhFrame::cie_from_offset)
        {
            out.push((fde.initial_address(), fde.end_address()));
        }
    }
    out
}
