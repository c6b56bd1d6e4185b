"""The CUDA build as a machine without a GPU sees it: the TensorFlow GPU
kernels are registered for the types they handle (int32 ids and keys too,
in device memory like int64 ones), and the C launchers report
errors instead of crashing when no GPU is usable. The kernels themselves are
checked on a GPU by tests/gpu/run_all.sh."""

import os
import re
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf
from tensorflow.python.framework import kernels

from sok_graph.ops import library as _ops

pytestmark = pytest.mark.skipif(not _ops.built_with_cuda(), reason="built without a CUDA toolkit")

INT32, INT64, FLOAT = (tf.int32.as_datatype_enum, tf.int64.as_datatype_enum,
                       tf.float32.as_datatype_enum)
DOUBLE, HALF, BFLOAT16 = (tf.float64.as_datatype_enum, tf.float16.as_datatype_enum,
                          tf.bfloat16.as_datatype_enum)

# op -> (type attribute -> the types its GPU kernels take, host-memory args)
GPU_KERNELS = {
    # int32 ids and keys: registered too, in device memory (a registered
    # kernel's int32 tensors stay on the device unless declared HostMemory).
    # row_splits stay on the device too: checked there, never waited for.
    # float16 / bfloat16 tables too: widened to float32 on the device.
    "SokFusedLookup": ({"T": {FLOAT, HALF, BFLOAT16}, "Tindices": {INT32, INT64}}, set()),
    "SokFusedLookupGrad": ({"T": {FLOAT, HALF, BFLOAT16}, "Tindices": {INT32, INT64}}, set()),
    # The forward's check is reported on the host, next to a GPU lookup.
    "SokLookupCheck": ({}, {"checks"}),
    "SokSparseApply": ({"T": {FLOAT}, "Tindices": {INT32, INT64}}, set()),
    "SokUnique": ({"T": {INT64}, "out_idx": {INT64}}, set()),
    "SokUniqueWithCounts": ({"T": {INT64}, "out_idx": {INT64}}, set()),
    # The per-group sizes come back with the unique's count, to the host.
    # Sizes known before it runs: nothing goes to the host (the exchange's
    # dedups, which must not wait for the device).
    "SokUniquePadded": ({"T": {INT64}, "out_idx": {INT64}}, set()),
    # The owner's read takes table_sizes in device memory (it does not read
    # them); its gradient sizes its outputs from them, on the host.
    "SokGroupedGather": ({"T": {FLOAT, DOUBLE, HALF, BFLOAT16}}, set()),
    "SokGroupedGatherGrad": ({"T": {FLOAT, DOUBLE, HALF, BFLOAT16}}, {"table_sizes"}),
    "SokUnsortedSegmentSum": ({"T": {FLOAT}, "Tindices": {INT64}, "Tnumsegments": {INT32, INT64}},
                              {"num_segments"}),
    "SokBucketizeByOwner": ({"T": {INT64}}, set()),
    "SokLocalRows": ({"T": {INT64}}, set()),
    "SokRouteGroupedKeys": ({}, set()),
    # Dynamic tables: int64 and int32 keys on the GPU hash table.
    "SokDynamicTableHandle": ({}, {"table"}),
    "SokDynamicTableCreate": ({"key_dtype": {INT32, INT64}}, {"table"}),
    "SokDynamicTableIsInitialized": ({}, {"table", "is_initialized"}),
    "SokDynamicTableFindOrInsert": ({"Tkeys": {INT32, INT64}}, {"table", "num_evicted"}),
    "SokDynamicTableUniqueFindOrInsert": ({"Tkeys": {INT32, INT64}},
                                          {"table", "num_evicted"}),
    "SokDynamicTableFind": ({"Tkeys": {INT32, INT64}}, {"table", "default_value"}),
    "SokDynamicTableScatter": ({"Tkeys": {INT32, INT64}}, {"table", "num_evicted"}),
    "SokDynamicTableRemove": ({"Tkeys": {INT32, INT64}}, {"table"}),
    "SokDynamicTableStats": ({}, {"table", "size", "row_limit", "evicted_total",
                                  "memory_bytes"}),
    "SokDynamicTableExport": ({"Tkeys": {INT32, INT64}}, {"table", "offset", "limit", "updated_after",
                                                   "next_offset"}),
    # Timestamps and frequencies are checked on the host (and the table's
    # clock moves past the latest timestamp), then copied over.
    "SokDynamicTableImport": ({"Tkeys": {INT32, INT64}}, {"table", "timestamps", "frequencies",
                                                          "num_evicted"}),
    "SokDynamicTableClear": ({}, {"table"}),
    # Both tables' handles; nothing else crosses.
    "SokDynamicTableAddShadow": ({}, {"table", "shadow"}),
    # The fused optimizer step of a dynamic table and its slot tables.
    "SokDynamicSparseApply": ({"Tkeys": {INT32, INT64}}, {"table", "slots"}),
}


def test_every_dynamic_table_op_has_a_gpu_kernel():
    """Ops on one table are placed together: one op without a GPU kernel
    would move the whole table to the CPU."""
    lib = _ops.load()
    dynamic = {"".join(w.capitalize() for w in name.split("_")) for name in dir(lib)
               if name.startswith("sok_dynamic_") and not name.endswith("_eager_fallback")}
    assert dynamic and dynamic <= set(GPU_KERNELS), sorted(dynamic - set(GPU_KERNELS))


