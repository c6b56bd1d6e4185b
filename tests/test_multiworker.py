"""Model parallelism over N worker processes on localhost, under the launcher.

For each engine (Horovod; tf.distribute's MultiWorkerMirroredStrategy, one
replica per process; MirroredStrategy with N replicas in one process),
N-worker training of the workloads in
tests/multiworker/train_worker.py (two tables through sok.lookup_sparse; the
1.x layers All2AllDenseEmbedding and DistributedEmbedding; static and dynamic
tables; tf.function and graph-mode Sessions) must equal single-process
training on the same global batches: every table row, the dense weights and
the losses, to a relative squared error below 1e-6. Also: bytes sent with and
without deduplication, and dump/load across world sizes (bit-exact rows and
optimizer state). Failures (a worker killed, stalled, misbuilt, or given a
bad id): test_multiworker_failures.py.
"""

import glob
import os
import sys

import numpy as np
import pytest
from sok_graph.launch import visible_gpus

from multiworker.launching import launch, needs_horovod, needs_tf2_collectives, rel_sq_err, \
    run_process

HERE = os.path.dirname(os.path.abspath(__file__))
TRAIN = os.path.join(HERE, "multiworker", "train_worker.py")
DUMP = os.path.join(HERE, "multiworker", "dump_worker.py")

CONFIGS = [f"{api}:{table}:{mode}" for api in ("v2", "a2a", "dist")
           for table in ("static", "dynamic") for mode in ("function", "graph")] + [
    "v2:localized:function", "v2:localized:graph", "v2:filtered:function", "v2:filtered:graph"]
# Two steps in each tf.function call: a later step's exchanges of keys may run
# ahead of the earlier step's update (sok_graph/communication/nccl.py).
UNROLLED = ["v2:static:unrolled", "a2a:dynamic:unrolled"]
# Three workers: one config per API, both table kinds and both modes among them.
CONFIGS_3 = ["v2:static:graph", "v2:dynamic:function", "a2a:static:function",
             "dist:dynamic:graph", "v2:localized:function"]


def _run(argv, timeout=600):
    return run_process(argv, timeout)


def _merged(directory):
    """Every rank's npz of one config, with the tables merged and sorted by key."""
    files = sorted(glob.glob(os.path.join(directory, "rank*.npz")))
    assert files, f"no results in {directory}"
    parts = [dict(np.load(f)) for f in files]
    out = {"losses": parts[0]["losses"], "dense": parts[0]["dense"],
           "bytes_sent": sum(int(p["bytes_sent"]) for p in parts)}
    for p in parts[1:]:  # data-parallel values are the same on every worker
        np.testing.assert_array_equal(p["losses"], out["losses"])
        np.testing.assert_array_equal(p["dense"], out["dense"])
    t = 0
    while f"keys{t}" in parts[0]:
        keys = np.concatenate([p[f"keys{t}"] for p in parts])
        rows = np.concatenate([p[f"rows{t}"] for p in parts])
        assert len(np.unique(keys)) == len(keys), "a row is held by two workers"
        order = np.argsort(keys)
        out[f"keys{t}"], out[f"rows{t}"] = keys[order], rows[order]
        t += 1
    return out


def _compare(got, want, what):
    for k in want:
        if k == "bytes_sent":
            continue
        if k.startswith("keys"):
            np.testing.assert_array_equal(got[k], want[k], err_msg=f"{what}: {k}")
        else:
            err = rel_sq_err(got[k], want[k])
            assert err < 1e-6, f"{what}: {k} differs from single-process training " \
                               f"(relative squared error {err:.3g})"


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Single-process results for world sizes 2 and 3 (the 1.x layers' static
    tables have vocabulary x workers rows)."""
    out = {}
    for world, configs in ((2, CONFIGS + UNROLLED), (3, CONFIGS_3)):
        d = str(tmp_path_factory.mktemp(f"ref{world}"))
        _run([sys.executable, TRAIN, "--engine", "none", "--configs", ",".join(configs),
              "--world", str(world), "--out", d])
        out[world] = d
    return out


def _check_engine(engine, world, configs, reference, tmp_path):
    launch(world, TRAIN, ["--engine", engine, "--configs", ",".join(configs), "--world",
                           str(world), "--out", str(tmp_path)])
    _compare_configs(configs, tmp_path, reference[world], f"{engine}, {world} workers")


def _compare_configs(configs, directory, reference, what):
    """Each config's results in `directory` equal the single-process ones."""
    for c in configs:
        sub = c.replace(":", "-")
        got = _merged(os.path.join(directory, sub))
        _compare(got, _merged(os.path.join(reference, sub)), f"{what}, {c}")
        assert got["bytes_sent"] > 0, f"{c}: no bytes counted"


