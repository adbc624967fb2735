//! The x86-64 ELF image as the site search reads it ([`Elf`]): its
//! function symbols and their ends, its `.eh_frame` function ranges, where
//! its GOT slots lead, file offsets of addresses (in executable segments
//! for probes) and the code there. Total on any file: every offset and
//! length is checked against the file.

use std::path::Path;

use iced_x86::{Decoder, DecoderOptions, Mnemonic, OpKind, Register};
use object::{Object, ObjectSegment, ObjectSymbol};

use super::prologue::HARMLESS_WINDOW;
use super::{AttachError, free_sites, returns};

pub(super) struct Elf<'a> {
    pub(super) file: object::File<'a>,
    pub(super) data: &'a [u8],
}

/// `p_flags` of an executable segment.
const PF_X: u32 = 1;

impl<'a> Elf<'a> {
    /// `data` as an x86-64 ELF image.
    pub(super) fn parse(image: &Path, data: &'a [u8]) -> Result<Self, AttachError> {
        if !data.starts_with(b"\x7fELF") {
            return Err(AttachError::NotElf {
                path: image.to_owned(),
            });
        }
        let parse_err = |reason: String| AttachError::Parse {
            path: image.to_owned(),
            reason,
        };
        let file = object::File::parse(data).map_err(|e| parse_err(e.to_string()))?;
        if file.architecture() != object::Architecture::X86_64 || !file.is_64() {
            return Err(parse_err(format!(
                "not an x86-64 image ({:?}, {}-bit)",
                file.architecture(),
                if file.is_64() { 64 } else { 32 }
            )));
        }
        Ok(Self { file, data })
    }

