//! Compiling an image's call frame information into an unwind table.
//!
//! gimli evaluates the CFI programs of every FDE (`.eh_frame`, or
//! `.debug_frame` where that is all the image has) into rows; each row is
//! reduced to what the BPF unwinder evaluates (`struct mt_unwind_row`): the
//! CFA as rsp or rbp plus an offset, or the PLT's expression; where the
//! caller's rbp was saved; the outermost frame; the signal trampoline. A
//! rule outside that is kept as `MT_CFA_UNSUPPORTED`, so the unwinder stops
//! (or takes a frame-pointer step) there instead of guessing. Consecutive
//! rows with the same rule merge; a gap between FDEs gets a `MT_CFA_NONE`
//! row so an address there is not taken for the FDE below it.
//!
//! The image may be anything a tracked program mapped executable, crafted
//! included: [`compile`] is total. Work is bounded by [`CFI_BUDGET`] bytes
//! of CFI evaluated (a CIE's initial instructions run again for each of
//! its FDEs) and memory by [`MAX_SPANS`]; gimli bounds each FDE's rules and
//! remembered states; a panic is caught and becomes an error.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, LittleEndian, Reader, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};
use object::{Object, ObjectSection, ObjectSegment, SegmentFlags};

use super::UnwindError;
use crate::bpf::skel::memtrail::types::{
    mt_unwind_cfa as Cfa, mt_unwind_flags as Flags, mt_unwind_rbp as Rbp, mt_unwind_row,
};

/// An image's compiled table.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Table {
    /// Image address minus file offset, in the executable segment.
    pub bias: i64,
    /// Rows sorted by `pc`.
    pub rows: Vec<Row>,
    /// Which section the rows come from (`.eh_frame`, `.debug_frame`).
    pub source: &'static str,
}

impl Table {
    /// The page index of the rows, once they start at slot `first` of the
    /// tables' slots: for each 4 KiB page from the first row's, the index of the
    /// first row at or above it; then the end of the rows.
    pub fn page_index(&self, first: u32) -> Vec<u32> {
        let (Some(lo), Some(hi)) = (self.rows.first(), self.rows.last()) else {
            return vec![first];
        };
        let base = lo.pc >> 12;
        let npages = (hi.pc >> 12) - base + 1;
        let mut index = Vec::with_capacity(npages as usize + 1);
        let mut at = 0usize;
        for page in 0..npages {
            let start = (base + page) << 12;
            while at < self.rows.len() && self.rows[at].pc < start {
                at += 1;
            }
            index.push(first + at as u32);
        }
        index.push(first + self.rows.len() as u32);
        index
    }
}

/// One row, as BPF reads it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Row {
    pub pc: u32,
    pub cfa_off: i16,
    /// `enum mt_unwind_cfa | enum mt_unwind_rbp << 4`, with the flags of
    /// `enum mt_unwind_flags`.
    pub kind: u8,
    pub rbp_off: i8,
}

impl Row {
    pub const SIZE: usize = size_of::<mt_unwind_row>();

    fn rule(cfa: Cfa, cfa_off: i16, rbp: Rbp, rbp_off: i8) -> Row {
        Row {
            pc: 0,
            cfa_off,
            kind: cfa.0 as u8 | (rbp.0 as u8) << 4,
            rbp_off,
        }
    }

    pub fn cfa(&self) -> Cfa {
        Cfa(u32::from(self.kind & 0xf))
    }

    fn same_rule(&self, other: &Row) -> bool {
        (self.cfa_off, self.kind, self.rbp_off) == (other.cfa_off, other.kind, other.rbp_off)
    }

    /// Writes the row in the map's layout (`struct mt_unwind_row`) into
    /// `out`, [`Row::SIZE`] bytes.
    pub fn encode(&self, out: &mut [u8]) {
        use std::mem::offset_of;
        let mut put = |at: usize, bytes: &[u8]| out[at..at + bytes.len()].copy_from_slice(bytes);
        put(offset_of!(mt_unwind_row, pc), &self.pc.to_ne_bytes());
        put(
            offset_of!(mt_unwind_row, cfa_off),
            &self.cfa_off.to_ne_bytes(),
        );
        put(offset_of!(mt_unwind_row, kind), &[self.kind]);
        put(
            offset_of!(mt_unwind_row, rbp_off),
            &self.rbp_off.to_ne_bytes(),
        );
    }
}

