"""Kernel timings of two builds of the CUDA launchers in one process, on the
same inputs, in turns: what a change to a kernel gains, measured against the
build before it in the same run.

    python tests/gpu/compare_libs.py BEFORE.so AFTER.so

(Build BEFORE.so from an older checkout the way tests/gpu/run_all.sh builds
the library.) Prints, per case, the best of three medians of each build and
whether their outputs are bit-identical. Both builds must share the
launchers' signatures; `kind` is the forward's `vectorized` argument the
AFTER build is called with (the BEFORE build is called with 1).
"""

import sys

import cupy as cp
import numpy as np
import run_gpu_checks as g
import util_checks as u


def forward_case(libs, tables, lanes, kind):
    outs = [cp.empty((int(t["splits"].shape[0]) - 1, int(t["params"].shape[1])), cp.float32)
            for t in tables]
    descs = (g.Table * len(tables))(*[g.describe(t, o) for t, o in zip(tables, outs)])
    d = cp.asarray(np.frombuffer(bytes(descs), np.uint8))
    offsets = cp.asarray(np.concatenate([[0], np.cumsum([o.shape[0] for o in outs])])
                         .astype(np.int64))
    bad = cp.full(len(tables), g.I64_MAX, cp.int64)
    stream = cp.cuda.get_current_stream().ptr
    total = int(offsets[-1])

    def run(name):
        lib = libs[name]
        return lib.sok_lookup_forward_f32(d.data.ptr, offsets.data.ptr, len(tables), total,
                                          kind if name == "after" else 1, 8, lanes,
                                          bad.data.ptr, stream)

    times = {name: min(g.time_ms(lambda: run(name)) for _ in range(3)) for name in libs}
    results = {}
    for name in libs:
        for o in outs:
            o.fill(cp.nan)
        run(name)
        results[name] = b"".join(cp.asnumpy(o).tobytes() for o in outs)
    return times, results["before"] == results["after"]


def main():
    libs = {"before": g.load(sys.argv[1]), "after": g.load(sys.argv[2])}
    for lib in libs.values():
        u.bind(lib)
    rng = np.random.default_rng(0)
    n = 8192 * 1000
    demo = [dict(params=cp.random.standard_normal((8192, 16), dtype=cp.float32),
                 ids=cp.random.randint(0, 8192, size=n, dtype=cp.int64),
                 splits=cp.arange(n + 1, dtype=cp.int64), weights=None, combiner="sum")]
    dlrm = g.dlrm_tables(rng)
    lengths = rng.choice([1, 1, 1, 1, 1, 1, 1, 2], size=1 << 22)
    splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    mixed = [dict(params=cp.random.standard_normal((8192, 16), dtype=cp.float32),
                  ids=cp.random.randint(0, 8192, size=int(splits[-1]), dtype=cp.int64),
                  splits=cp.asarray(splits), weights=None, combiner="mean")]
    cases = [("forward, DemoModel: 8,192,000 one-id samples, dim 16", demo, 4, 2),
             ("forward, DLRM: 26 x 8192 samples of 1-5 ids, dim 16, 4 lanes", dlrm, 4, 1),
             ("forward, DLRM, 8 lanes", dlrm, 8, 1),
             ("forward, 4M samples of 1 (7/8) or 2 ids, dim 16", mixed, 4, 1)]
    for what, tables, lanes, kind in cases:
        t, same = forward_case(libs, tables, lanes, kind)
        print(f"{what}: before {t['before']:.3f} ms, after {t['after']:.3f} ms, "
              f"{t['before'] / t['after']:.2f}x, bit-identical {same}")
    # The gradient (plan, read-back, rows) of the DemoModel's lookup.
    grads = [cp.random.standard_normal((n, 16), dtype=cp.float32)]
    runs = {name: g.BackwardRun(lib, demo, grads) for name, lib in libs.items()}
    times = {name: min(g.time_ms(run) for _ in range(3)) for name, run in runs.items()}
    rows = {}
    for name, run in runs.items():
        run()
        cp.cuda.get_current_stream().synchronize()
        count = int(run.num[0])
        rows[name] = b"".join(cp.asnumpy(a[:count]).tobytes() for a in run.keep[0])
    print(f"backward, DemoModel: before {times['before']:.3f} ms, after {times['after']:.3f} ms, "
          f"{times['before'] / times['after']:.2f}x, bit-identical "
          f"{rows['before'] == rows['after']}")
    for what, x in (("unique, the DemoModel's 8,192,000 keys in [0, 8192)",
                     cp.random.randint(0, 8192, size=n, dtype=cp.int64)),
                    ("unique, 8,388,608 keys in [0, 8M)",
                     cp.random.randint(0, 8 << 20, size=1 << 23, dtype=cp.int64))):
        times = {}
        for name, counts in (("before", True), ("after", True), ("after", False)):
            op = u.Unique(libs[name], np.int64, np.int64, x.size, counts=counts)
            times[(name, counts)] = min(g.time_ms(lambda: op(x)) for _ in range(3))
        print(f"{what}: with counts before {times[('before', True)]:.3f} ms, after "
              f"{times[('after', True)]:.3f} ms; without counts (after) "
              f"{times[('after', False)]:.3f} ms")


if __name__ == "__main__":
    main()