    /// The addresses of the functions named in `names` the image defines,
    /// by name: the dynamic symbol where there is one, else the symbol
    /// table's; the first of a name in each. One pass over each table (a
    /// search per name took 100 ms on cc1's 33 MB).
    pub(super) fn functions<'n>(
        &self,
        names: impl IntoIterator<Item = &'n str>,
    ) -> std::collections::HashMap<&'n [u8], u64> {
        let wanted: std::collections::HashSet<&'n [u8]> =
            names.into_iter().map(str::as_bytes).collect();
        let mut found = std::collections::HashMap::new();
        // The dynamic table first: a name it defines keeps its address.
        for sym in self.file.dynamic_symbols().chain(self.file.symbols()) {
            if !sym.is_definition() || sym.kind() != object::SymbolKind::Text {
                continue;
            }
            let Ok(name) = sym.name_bytes() else { continue };
            if let Some(&name) = wanted.get(name) {
                found.entry(name).or_insert(sym.address());
            }
        }
        found
    }

    /// The ends (address + size) of the function symbols at `addrs`, from
    /// the dynamic symbols or the symbol table: one pass over each.
    pub(super) fn function_ends(&self, addrs: &[u64]) -> std::collections::HashMap<u64, u64> {
        let mut ends = std::collections::HashMap::new();
        for sym in self.file.dynamic_symbols().chain(self.file.symbols()) {
            if sym.is_definition()
                && sym.kind() == object::SymbolKind::Text
                && sym.size() > 0
                && addrs.contains(&sym.address())
            {
                if let Some(end) = sym.address().checked_add(sym.size()) {
                    ends.entry(sym.address()).or_insert(end);
                }
            }
        }
        ends
    }

    /// The address ranges of the image's functions as its `.eh_frame`
    /// describes them (one per FDE, sorted): where code a call returns
    /// to ends, stripped images included. Bounded like the unwinder's
    /// reading: entries past a malformed one are left out.
    pub(super) fn fde_ranges(&self) -> Vec<(u64, u64)> {
        use gimli::{BaseAddresses, CieOrFde, EhFrame, LittleEndian, UnwindSection};
        use object::ObjectSection;
        let Some(section) = self.file.section_by_name(".eh_frame") else {
            return Vec::new();
        };
        let Ok(bytes) = section.data() else {
            return Vec::new();
        };
        let addr_of = |name: &str| self.file.section_by_name(name).map_or(0, |s| s.address());
        let eh = EhFrame::new(bytes, LittleEndian);
        let bases = BaseAddresses::default()
            .set_eh_frame(section.address())
            .set_text(addr_of(".text"))
            .set_got(addr_of(".got"));
        let mut ranges = Vec::new();
        let mut entries = eh.entries(&bases);
        while let Ok(Some(entry)) = entries.next() {
            let CieOrFde::Fde(partial) = entry else {
                continue;
            };
            let Ok(fde) = partial.parse(|eh, bases, offset| eh.cie_from_offset(bases, offset))
            else {
                continue;
            };
            let start = fde.initial_address();
            if let Some(end) = start.checked_add(fde.len()) {
                ranges.push((start, end));
            }
        }
        ranges.sort_unstable();
        ranges
    }

    /// Where jumps through the image's GOT slots go, by slot address, for
    /// the slots [`returns`] can follow: a function the image defines
    /// (not an IFUNC, whose symbol is its resolver), or `memset`, `memcpy`
    /// or `memmove`, which return their first argument (an IFUNC's
    /// IRELATIVE slot names its resolver's address: glibc's own calls).
    pub(super) fn got_tails(&self) -> std::collections::HashMap<u64, returns::Tail> {
        use object::{ObjectSymbolTable, RelocationTarget, SymbolFlags};
        const FIRST_ARG: [&[u8]; 3] = [b"memset", b"memcpy", b"memmove"];
        const STT_GNU_IFUNC: u8 = 10;
        let mut tails = std::collections::HashMap::new();
        let (Some(relocs), Some(dynsym)) = (
            self.file.dynamic_relocations(),
            self.file.dynamic_symbol_table(),
        ) else {
            return tails;
        };
        let ifunc = |sym: &object::Symbol<'_, '_>| matches!(sym.flags(), SymbolFlags::Elf { st_info, .. } if st_info & 0xf == STT_GNU_IFUNC);
        for (slot, reloc) in relocs {
            let tail = match reloc.target() {
                RelocationTarget::Symbol(index) => {
                    let Ok(sym) = dynsym.symbol_by_index(index) else {
                        continue;
                    };
                    let name = sym.name_bytes().unwrap_or_default();
                    if FIRST_ARG.contains(&name) {
                        returns::Tail::ReturnsFirstArg
                    } else if sym.is_definition()
                        && sym.kind() == object::SymbolKind::Text
                        && !ifunc(&sym)
                    {
                        returns::Tail::Jump(sym.address())
                    } else {
                        continue;
                    }
                }
                RelocationTarget::Absolute => {
                    let resolver = reloc.addend() as u64;
                    let named = self.file.dynamic_symbols().any(|sym| {
                        sym.address() == resolver
                            && FIRST_ARG.contains(&sym.name_bytes().unwrap_or_default())
                    });
                    if !named {
                        continue;
                    }
                    returns::Tail::ReturnsFirstArg
                }
                _ => continue,
            };
            tails.insert(slot, tail);
        }
        tails
    }

    /// The file offset of address `vaddr`, through the loadable segment
    /// that holds it and has it in the file; None outside them (and where
    /// the headers' numbers overflow or point past the end of the file).
    pub(super) fn file_offset(&self, vaddr: u64) -> Option<u64> {
        self.offset_in(vaddr, |_| true)
    }

    /// [`file_offset`](Self::file_offset) through executable segments
    /// only: where a probe may go.
    pub(super) fn code_offset(&self, vaddr: u64) -> Option<u64> {
        self.offset_in(vaddr, |seg| match seg.flags() {
            object::SegmentFlags::Elf { p_flags } => p_flags & PF_X != 0,
            _ => false,
        })
    }

    fn offset_in(
        &self,
        vaddr: u64,
        keep: impl Fn(&object::Segment<'a, '_>) -> bool,
    ) -> Option<u64> {
        self.file.segments().filter(keep).find_map(|seg| {
            let (start, (file_off, file_len)) = (seg.address(), seg.file_range());
            let into = vaddr.checked_sub(start)?;
            if into >= seg.size() || into >= file_len {
                return None;
            }
            let offset = file_off.checked_add(into)?;
            (offset < self.data.len() as u64).then_some(offset)
        })
    }

    pub(super) fn bytes_at(&self, offset: u64, len: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        self.data.get(start..start.checked_add(len)?)
    }

    /// Up to `max` bytes of code at `offset` (fewer at the end of the file).
    pub(super) fn code_at(&self, offset: u64, max: usize) -> Option<&[u8]> {
        let start = usize::try_from(offset).ok()?;
        let rest = self.data.get(start..)?;
        Some(&rest[..rest.len().min(max)])
    }

    /// Whether a whole, valid x86-64 instruction starts at file offset
    /// `offset` (a probe needs one: the kernel refuses the link otherwise).
    pub(super) fn is_instruction(&self, offset: u64) -> bool {
        self.code_at(offset, 16).is_some_and(|code| {
            let insn = Decoder::new(64, code, DecoderOptions::NONE).decode();
            !insn.is_invalid()
        })
    }

    /// Length of an opening `test %rdi,%rdi; je <ret>` at `vaddr`: the probe
    /// can go after it without missing any call but free(NULL).
    /// For each of `targets`, the ends of the instructions in executable
    /// segments whose 32-bit displacement (any instruction's: a byte
    /// sequence that is no instruction errs on the safe side) or short
    /// jump reaches it, and u64::MAX where the image holds its address as
    /// an aligned 64-bit word anywhere (a pointer, a relocation's addend, a
    /// symbol's value). A displacement of 0 is left out: it names the
    /// next instruction (padding's zeros end right before a target).
    pub(super) fn referrers(&self, targets: &[u64]) -> free_sites::Referrers {
        let mut out: std::collections::HashMap<u64, Vec<u64>> = std::collections::HashMap::new();
        for seg in self.file.segments() {
            let object::SegmentFlags::Elf { p_flags } = seg.flags() else {
                continue;
            };
            let Ok(bytes) = seg.data() else { continue };
            if p_flags & PF_X == 0 {
                continue;
            }
            let base = seg.address();
            for (i, w) in bytes.windows(4).enumerate() {
                let end = base + i as u64 + 4;
                let rel = i64::from(i32::from_le_bytes([w[0], w[1], w[2], w[3]]));
                let to = end.wrapping_add_signed(rel);
                if rel != 0 && targets.contains(&to) {
                    out.entry(to).or_default().push(end);
                }
                let short = i > 0 && (bytes[i - 1] == 0xeb || bytes[i - 1] & 0xf0 == 0x70);
                let end = base + i as u64 + 1;
                let to = end.wrapping_add_signed(i64::from(w[0] as i8));
                if short && w[0] != 0 && targets.contains(&to) {
                    out.entry(to).or_default().push(end);
                }
            }
        }
        for w in self.data.chunks_exact(8) {
            let word = u64::from_le_bytes(w.try_into().unwrap_or_default());
            if targets.contains(&word) {
                out.entry(word).or_default().push(u64::MAX);
            }
        }
        out
    }

    pub(super) fn null_test_len(&self, vaddr: u64) -> Option<u64> {
        let code = self.code_at(self.file_offset(vaddr)?, HARMLESS_WINDOW)?;
        let mut decoder = Decoder::with_ip(64, code, vaddr, DecoderOptions::NONE);
        let test = decoder.decode();
        let is_rdi =
            |i: u32| test.op_kind(i) == OpKind::Register && test.op_register(i) == Register::RDI;
        if test.mnemonic() != Mnemonic::Test || !is_rdi(0) || !is_rdi(1) {
            return None;
        }
        let je = decoder.decode();
        if je.mnemonic() != Mnemonic::Je {
            return None;
        }
        let target = self.code_at(self.file_offset(je.near_branch_target())?, 16)?;
        let ret = Decoder::new(64, target, DecoderOptions::NONE).decode();
        (ret.mnemonic() == Mnemonic::Ret && ret.op_count() == 0).then(|| decoder.position() as u64)
    }
}