/// What an image has to unwind from.
pub enum Compiled {
    Table(Table),
    /// Neither `.eh_frame` nor `.debug_frame` (a stripped image).
    NoCfi,
    /// No call frame information, and no code of its own: a shared library
    /// (no program interpreter) that exports no function and has less than
    /// [`NO_CODE`] bytes executable, its C runtime's glue (a data-only
    /// library: ICU's `libicudata`, 261 bytes), which no allocation's
    /// stack goes through.
    NoCode,
}

/// Executable bytes under which a library without call frame information
/// or exported functions has no code of its own ([`Compiled::NoCode`]).
pub const NO_CODE: u64 = 4096;

/// Whether the image in `file` is a library with no code of its own (see
/// [`Compiled::NoCode`]).
fn no_code(file: &object::File<'_>) -> bool {
    use object::{ObjectSymbol, SymbolKind};
    let code: u64 = file
        .segments()
        .filter(|seg| matches!(seg.flags(), SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0))
        .map(|seg| seg.size())
        .sum();
    let program =
        file.kind() == object::ObjectKind::Executable || file.section_by_name(".interp").is_some();
    let exports = file
        .dynamic_symbols()
        .any(|s| s.kind() == SymbolKind::Text && s.is_definition());
    !program && !exports && code < NO_CODE
}

const PF_X: u32 = 1;

/// In a row's kind: `cfa_off` counts 8-byte words (`MT_CFA_OFF_X8`, for
/// frames of more than 32 KiB).
pub const CFA_OFF_X8: u8 = 0x40;

/// The most CFI bytes evaluated for one image, counting each FDE with its
/// CIE (whose initial instructions run again for each FDE): libc's
/// `.eh_frame` takes ~0.3 MB of it, a crafted CIE of megabytes shared by
/// thousands of FDEs would take hours without the bound.
pub const CFI_BUDGET: u64 = 256 << 20;

/// The most rows (before merging) compiled for one image: 4 Mi spans,
/// 96 MiB while compiling (libclang-cpp, the largest image at hand, has
/// 1.35 M rows once merged).
pub const MAX_SPANS: usize = 1 << 22;

/// Compiles the unwind table of the ELF image in `data` (an x86-64 ELF
/// image, else an error).
pub fn compile(data: &[u8]) -> Result<Compiled, UnwindError> {
    let caught = std::panic::catch_unwind(|| compile_image(data));
    caught.unwrap_or_else(|panic| {
        Err(UnwindError::Parse(format!(
            "parser panicked: {}",
            crate::sys::panic_text(&*panic)
        )))
    })
}