@pytest.fixture(scope="module")
def horovod_two_workers(tmp_path_factory):
    """The results of 2 Horovod workers on every workload (deduplicating
    before the exchange, the default): compared with a single process
    below, and the byte counts of the dedup test's deduplicated side."""
    out = tmp_path_factory.mktemp("horovod2")
    launch(2, TRAIN, ["--engine", "horovod", "--configs", ",".join(CONFIGS + UNROLLED),
                      "--world", "2", "--out", str(out)])
    return str(out)


@needs_horovod
def test_horovod_two_workers_equal_single_process(reference, horovod_two_workers):
    _compare_configs(CONFIGS + UNROLLED, horovod_two_workers, reference[2], "horovod, 2 workers")


@needs_horovod
def test_horovod_three_workers_equal_single_process(reference, tmp_path):
    _check_engine("horovod", 3, CONFIGS_3, reference, tmp_path)


@needs_tf2_collectives
def test_tf_distribute_two_workers_equal_single_process(reference, tmp_path):
    """The tf.distribute engine (MultiWorkerMirroredStrategy; TF_CONFIG from
    the launcher): graph mode runs in the engine's Session."""
    _check_engine("tf", 2, CONFIGS + UNROLLED, reference, tmp_path)


@needs_tf2_collectives
def test_tf_distribute_three_workers_equal_single_process(reference, tmp_path):
    _check_engine("tf", 3, CONFIGS_3, reference, tmp_path)


def _check_mirrored(world, configs, reference, tmp_path):
    """One process, a MirroredStrategy over `world` logical CPUs, each replica
    a worker (sok_graph/communication/replicas.py)."""
    _run([sys.executable, TRAIN, "--engine", "mirrored", "--configs", ",".join(configs),
          "--world", str(world), "--out", str(tmp_path)])
    _compare_configs(configs, tmp_path, reference[world], f"MirroredStrategy, {world} replicas")


@needs_tf2_collectives
def test_mirrored_two_replicas_equal_single_process(reference, tmp_path):
    """tf.distribute's MirroredStrategy with two replicas in one process:
    each replica holds a shard, in tf.function (one step a call, or two)
    and in Session graphs."""
    _check_mirrored(2, CONFIGS + UNROLLED, reference, tmp_path)


def _replica_devices(n):
    """Skips where SOK_GRAPH_TEST_MIRRORED_ON=GPU asks for n replicas on a
    machine with fewer GPUs (logical CPUs are never short)."""
    on_gpu = os.environ.get("SOK_GRAPH_TEST_MIRRORED_ON", "").upper() == "GPU"
    have = len(visible_gpus()) if on_gpu else n
    return pytest.mark.skipif(have < n, reason=f"needs {n} GPUs for {n} replicas; {have} visible")


@needs_tf2_collectives
@_replica_devices(3)
def test_mirrored_three_replicas_equal_single_process(reference, tmp_path):
    _check_mirrored(3, CONFIGS_3, reference, tmp_path)


@needs_horovod
def test_dedup_sends_fewer_bytes(reference, horovod_two_workers, tmp_path):
    """Zipf ids: deduplicating per table before the exchange sends fewer
    bytes, and training is the same either way. The deduplicated side is
    the Horovod two-worker run above (the same workloads and batches)."""
    configs = ["v2:static:function", "v2:dynamic:function"]
    sent = {}
    launch(2, TRAIN, ["--engine", "horovod", "--configs", ",".join(configs),
                      "--world", "2", "--out", str(tmp_path), "--no-dedup"])
    for dedup, out in ((True, horovod_two_workers), (False, str(tmp_path))):
        for c in configs:
            got = _merged(os.path.join(out, c.replace(":", "-")))
            _compare(got, _merged(os.path.join(reference[2], c.replace(":", "-"))), c)
            sent[(c, dedup)] = got["bytes_sent"]
    for c in configs:
        with_dedup, without = sent[(c, True)], sent[(c, False)]
        print(f"{c}: bytes sent by 2 workers over 6 steps: {with_dedup} with dedup, "
              f"{without} without ({without / with_dedup:.2f}x)")
        assert with_dedup < without, (c, with_dedup, without)