def _gpu_kernels(op):
    _ops.load()
    return [k for k in kernels.get_registered_kernels_for_op(op).kernel
            if k.device_type == "GPU"]


@pytest.mark.parametrize("op", sorted(GPU_KERNELS))
def test_gpu_kernels_registered_with_their_types(op):
    types, host_args = GPU_KERNELS[op]
    registered = _gpu_kernels(op)
    assert registered, f"no GPU kernel registered for {op}"
    seen = {name: set() for name in types}
    for k in registered:
        constraints = {c.name: set(c.allowed_values.list.type) for c in k.constraint}
        assert set(constraints) == set(types), (op, constraints)
        for name, allowed in constraints.items():
            seen[name] |= allowed
        assert set(k.host_memory_arg) == host_args, (op, list(k.host_memory_arg))
    assert seen == types, (op, seen)


def test_launchers_fail_cleanly_without_a_gpu():
    lib = os.path.join(os.path.dirname(_ops.library_path()), "libsok_cuda_kernels.so")
    assert os.path.exists(lib), "a CUDA build must ship libsok_cuda_kernels.so"
    script = textwrap.dedent(f"""
        import ctypes, sys
        lib = ctypes.CDLL({lib!r})
        assert lib.sok_cuda_device_count() == 0
        P, I64 = ctypes.c_void_p, ctypes.c_int64

        class Config(ctypes.Structure):
            _fields_ = [("dim", I64), ("init_capacity", I64), ("max_rows", I64),
                        ("eviction", ctypes.c_int32), ("init_kind", ctypes.c_int32),
                        ("mean", ctypes.c_float), ("stddev", ctypes.c_float),
                        ("minval", ctypes.c_float), ("maxval", ctypes.c_float),
                        ("value", ctypes.c_float), ("reserved", ctypes.c_int32),
                        ("seed", ctypes.c_uint64)]

        table = P()
        bad = Config(0, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0)       # dim 0
        assert lib.sok_gpu_table_create(ctypes.byref(bad), None, None, ctypes.byref(table)) == -2
        # An allocator with alloc but no free (or the reverse) is refused
        # before anything is allocated.
        ALLOC = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t)

        class Allocator(ctypes.Structure):
            _fields_ = [("alloc", ALLOC), ("free", ctypes.c_void_p), ("context", P)]

        half = Allocator(ALLOC(lambda context, size: None), None, None)
        fine = Config(8, 100, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0)
        assert lib.sok_gpu_table_create(ctypes.byref(fine), ctypes.byref(half), None,
                                        ctypes.byref(table)) == -2
        assert not table.value
        good = Config(8, 100, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0)
        rc = lib.sok_gpu_table_create(ctypes.byref(good), None, None, ctypes.byref(table))
        assert rc > 0 and not table.value, (rc, table.value)   # a CUDA error, no table
        rc = lib.sok_lookup_forward_f32(None, None, 1, I64(1), 1, 8, 32, None, None)
        assert rc > 0, rc
        # Lane counts other than 4, 8, 16, 32, teams without float4 loads
        # and unknown kernel kinds (`vectorized` not 0, 1 or 2) are refused before anything is launched (cudaErrorInvalidValue).
        for lanes, vectorized in ((5, 1), (64, 1), (0, 1), (4, 0), (4, 3), (4, -1)):
            rc = lib.sok_lookup_forward_f32(None, None, 1, I64(1), vectorized, 8, lanes, None,
                                            None)
            assert rc == 1, (lanes, vectorized, rc)
        assert lib.sok_gpu_fill_i64(None, I64(0), I64(4), None) > 0
        lib.sok_gpu_error_name.restype = ctypes.c_char_p
        assert lib.sok_gpu_error_name(2) == b"cudaErrorMemoryAllocation"
        size = ctypes.c_size_t(0)
        # Size queries and launches may fail (no device) but must return.
        lib.sok_unique_with_counts_i64_i64(None, I64(4), None, None, None, None, None,
                                           ctypes.byref(size), None)
        lib.sok_bucketize_by_owner_i64(None, I64(4), I64(2), I64(-1), None, None, None, None,
                                       None, None, ctypes.byref(size), None)
        print("clean")
    """)
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "clean" in out.stdout


def test_runtime_version_and_driver_floor_are_reported():
    """The error an old driver gives names the CUDA runtime the kernels were
    built with and the oldest driver it runs on (tf_ops/common/cuda_status.h)."""
    import ctypes
    lib = ctypes.CDLL(os.path.join(os.path.dirname(_ops.library_path()), "libsok_cuda_kernels.so"))
    runtime, floor = lib.sok_cuda_runtime_version(), lib.sok_cuda_min_driver()
    # The build stamps the CUDA version its toolkit headers declare
    # (tf_ops/build): the runtime linked in must be that one.
    stamp = re.search(rb"cuda_version=(\d+)\.(\d+)", open(_ops.library_path(), "rb").read())
    if stamp:
        assert runtime // 1000 == int(stamp.group(1)) and (runtime % 1000) // 10 == \
            int(stamp.group(2)), (runtime, stamp.group(0))
    # NVIDIA's minimum Linux drivers per CUDA major version (CUDA release notes).
    assert floor == {11: 450, 12: 525, 13: 580}[runtime // 1000], (runtime, floor)