fn compile_image(data: &[u8]) -> Result<Compiled, UnwindError> {
    let parse = |e: &dyn std::fmt::Display| UnwindError::Parse(e.to_string());
    if !data.starts_with(b"\x7fELF") {
        return Err(UnwindError::Parse("not an ELF image".into()));
    }
    let file = object::File::parse(data).map_err(|e| parse(&e))?;
    if file.architecture() != object::Architecture::X86_64 || !file.is_64() {
        return Err(UnwindError::Parse("not an x86-64 image".into()));
    }
    let exec = file.segments().find(|seg| match seg.flags() {
        SegmentFlags::Elf { p_flags } => p_flags & PF_X != 0,
        _ => false,
    });
    let no_cfi = if no_code(&file) {
        Compiled::NoCode
    } else {
        Compiled::NoCfi
    };
    let Some(exec) = exec else {
        return Ok(no_cfi);
    };
    // Wrapping: the headers' numbers are the file's, whatever they are.
    let bias = (exec.address() as i64).wrapping_sub(exec.file_range().0 as i64);
    let addr_of = |name: &str| file.section_by_name(name).map_or(0, |s| s.address());
    let mut spans: Vec<(u64, u64, Row)> = Vec::new();
    let source;
    if let Some(section) = file.section_by_name(".eh_frame") {
        let bytes = section.data().map_err(|e| parse(&e))?;
        let eh = EhFrame::new(bytes, LittleEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame(section.address())
            .set_text(addr_of(".text"))
            .set_got(addr_of(".got"));
        collect(&eh, &bases, &mut spans)?;
        source = ".eh_frame";
    } else if let Some(section) = file.section_by_name(".debug_frame").filter(|s| {
        s.compressed_file_range()
            .is_ok_and(|r| r.format == object::CompressionFormat::None)
    }) {
        let bytes = section.data().map_err(|e| parse(&e))?;
        let mut debug = DebugFrame::new(bytes, LittleEndian);
        debug.set_address_size(8);
        collect(&debug, &BaseAddresses::default(), &mut spans)?;
        source = ".debug_frame";
    } else {
        return Ok(no_cfi);
    }
    if spans.is_empty() {
        return Ok(no_cfi);
    }
    mark_alloc_wrappers(&file, &mut spans);
    to_first_segment_bias(&file, bias, &mut spans);
    spans.sort_by_key(|&(start, end, _)| (start, end));
    if spans.iter().any(|&(_, end, _)| end > u64::from(u32::MAX)) {
        return Err(UnwindError::Parse(
            "code above 4 GiB (table rows hold 32-bit addresses)".into(),
        ));
    }
    Ok(Compiled::Table(Table {
        bias,
        rows: merge(&spans),
        source,
    }))
}

/// Moves the spans of code in an executable segment whose bias (address
/// minus file offset) is not `bias`, the first executable segment's, to
/// where BPF looks for them: BPF finds a frame's row at its file offset
/// plus the image's one bias. An image with two executable segments (hot
/// code laid out apart, 2 MiB aligned: rustc's libLLVM and
/// librustc_driver, issue 41) had its second segment's frames looked up
/// 4 KiB off, under another function's rules.
fn to_first_segment_bias(file: &object::File<'_>, bias: i64, spans: &mut [(u64, u64, Row)]) {
    let segments: Vec<(u64, u64, i64)> = file
        .segments()
        .filter(|seg| matches!(seg.flags(), SegmentFlags::Elf { p_flags } if p_flags & PF_X != 0))
        .map(|seg| {
            let seg_bias = (seg.address() as i64).wrapping_sub(seg.file_range().0 as i64);
            (
                seg.address(),
                seg.address().saturating_add(seg.size()),
                seg_bias,
            )
        })
        .filter(|&(_, _, seg_bias)| seg_bias != bias)
        .collect();
    if segments.is_empty() {
        return;
    }
    for (start, end, _) in spans.iter_mut() {
        if let Some(&(_, _, seg_bias)) = segments
            .iter()
            .find(|&&(lo, hi, _)| (lo..hi).contains(start))
        {
            let delta = bias.wrapping_sub(seg_bias) as u64;
            *start = start.wrapping_add(delta);
            *end = end.wrapping_add(delta);
        }
    }
}

/// The C++ `operator new` variants (libstdc++ and libc++ share the Itanium
/// names): their rows are flagged here, and `attach` probes the same names.
pub const OPERATOR_NEW: [&str; 8] = [
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t",
];

/// Flags the spans of C++ `operator new` (`MT_ROW_ALLOC_WRAPPER`) in an
/// image that has no allocator of its own (no `malloc`: libstdc++,
/// libc++), whose `operator new` only calls malloc and gets no probe
/// (issue 22): BPF starts a stack walked from malloc's entry at new's
/// caller, as a probe on new did.
fn mark_alloc_wrappers(file: &object::File<'_>, spans: &mut [(u64, u64, Row)]) {
    use object::ObjectSymbol;
    let news: Vec<String> = OPERATOR_NEW.iter().map(|n| (*n).to_owned()).collect();
    let mut ranges = Vec::new();
    for sym in file.dynamic_symbols().chain(file.symbols()) {
        if !sym.is_definition() || sym.kind() != object::SymbolKind::Text {
            continue;
        }
        match sym.name_bytes() {
            Ok(b"malloc") => return,
            Ok(name) if news.iter().any(|n| n.as_bytes() == name) && sym.size() > 0 => {
                ranges.push((sym.address(), sym.address().saturating_add(sym.size())));
            }
            _ => {}
        }
    }
    let flag = Flags::MT_ROW_ALLOC_WRAPPER.0 as u8;
    for (start, end, row) in spans.iter_mut() {
        if ranges.iter().any(|&(lo, hi)| *start >= lo && *end <= hi) {
            row.kind |= flag;
        }
    }
}

/// Sorted spans into rows: a row per change of rule, a `NONE` row where a
/// gap between spans starts.
fn merge(spans: &[(u64, u64, Row)]) -> Vec<Row> {
    let none = Row::rule(Cfa::MT_CFA_NONE, 0, Rbp::MT_RBP_SAME, 0);
    let mut rows: Vec<Row> = Vec::with_capacity(spans.len());
    let mut covered_to = 0u64;
    for &(start, end, rule) in spans {
        if start >= end || end <= covered_to {
            continue; // empty, or inside a span already taken
        }
        let start = start.max(covered_to);
        if covered_to != 0 && start > covered_to {
            push(&mut rows, covered_to, none);
        }
        push(&mut rows, start, rule);
        covered_to = end;
    }
    if covered_to != 0 {
        push(&mut rows, covered_to, none);
    }
    rows
}

fn push(rows: &mut Vec<Row>, pc: u64, rule: Row) {
    let pc = pc as u32;
    if let Some(last) = rows.last_mut() {
        if last.same_rule(&rule) {
            return;
        }
        if last.pc == pc {
            *last = Row { pc, ..rule };
            return;
        }
    }
    rows.push(Row { pc, ..rule });
}

/// Every row of every FDE of `section`, as (start, end, rule), within
/// [`CFI_BUDGET`] and [`MAX_SPANS`].
fn collect<'a, S>(
    section: &S,
    bases: &BaseAddresses,
    spans: &mut Vec<(u64, u64, Row)>,
) -> Result<(), UnwindError>
where
    S: UnwindSection<gimli::EndianSlice<'a, LittleEndian>>,
    S::Offset: gimli::UnwindOffset<usize>,
{
    let mut ctx = UnwindContext::new();
    let mut entries = section.entries(bases);
    let mut budget = CFI_BUDGET;
    let parse = |e: gimli::Error| UnwindError::Parse(e.to_string());
    while let Some(entry) = entries.next().map_err(parse)? {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let fde = match partial.parse(S::cie_from_offset) {
            Ok(fde) => fde,
            Err(err) => {
                tracing::debug!(%err, "skipping an unreadable FDE");
                continue;
            }
        };
        let cost = (fde.entry_len() as u64).saturating_add(fde.cie().entry_len() as u64);
        budget = budget.checked_sub(cost).ok_or_else(|| {
            UnwindError::Parse(format!(
                "call frame information past the budget of {CFI_BUDGET} bytes evaluated"
            ))
        })?;
        let signal = fde.is_signal_trampoline();
        let mut table = match fde.rows(section, bases, &mut ctx) {
            Ok(table) => table,
            Err(err) => {
                tracing::debug!(%err, "skipping an FDE whose program fails");
                continue;
            }
        };
        loop {
            let row = match table.next_row() {
                Ok(Some(row)) => row,
                Ok(None) => break,
                Err(err) => {
                    // Rows so far stand; the FDE's rest is left uncovered.
                    tracing::debug!(%err, "an FDE's program stops early");
                    break;
                }
            };
            let rule = if signal {
                Row::rule(Cfa::MT_CFA_SIGNAL, 0, Rbp::MT_RBP_SAME, 0)
            } else {
                reduce(section, row)
            };
            if spans.len() == MAX_SPANS {
                return Err(UnwindError::Parse(format!(
                    "more than {MAX_SPANS} rows of call frame information"
                )));
            }
            spans.push((row.start_address(), row.end_address(), rule));
        }
    }
    Ok(())
}

