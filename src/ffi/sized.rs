//! Size-first structs: `#[repr(C)]` structs that begin with `size`, the
//! `sizeof` the caller was built with, and grow at their end.
//!
//! Reading one, this library takes the part both sides know: a smaller
//! (older) caller's struct gets the defaults for the fields it lacks; a
//! larger (newer) one's bytes past this library's struct must be zero,
//! else the call is refused with `MEMTRAIL_E_UNKNOWN_FIELD` (issue 27, as
//! blazesym's `input_zeroed!`): a field set there asks for something this
//! library does not have, and ignoring it silently would be wrong. Writing
//! one, this library writes only the part both know.

use super::errors::fail;
use super::memtrail_error::{self, *};

/// A `#[repr(C)]` struct that begins with `size: usize`.
///
/// # Safety
/// The implementer is `#[repr(C)]`, its first field is `size: usize`, every
/// field is a plain integer (any bytes are a valid value) and it has no
/// padding (every byte is a field's). Then any prefix of it can be copied
/// byte by byte, from or to a caller's struct. Implement it with
/// `size_first!`, which checks all of this at compile time.
pub(super) unsafe trait SizeFirst: Copy {
    /// The struct's C name, for messages.
    const NAME: &'static str;
    /// The smallest `size` taken: the struct's first version's.
    const FIRST_VERSION: usize;
    /// The value whose fields a caller's smaller struct does not reach.
    fn empty() -> Self;
}

/// Integers: the only field types of a [`SizeFirst`] struct.
pub(super) trait Plain {}
impl Plain for usize {}
impl Plain for u64 {}
impl Plain for u32 {}

/// `unsafe impl SizeFirst` for a struct whose fields are listed, in their
/// order, with their types; asserts at compile time what the trait's
/// `# Safety` asks: the list is the struct's (every field, each type), the
/// first is `size: usize`, every field is [`Plain`], and the struct is as
/// large as its fields together (no padding).
macro_rules! size_first {
    ($t:ident { $($field:ident: $ty:ty),+ $(,)? }, first_version: $v:expr, empty: $empty:expr) => {
        // SAFETY: `#[repr(C)]` (declared so), and the assertions below:
        // `size: usize` first, integer fields, no padding.
        unsafe impl $crate::ffi::sized::SizeFirst for $t {
            const NAME: &'static str = stringify!($t);
            const FIRST_VERSION: usize = $v;
            fn empty() -> Self {
                $empty
            }
        }
        const _: () = {
            // Every field named (no `..`), with its type, each Plain.
            fn _fields(v: $t) {
                fn plain<T: $crate::ffi::sized::Plain>(_: T) {}
                let $t { $($field: _),+ } = v;
                $(plain::<$ty>(v.$field);)+
                let _: usize = v.size;
            }
            let _: fn($t) = _fields;
            assert!(std::mem::offset_of!($t, size) == 0, "size is not first");
            assert!(
                std::mem::size_of::<$t>() == 0 $(+ std::mem::size_of::<$ty>())+,
                concat!(stringify!($t), " has padding"),
            );
        };
    };
}
pub(super) use size_first;

/// Reads the caller's struct: its part this library knows, the defaults
/// for the rest; refused when a byte past this library's struct is set.
///
/// # Safety
/// `ptr` is NULL or points to a struct whose first field is its size and
/// which is that large, initialized.
pub(super) unsafe fn read_sized<T: SizeFirst>(ptr: *const T) -> Result<T, memtrail_error> {
    if ptr.is_null() {
        return Err(fail(MEMTRAIL_E_NULL, "struct pointer is NULL"));
    }
    // SAFETY: the caller's struct starts with its size (`# Safety`).
    let size = unsafe { ptr.cast::<usize>().read_unaligned() };
    check_size::<T>(size)?;
    let ours = std::mem::size_of::<T>();
    if size > ours {
        // SAFETY: `size` bytes are the caller's, initialized (`# Safety`);
        // `check_size` bounded `size` to isize::MAX.
        let tail = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>().add(ours), size - ours) };
        if let Some(at) = tail.iter().position(|&b| b != 0) {
            return Err(fail(
                MEMTRAIL_E_UNKNOWN_FIELD,
                &format!(
                    "struct {}: byte {} of the caller's {size} is set, past the {ours} this \
                     library knows: a field of a newer header, which this library does not \
                     have (set it to 0 to do without)",
                    T::NAME,
                    ours + at
                ),
            ));
        }
    }
    let mut value = T::empty();
    let n = size.min(ours);
    // SAFETY: `n` bytes are the caller's (it said `size`) and ours; any
    // bytes are a valid `T` (`SizeFirst`).
    unsafe { std::ptr::copy_nonoverlapping(ptr.cast::<u8>(), (&raw mut value).cast::<u8>(), n) };
    Ok(value)
}

/// Writes `value` into the caller's part of a size-first struct; the
/// caller's `size` and the bytes past this library's struct stay as they
/// were.
///
/// # Safety
/// As [`read_sized`], writable.
pub(super) unsafe fn write_sized<T: SizeFirst>(
    ptr: *mut T,
    value: T,
) -> Result<(), memtrail_error> {
    if ptr.is_null() {
        return Err(fail(MEMTRAIL_E_NULL, "output struct pointer is NULL"));
    }
    // SAFETY: the caller's struct starts with its size.
    let size = unsafe { ptr.cast::<usize>().read_unaligned() };
    check_size::<T>(size)?;
    let n = size.min(std::mem::size_of::<T>());
    let mut value = value;
    // SAFETY: `size` is `T`'s first field, a usize (`SizeFirst`).
    unsafe { (&raw mut value).cast::<usize>().write(size) };
    // SAFETY: `n` bytes are the caller's and ours; the caller's size field
    // gets the value it had.
    unsafe { std::ptr::copy_nonoverlapping((&raw const value).cast::<u8>(), ptr.cast::<u8>(), n) };
    Ok(())
}

/// `MEMTRAIL_E_INVALID` for a size below `T`'s first version or past what
/// any object can be.
fn check_size<T: SizeFirst>(size: usize) -> Result<(), memtrail_error> {
    if size < T::FIRST_VERSION {
        return Err(fail(
            MEMTRAIL_E_INVALID,
            &format!(
                "struct {}: size {size} is below its first version's, {}",
                T::NAME,
                T::FIRST_VERSION
            ),
        ));
    }
    if isize::try_from(size).is_err() {
        return Err(fail(
            MEMTRAIL_E_INVALID,
            &format!("struct {}: size {size} is no object's", T::NAME),
        ));
    }
    Ok(())
}
