"""Exact allocation counts of a region of a Python program, through
memtrail's C ABI (include/memtrail.h) with ctypes. Run as root:
MEMTRAIL_LIB=target/debug/libmemtrail.so python3 examples/regions.py"""
import ctypes, os

lib = ctypes.CDLL(os.environ.get("MEMTRAIL_LIB", "libmemtrail.so"))
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
libc.free.argtypes = [ctypes.c_void_p]
lib.memtrail_last_error.restype = ctypes.c_char_p
FIELDS = ("allocations", "frees", "allocated_bytes", "freed_bytes",
          "peak_live_bytes", "live_allocations", "live_bytes")

class RegionCounts(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t)] + [(f, ctypes.c_uint64) for f in FIELDS]

session = ctypes.c_void_p()
if lib.memtrail_track_self(None, ctypes.byref(session)) != 0:
    raise SystemExit(lib.memtrail_last_error().decode())
counts = RegionCounts(size=ctypes.sizeof(RegionCounts))
begin, end, malloc, free = lib.memtrail_region_begin, lib.memtrail_region_end, libc.malloc, libc.free
name, out = b"three mallocs, one free", ctypes.byref(counts)

begin(session, name)   # everything the region needs is made before it
a, b, c = malloc(100), malloc(200), malloc(300)
free(b)
end(session, out)

free(a), free(c)
lib.memtrail_session_free(session)
print(" ".join(f"{f}={getattr(counts, f)}" for f in FIELDS))
assert (counts.allocations, counts.frees, counts.allocated_bytes) == (3, 1, 600), counts