/// The standard PLT CFA expression, up to its threshold literal:
/// `DW_OP_breg7 (rsp) 8; DW_OP_breg16 (rip) 0; DW_OP_lit15; DW_OP_and;
/// DW_OP_lit<N>; DW_OP_ge; DW_OP_lit3; DW_OP_shl; DW_OP_plus`.
const PLT_HEAD: [u8; 6] = [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a];
const PLT_TAIL: [u8; 4] = [0x2a, 0x33, 0x24, 0x22];

fn reduce<'a, S>(section: &S, row: &gimli::UnwindTableRow<usize>) -> Row
where
    S: UnwindSection<gimli::EndianSlice<'a, LittleEndian>>,
{
    let unsupported = Row::rule(Cfa::MT_CFA_UNSUPPORTED, 0, Rbp::MT_RBP_SAME, 0);
    match row.register(X86_64::RA) {
        RegisterRule::Undefined => return Row::rule(Cfa::MT_CFA_END, 0, Rbp::MT_RBP_SAME, 0),
        RegisterRule::Offset(-8) => {}
        _ => return unsupported,
    }
    let mut x8_flag = 0;
    let (cfa, cfa_off, plt) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            // Past 32 KiB, in 8-byte words (MT_CFA_OFF_X8).
            let (off, x8) = match i16::try_from(*offset) {
                Ok(off) => (off, 0),
                Err(_) if offset % 8 == 0 => match i16::try_from(offset / 8) {
                    Ok(off) => (off, CFA_OFF_X8),
                    Err(_) if *register == X86_64::RSP => return far_rsp(*offset, row),
                    Err(_) => return unsupported,
                },
                Err(_) => return unsupported,
            };
            x8_flag = x8;
            match *register {
                X86_64::RSP => (Cfa::MT_CFA_RSP, off, 0),
                X86_64::RBP => (Cfa::MT_CFA_RBP, off, 0),
                _ => return unsupported,
            }
        }
        CfaRule::Expression(expr) => {
            let Ok(expr) = expr.get(section) else {
                return unsupported;
            };
            let Ok(bytes) = expr.0.to_slice() else {
                return unsupported;
            };
            match *bytes {
                [a, b, c, d, e, f, lit @ 0x30..=0x4f, g, h, i, j]
                    if [a, b, c, d, e, f] == PLT_HEAD && [g, h, i, j] == PLT_TAIL =>
                {
                    (Cfa::MT_CFA_PLT, 8, (lit - 0x30) as i8)
                }
                _ => return unsupported,
            }
        }
    };
    let (rbp, rbp_off) = rbp_rule(cfa, plt, row);
    let mut out = Row::rule(cfa, cfa_off, rbp, rbp_off);
    out.kind |= x8_flag;
    out
}

