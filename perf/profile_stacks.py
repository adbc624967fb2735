"""A profile's stacks as version 2 wrote them (each with its frames and
every metric), from either version: version 3 keeps them compact
(docs/profile.md, "Allocation stacks"). For the perf scripts' Python."""

METRICS = ["allocations", "bytes", "live_bytes_at_peak", "live_allocations_at_peak",
           "live_bytes_at_exit", "live_allocations_at_exit", "temporary_allocations",
           "mmaps", "mapped_bytes", "mapped_bytes_at_peak", "mapped_bytes_at_exit",
           "reserved_bytes", "reserved_bytes_at_exit", "brk_bytes"]


def stacks(prof):
    t = prof["stacks"]
    if isinstance(t, list):
        return t
    s = lambda i: None if i is None else t["strings"][i]
    row = lambda table, i: {} if i is None else t[table][i]

    def frame(i):
        f = t["frames"][i]
        m, fn = row("modules", f["module"]), row("functions", f["function"])
        return {"addr": f["addr"], "module": s(m.get("path")), "function": s(fn.get("name")),
                "file": s(fn.get("file")), "line": f["line"], "inlined": f["inlined"],
                "build_id": s(m.get("build_id")), "offset": f["offset"]}

    frames = [frame(i) for i in range(len(t["frames"]))]
    return [{**{k: 0 for k in METRICS}, **e, "exe": s(e["exe"]),
             "frames": [frames[i] for i in e["frames"]]} for e in t["entries"]]
