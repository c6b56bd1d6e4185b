"""Model parallel over the GPUs of one host: N-GPU training equals 1-GPU
training, and dumps move between GPU counts bit for bit.

The workloads are tests/multiworker's (train_worker.py: sok.lookup_sparse on
two tables, the 1.x All2AllDenseEmbedding and DistributedEmbedding; static
(distributed and localized) and dynamic tables; tf.function and
tf.compat.v1 Session graphs; dump_worker.py: rows, Adam's slots and the step).
Here the reference is a single process on one GPU, and the N-GPU run is one
process with a MirroredStrategy over N GPUs, each replica a worker holding
its shards in its GPU's memory (SOK_GRAPH_TEST_MIRRORED_ON=GPU).

    cd tests && python -m pytest -q gpu/test_multi_gpu.py

Each world size skips where fewer GPUs are visible, so the file skips
cleanly on a machine without GPUs.
"""

import functools
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from multiworker.launching import run_process  # noqa: E402
import test_multiworker as mw  # noqa: E402


@functools.lru_cache(maxsize=None)
def visible_gpus():
    """GPUs TensorFlow sees in a fresh process (0 where it sees none)."""
    try:
        out = subprocess.run(
            [sys.executable, "-c", "import tensorflow as tf; "
             "print(len(tf.config.list_physical_devices('GPU')))"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=300)
        return int(out.stdout.strip().splitlines()[-1])
    except (subprocess.SubprocessError, ValueError, IndexError):
        return 0


def needs_gpus(n):
    return pytest.mark.skipif(visible_gpus() < n,
                              reason=f"needs {n} GPUs; TensorFlow sees {visible_gpus()}")


# TensorFlow grows into each GPU's memory, as SOK's examples set it up:
# NCCL's communicators (TensorFlow's all-reduce and sok_graph's all-to-all)
# allocate outside TensorFlow's allocator, which otherwise takes all of a
# GPU but a reserve of 1.5 GiB at start, and a worker here makes a new
# strategy for each of its 14 workloads. (TF_FORCE_GPU_ALLOW_GROWTH=false in
# the environment runs them without.)
GROWTH = {"TF_FORCE_GPU_ALLOW_GROWTH": os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH", "true")}
ON_GPUS = dict(GROWTH, SOK_GRAPH_TEST_MIRRORED_ON="GPU")
ONE_GPU = dict(GROWTH, CUDA_VISIBLE_DEVICES="0")


def _train(engine, world, configs, out, env):
    run_process([sys.executable, mw.TRAIN, "--engine", engine, "--configs", ",".join(configs),
                 "--world", str(world), "--out", str(out)], timeout=900, **env)


def _train_per_gpu(engine, world, out, **env):
    """CONFIGS on `world` processes under the launcher, each pinned to a
    GPU of its own."""
    run_process([sys.executable, "-m", "sok_graph.launch", "-np", str(world), "--timeout", "840",
                 mw.TRAIN, "--engine", engine, "--configs", ",".join(CONFIGS), "--world",
                 str(world), "--out", str(out)], timeout=900, **dict(GROWTH, **env))


# Every table kind, API and mode, and two steps per tf.function call.
CONFIGS = mw.CONFIGS + mw.UNROLLED
WORLDS = [pytest.param(2, marks=needs_gpus(2)), pytest.param(4, marks=needs_gpus(4))]
# SOK_GRAPH_NCCL: "0" exchanges rows with the engine's own collectives, "1"
# with sok_graph's NCCL all-to-all (and fails where it cannot).
EXCHANGES = ["0", "1"]


@pytest.fixture(scope="module")
def one_gpu(tmp_path_factory):
    """world -> the folder of the 1-GPU reference run of CONFIGS with
    that world's global batches (made once per world)."""
    made = {}

    def reference(world):
        if world not in made:
            made[world] = tmp_path_factory.mktemp(f"one_gpu_{world}")
            _train("none", world, CONFIGS, made[world], ONE_GPU)
        return made[world]
    return reference


@pytest.mark.parametrize("nccl", EXCHANGES)
@pytest.mark.parametrize("world", WORLDS)
def test_n_gpus_train_as_one_gpu(world, nccl, one_gpu, tmp_path):
    """Every table kind, API and mode: rows, dense weights and losses on N
    GPUs of one process (MirroredStrategy) equal those on one GPU (relative
    squared error < 1e-6)."""
    _train("mirrored", world, CONFIGS, tmp_path, dict(ON_GPUS, SOK_GRAPH_NCCL=nccl))
    mw._compare_configs(CONFIGS, tmp_path, one_gpu(world),
                        f"MirroredStrategy over {world} GPUs, SOK_GRAPH_NCCL={nccl}")


@pytest.mark.parametrize("nccl", EXCHANGES)
@pytest.mark.parametrize("world", WORLDS)
def test_process_per_gpu_trains_as_one_gpu(world, nccl, one_gpu, tmp_path):
    """The same with one process per GPU under `python -m sok_graph.launch`
    (each worker pinned to its GPU; MultiWorkerMirroredStrategy and sok's
    tf.distribute engine)."""
    _train_per_gpu("tf", world, tmp_path, SOK_GRAPH_NCCL=nccl)
    mw._compare_configs(CONFIGS, tmp_path, one_gpu(world),
                        f"{world} processes, a GPU each, SOK_GRAPH_NCCL={nccl}")


@functools.lru_cache(maxsize=None)
def horovod_on_gpus():
    """Whether Horovod with NCCL GPU operations imports here (checked in a
    fresh process: scripts/build_horovod_gpu.sh builds it)."""
    out = subprocess.run(
        [sys.executable, "-c", "import horovod.tensorflow as hvd; print(bool(hvd.nccl_built()))"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, timeout=300)
    return out.returncode == 0 and out.stdout.strip().endswith("True")


@pytest.mark.parametrize("world", WORLDS)
def test_horovod_process_per_gpu_trains_as_one_gpu(world, one_gpu, tmp_path):
    """SOK's own path: Horovod with NCCL, one process per GPU (the launcher
    starts them as horovodrun would), equals one GPU."""
    if not horovod_on_gpus():
        pytest.skip("Horovod with NCCL GPU operations is not installed "
                    "(scripts/build_horovod_gpu.sh builds it)")
    _train_per_gpu("horovod", world, tmp_path)
    mw._compare_configs(CONFIGS, tmp_path, one_gpu(world),
                        f"Horovod, {world} processes, a GPU each")


@pytest.mark.parametrize("chain", [pytest.param([2, 1, 2, 1], marks=needs_gpus(2)),
                                   pytest.param([1, 4, 2, 1], marks=needs_gpus(4))])
def test_dump_on_n_gpus_loads_on_m(chain, tmp_path):
    """Dump on N GPUs, load on M: rows, Adam's m and v and the step bit for
    bit at every stage."""
    def run(world, args):
        if world == 1:
            run_process([sys.executable, mw.DUMP, "--engine", "none"] + args, **ONE_GPU)
        else:
            run_process([sys.executable, mw.DUMP, "--engine", "mirrored", "--world", str(world)]
                        + args, **ON_GPUS)

    mw._check_dump_chain(chain, run, tmp_path)


@pytest.mark.parametrize("world", [pytest.param(2, marks=needs_gpus(2)),
                                   pytest.param(4, marks=needs_gpus(4))])
def test_nccl_alltoall_equals_numpy(world):
    """sok_graph's NCCL all-to-all (uneven and empty messages, the sized
    reply, the gradient, int64 ids; tf.function and Session) as numpy's."""
    out = run_process([sys.executable, os.path.join(HERE, "nccl_alltoall_check.py"),
                       "--world", str(world)], timeout=120)
    assert out.count("as numpy's") == 2, out[-3000:]