/// The row of a CFA of rsp plus `offset`, a multiple of 8 past what
/// [`CFA_OFF_X8`] holds: `MT_CFA_RSP_FAR`, its word count in `cfa_off` and
/// `rbp_off`, the caller's rbp saved at CFA - 16 or lost.
fn far_rsp(offset: i64, row: &gimli::UnwindTableRow<usize>) -> Row {
    let words = offset / 8;
    if !(0..1 << 24).contains(&words) {
        return Row::rule(Cfa::MT_CFA_UNSUPPORTED, 0, Rbp::MT_RBP_SAME, 0);
    }
    let rbp = match row.register(X86_64::RBP) {
        RegisterRule::Undefined | RegisterRule::SameValue => Rbp::MT_RBP_SAME,
        RegisterRule::Offset(-16) => Rbp::MT_RBP_AT,
        _ => Rbp::MT_RBP_LOST,
    };
    Row::rule(
        Cfa::MT_CFA_RSP_FAR,
        words as u16 as i16,
        rbp,
        (words >> 16) as u8 as i8,
    )
}

/// Where the caller's rbp is, for a row whose CFA rule is `cfa` (`plt`: the
/// PLT's threshold, kept in `rbp_off` where no rbp offset is).
fn rbp_rule(cfa: Cfa, plt: i8, row: &gimli::UnwindTableRow<usize>) -> (Rbp, i8) {
    match row.register(X86_64::RBP) {
        RegisterRule::Undefined | RegisterRule::SameValue => (Rbp::MT_RBP_SAME, plt),
        RegisterRule::Offset(off) => match i8::try_from(off) {
            Ok(off) if cfa != Cfa::MT_CFA_PLT => (Rbp::MT_RBP_AT, off),
            _ => (Rbp::MT_RBP_LOST, plt),
        },
        _ => (Rbp::MT_RBP_LOST, plt),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rsp(off: i16) -> Row {
        Row::rule(Cfa::MT_CFA_RSP, off, Rbp::MT_RBP_SAME, 0)
    }

    /// Check that rows merge where the rule repeats, and that a gap between
    /// FDEs starts a NONE row.
    #[test]
    fn unwind_rows_merge_and_mark_gaps() {
        let spans = [
            (0x10, 0x14, rsp(8)),
            (0x14, 0x20, rsp(8)),
            (0x30, 0x40, rsp(16)),
        ];
        let rows = merge(&spans);
        let none = Row::rule(Cfa::MT_CFA_NONE, 0, Rbp::MT_RBP_SAME, 0);
        assert_eq!(
            rows,
            [
                Row { pc: 0x10, ..rsp(8) },
                Row { pc: 0x20, ..none },
                Row {
                    pc: 0x30,
                    ..rsp(16)
                },
                Row { pc: 0x40, ..none },
            ]
        );
    }

    /// Check that the page index points each page at its first row, and
    /// a page without rows at the next row above it.
    #[test]
    fn unwind_page_index() {
        let table = Table {
            bias: 0,
            rows: [0x1010, 0x1ff0, 0x3004, 0x3008]
                .map(|pc| Row { pc, ..rsp(8) })
                .to_vec(),
            source: ".eh_frame",
        };
        // Pages 0x1000, 0x2000 (no row), 0x3000; then the end.
        assert_eq!(table.page_index(100), [100, 102, 102, 104]);
    }

    /// Check that a library without call frame information has no code of
    /// its own when it exports no function and holds only its C runtime's
    /// glue (ICU's data library), and not when it exports one.
    #[test]
    fn unwind_data_only_library_has_no_code() {
        let dir = tempfile::tempdir().expect("temp dir");
        let build = |name: &str, source: &str| {
            let c = dir.path().join(format!("{name}.c"));
            let built = dir.path().join(format!("{name}.built.so"));
            let so = dir.path().join(format!("{name}.so"));
            std::fs::write(&c, source).expect("source");
            let ok = |cmd: &mut std::process::Command| cmd.status().expect("runs").success();
            assert!(ok(std::process::Command::new("cc")
                .args(["-shared", "-fPIC", "-O2", "-o"])
                .args([&built, &c])));
            assert!(ok(std::process::Command::new("objcopy")
                .args([
                    "--remove-section",
                    ".eh_frame",
                    "--remove-section",
                    ".eh_frame_hdr"
                ])
                .args([&built, &so])));
            compile(&std::fs::read(&so).expect("library")).expect("compiles")
        };
        let data = build("data", "const char blob[8192] = {1};\n");
        assert!(matches!(data, Compiled::NoCode));
        let code = build("code", "int f(int x) { return x * 3; }\n");
        assert!(matches!(code, Compiled::NoCfi));
        if let Ok(icu) = std::fs::read("/usr/lib/x86_64-linux-gnu/libicudata.so.72") {
            assert!(matches!(compile(&icu).expect("compiles"), Compiled::NoCode));
        }
    }

    /// Check that a function in a second executable segment at another
    /// bias gets its rows where BPF looks (its file offset plus the first
    /// segment's bias), and that a frame of 600,000 bytes gets an
    /// `MT_CFA_RSP_FAR` row with its word count (issue 41).
    #[test]
    fn unwind_far_segment_and_far_frame_rows() {
        use object::{Object, ObjectSymbol};
        let dir = tempfile::tempdir().expect("temp dir");
        let c = dir.path().join("far.c");
        let so = dir.path().join("far.so");
        std::fs::write(
            &c,
            "void sink(volatile char *);\n\
             __attribute__((section(\".farcode\"))) void far(void) \
             { volatile char b[64]; sink(b); sink(b); }\n\
             void big(void) { volatile char b[600000]; sink(b); sink(b); }\n",
        )
        .expect("source");
        let ok = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O2", "-fomit-frame-pointer", "-o"])
            .args([&so, &c])
            .arg("-Wl,--section-start=.farcode=0x800000")
            .status()
            .expect("runs")
            .success();
        assert!(ok);
        let data = std::fs::read(&so).expect("library");
        let Compiled::Table(table) = compile(&data).expect("compiles") else {
            panic!("has CFI");
        };
        let file = object::File::parse(&*data).expect("ELF");
        let sym = |name: &str| {
            file.dynamic_symbols()
                .find(|s| s.name() == Ok(name))
                .map(|s| (s.address(), s.size()))
                .expect("symbol")
        };
        // The rule at image key `key`: the last row at or below it.
        let rule_at = |key: u64| {
            *table
                .rows
                .iter()
                .take_while(|r| u64::from(r.pc) <= key)
                .last()
                .expect("a row")
        };
        let (far, far_len) = sym("far");
        let seg = file
            .segments()
            .find(|s| (s.address()..s.address() + s.size()).contains(&far))
            .expect("far's segment");
        let key = far - seg.address() + seg.file_range().0;
        let key = (key as i64 + table.bias) as u64;
        assert_ne!(key, far, "the segments' biases differ");
        // Its body keeps the 64-byte array below the return address.
        let body = (key..key + far_len)
            .map(rule_at)
            .filter(|r| r.cfa() == Cfa::MT_CFA_RSP)
            .map(|r| r.cfa_off)
            .max();
        assert!(body.is_some_and(|off| off > 64), "{body:?}");
        assert_eq!(rule_at(key).cfa_off, 8);
        assert!(!table.rows.iter().any(|r| u64::from(r.pc) >= far));
        let (big, big_len) = sym("big");
        let words = table
            .rows
            .iter()
            .filter(|r| (big..big + big_len).contains(&u64::from(r.pc)))
            .filter(|r| r.cfa() == Cfa::MT_CFA_RSP_FAR)
            .map(|r| u32::from(r.cfa_off as u16) | u32::from(r.rbp_off as u8) << 16)
            .max()
            .expect("a far row");
        assert!((600_000 / 8..600_100 / 8).contains(&words), "{words} words");
    }

    /// Check that Debian's libc compiles: rsp- and rbp-based rows, the PLT
    /// expression, the signal trampoline and an outermost frame.
    #[test]
    fn unwind_compiles_libc() {
        let data = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let Compiled::Table(table) = compile(&data).expect("compiles") else {
            panic!("libc has CFI");
        };
        let kinds: std::collections::HashSet<u32> = table.rows.iter().map(|r| r.cfa().0).collect();
        for kind in [
            Cfa::MT_CFA_RSP,
            Cfa::MT_CFA_RBP,
            Cfa::MT_CFA_END,
            Cfa::MT_CFA_SIGNAL,
        ] {
            assert!(kinds.contains(&kind.0), "{kind:?} missing");
        }
        assert!(table.rows.windows(2).all(|w| w[0].pc < w[1].pc));
    }

    /// Check that libstdc++'s `operator new` rows (and only theirs) are
    /// flagged as an allocator wrapper, and that libc, which has malloc,
    /// has no flagged row (issue 22).
    #[test]
    fn unwind_flags_operator_new_wrappers() {
        use object::{Object, ObjectSymbol};
        let flag = Flags::MT_ROW_ALLOC_WRAPPER.0 as u8;
        let table_of = |path: &str| {
            let data = std::fs::read(path).expect("image");
            let Compiled::Table(table) = compile(&data).expect("compiles") else {
                panic!("{path} has CFI");
            };
            (data, table)
        };
        let (_, libc) = table_of("/lib/x86_64-linux-gnu/libc.so.6");
        assert!(libc.rows.iter().all(|r| r.kind & flag == 0));
        let (data, cxx) = table_of("/usr/lib/x86_64-linux-gnu/libstdc++.so.6");
        let file = object::File::parse(&*data).expect("ELF");
        let addr = |name: &str| {
            file.dynamic_symbols()
                .find(|s| s.name() == Ok(name))
                .map(|s| s.address())
                .expect("symbol")
        };
        // The row holding an address: the last at or below it.
        let row_at = |a: u64| {
            *cxx.rows
                .iter()
                .take_while(|r| u64::from(r.pc) <= a)
                .last()
                .expect("a row")
        };
        for name in ["_Znwm", "_ZnwmRKSt9nothrow_t", "_Znam"] {
            assert_ne!(row_at(addr(name) + 4).kind & flag, 0, "{name}");
        }
        assert_eq!(row_at(addr("__cxa_allocate_exception")).kind & flag, 0);
        let flagged = cxx.rows.iter().filter(|r| r.kind & flag != 0).count();
        assert!((8..64).contains(&flagged), "{flagged} rows flagged");
    }
}