def _union(directory):
    parts = [dict(np.load(f)) for f in sorted(glob.glob(os.path.join(directory, "rank*.npz")))]
    assert parts
    out = {"step": parts[0]["step"]}
    for name in ("static", "dynamic"):
        keys = np.concatenate([p[f"{name}_keys"] for p in parts])
        order = np.argsort(keys)
        out[f"{name}_keys"] = keys[order]
        for part in ("rows", "m", "v"):
            out[f"{name}_{part}"] = np.concatenate([p[f"{name}_{part}"] for p in parts])[order]
    return out


@needs_horovod
def test_dump_load_across_world_sizes(tmp_path):
    """A chain of world sizes 2 -> 3 -> 1 -> 2 -> 1: each stage loads the
    previous stage's dump, must hold exactly what was first dumped (rows,
    Adam's m and v, the step; bit for bit), and dumps again. The first dump
    is by two workers, so their incremental dumps are checked too."""
    chain = [2, 3, 1, 2, 1]

    def run(world, args):
        if world == 1:
            _run([sys.executable, DUMP, "--engine", "none"] + args)
        else:
            launch(world, DUMP, ["--engine", "horovod"] + args)

    _check_dump_chain(chain, run, tmp_path)


def _check_dump_chain(chain, run, tmp_path):
    """run(world, args) dumps at chain[0], then each stage loads the previous
    stage's dump, must hold exactly what was first dumped, and dumps again."""
    run(chain[0], ["--phase", "dump", "--path", str(tmp_path / "ckpt0"),
                   "--out", str(tmp_path / "out0")])
    first = _union(tmp_path / "out0")
    assert first["dynamic_keys"].size > 0 and first["step"] == 3
    # sok.incremental_model_dump on each process: the whole dynamic table
    # (every row was updated after time 0), gathered from every worker.
    increments = sorted(glob.glob(os.path.join(tmp_path / "out0", "incremental*.npz")))
    assert increments
    for path in increments:
        got = np.load(path)
        order = np.argsort(got["keys"])
        np.testing.assert_array_equal(got["keys"][order], first["dynamic_keys"], err_msg=path)
        np.testing.assert_array_equal(got["rows"][order], first["dynamic_rows"], err_msg=path)
    for k, world in enumerate(chain[1:], 1):
        run(world, ["--phase", "load", "--path", str(tmp_path / f"ckpt{k - 1}"),
                    "--out", str(tmp_path / f"out{k}"), "--redump", str(tmp_path / f"ckpt{k}")])
        got = _union(tmp_path / f"out{k}")
        assert set(got) == set(first)
        for name in first:
            np.testing.assert_array_equal(
                got[name], first[name],
                err_msg=f"{name} after {chain[k - 1]} -> {world} workers")
    # A count-min sketch's counters, each the largest over the shards that
    # counted: loaded and dumped again by any number of workers, the same
    # counters (their sum, dumped before, grew with the workers each time).
    sketches = [_sketch_counts(tmp_path / f"ckpt{k}_sketch") for k in range(len(chain))]
    assert sketches[0][1].sum() > 0
    for k, (entries, counts) in enumerate(sketches[1:], 1):
        np.testing.assert_array_equal(entries, sketches[0][0])
        np.testing.assert_array_equal(counts, sketches[0][1],
                                      err_msg=f"sketch after {chain[k - 1]} -> {chain[k]} workers")


def _sketch_counts(path):
    from sok_graph import dump_load

    _, arrays = dump_load.read_dump(str(path), {"sketched_table": 4})
    return arrays["sketched_table"]["filter.keys"], arrays["sketched_table"]["filter.counts"]


@needs_tf2_collectives
@_replica_devices(3)
def test_dump_load_across_mirrored_replicas(tmp_path):
    """The same chain with MirroredStrategy replicas as the workers
    (2 replicas -> 1 process -> 3 replicas -> 1 process): rows, Adam's m and
    v and the step bit-exact at every stage."""
    def run(world, args):
        if world == 1:
            _run([sys.executable, DUMP, "--engine", "none"] + args)
        else:
            _run([sys.executable, DUMP, "--engine", "mirrored", "--world", str(world)] + args)

    _check_dump_chain([2, 1, 3, 1], run, tmp_path)  # the first dump: trained by 2 replicas
