//! Where CPython 3.12+ keeps a thread's current thread state:
//! `_Py_tss_tstate`, a thread-local variable of the interpreter image
//! (issue 25). libpython, built position-independent, reaches it through
//! `__tls_get_addr` with a `tls_index` (module id, offset in the module's
//! block) in its GOT, which `_PyThreadState_GetCurrent` (exported) passes
//! first: `lea tls_index(%rip),%rdi; call __tls_get_addr`. BPF reads the
//! module id the dynamic loader wrote there, then the thread's block
//! (`py_tls_state` in `bpf/python.c`).

/// `R_X86_64_DTPMOD64`: the module id a `tls_index` starts with.
const R_X86_64_DTPMOD64: u32 = 16;

/// The address (in the image) of the `tls_index` of `_Py_tss_tstate`, if
/// the image reaches it the general-dynamic way.
pub fn index(file: &object::File<'_>) -> Option<u64> {
    use iced_x86::{Code, Decoder, DecoderOptions, FlowControl, Register};
    use object::{Object, ObjectSection, ObjectSymbol, RelocationFlags};
    let func = file
        .dynamic_symbols()
        .find(|s| s.is_definition() && s.name() == Ok("_PyThreadState_GetCurrent"))?;
    let len = func.size().clamp(1, 64);
    let code = file
        .section_by_index(func.section_index()?)
        .ok()?
        .data_range(func.address(), len)
        .ok()??;
    let mut decoder = Decoder::with_ip(64, code, func.address(), DecoderOptions::NONE);
    let mut index = None;
    for insn in &mut decoder {
        if let Some(at) = index {
            // The lea's address is the call's argument.
            if insn.flow_control() != FlowControl::Call {
                return None;
            }
            // The loader writes the module id there.
            let module_id = file.dynamic_relocations()?.any(|(offset, r)| {
                offset == at
                    && matches!(r.flags(), RelocationFlags::Elf { r_type } if r_type == R_X86_64_DTPMOD64)
            });
            return module_id.then_some(at);
        }
        if insn.code() == Code::Lea_r64_m
            && insn.op0_register() == Register::RDI
            && insn.is_ip_rel_memory_operand()
        {
            index = Some(insn.ip_rel_memory_address());
        }
    }
    None
}
