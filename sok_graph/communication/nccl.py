"""Rows between GPUs through NCCL: the all-to-all of the engines whose
workers are GPUs.

An engine whose every rank is a GPU (the replicas of a MirroredStrategy over
the GPUs of one process today) exchanges ids, rows and their gradients with
sok_graph's NCCL op (tf_ops/collective, sok_graph/ops/collective.py):
grouped ncclSend/ncclRecv on each GPU's own stream, GPU to GPU. NCCL is
loaded when the first exchange runs; this module finds its library (the
`nvidia-nccl-cu12`/`-cu13` wheels, or libnccl.so.2 on the loader's path)
and loads it first so the op's dlopen finds it.

SOK_GRAPH_NCCL chooses: "auto" (the default) uses NCCL where there are two
ranks or more and it is found, and the engine's own exchange elsewhere; "0"
never uses it; "1" requires it (an error where it cannot be used).

Status (2 x H200, 2026-11-28): N-GPU training equals 1-GPU training through
it (tests/gpu/test_multi_gpu.py: MirroredStrategy over 2 GPUs, and one
process per GPU under sok_graph.launch), and dumps move between 1 and 2
GPUs through it bit for bit.

Memory: NCCL allocates its buffers with cudaMalloc, outside TensorFlow's
allocator, which by default takes all of a GPU's memory but a reserve
(1.5 GiB on an H200) when it starts. A communicator per process fits in
that reserve beside TensorFlow's own all-reduce; a process that makes many
strategies one after another runs out (NCCL_DEBUG=WARN: "Cuda failure 2 'out
of memory'"), as TensorFlow's own NCCL all-reduce then does. Memory growth
(tf.config.experimental.set_memory_growth, as SOK's examples set it up)
leaves NCCL room; the workers' clique is drawn once per process and shared
by every engine over the same workers.

The hang of the first runs was TensorFlow's: in a tf.function it ordered
one replica's exchange after another replica's side effects (fixed by
compat.order_side_effects_per_replica). The op also runs NCCL on a stream
of its own per rank. Between the GPUs of one process it completes when that
stream has finished, so the compute stream never waits for a peer; with one
process per GPU it completes once queued, the compute stream waiting for the
NCCL stream on the GPU, so the host does not wait for each exchange
(tf_ops/collective/kernels/nccl_kernels_gpu.cc says why each).

The exchange of a lookup is an all-to-all of ids whose sizes only the
device knows, then the reply with the rows, then in the backward the
gradient the same two ways. Only the first waits for the device (to learn
how many rows arrive): each all-to-all returns its splits in host memory,
and `Transport.alltoall` recognises splits that came out of an earlier
exchange of the same graph, whose reply is then sized from the host.

NVLink multicast stays off (NCCL_NVLS_ENABLE=0) in every process that uses
this: it can take a shared host's GPUs out of service.
"""

import ctypes
import glob
import os
import sys
import threading

import tensorflow as tf

from sok_graph import compat
from sok_graph.ops import collective as collective_ops
from sok_graph.ops import library

ENV = "SOK_GRAPH_NCCL"
_SONAME = "libnccl.so.2"
_lock = threading.Lock()
_loaded = None  # (ctypes library, path) once found
_why_not = None  # why NCCL could not be loaded


def _candidates():
    """The bare soname first, then the paths of libnccl.so.2 in the
    nvidia-nccl wheels on sys.path.

    The op (tf_ops/collective) opens the soname, which gives the NCCL this
    process already holds, or the loader's first on its path. Loading that
    same library here keeps the unique id and the communicators on one
    NCCL, and every worker on the same one: a copy loaded by path beside
    another that TensorFlow loaded by name made two workers of one job run
    two NCCL versions (2.28.3 and 2.28.9), which NCCL refuses."""
    yield _SONAME
    for entry in sys.path:
        if entry and os.path.isdir(entry):
            yield from sorted(glob.glob(os.path.join(entry, "nvidia", "nccl", "lib", _SONAME)))


def load_library():
    """The loaded NCCL (a ctypes.CDLL), or None; why_not() says why not."""
    global _loaded, _why_not
    with _lock:
        if _loaded is None and _why_not is None:
            errors = []
            for path in _candidates():
                try:
                    _loaded = (ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL), path)
                    break
                except OSError as e:
                    errors.append(f"{path}: {e}")
            if _loaded is None:
                _why_not = ("NCCL was not found (" + "; ".join(errors) + "); install it with "
                            "`pip install nvidia-nccl-cu12`")
        return _loaded[0] if _loaded else None


def why_not():
    return _why_not


def mode():
    value = os.environ.get(ENV, "auto").strip().lower()
    if value not in ("auto", "0", "1"):
        raise ValueError(f"{ENV} must be 'auto', '0' or '1'; got {value!r}")
    return value


def usable(devices, world_size=None):
    """Whether the engine over `devices` (device strings: every rank's, or
    this process's of `world_size` ranks) exchanges through NCCL: every
    rank a GPU of its own, a GPU build, NCCL loadable, SOK_GRAPH_NCCL not
    0, and under "auto" two ranks or more. Raises where SOK_GRAPH_NCCL=1
    and it cannot."""
    wanted = mode()
    if wanted == "0":
        return False
    if wanted == "auto" and (len(devices) if world_size is None else world_size) < 2:
        return False
    reasons = []
    if not devices or not all(tf.DeviceSpec.from_string(d).device_type == "GPU"
                              for d in devices):
        reasons.append(f"the ranks are not all GPUs ({list(devices)})")
    elif not library.built_with_cuda():
        reasons.append("sok_graph was built without CUDA")
    else:
        split = _split_gpus()
        if split:
            reasons.append(f"this process's {split} logical GPUs share fewer physical ones "
                           f"(NCCL takes one rank per GPU)")
        elif load_library() is None:
            reasons.append(why_not())
    if reasons and wanted == "1":
        raise RuntimeError(f"{ENV}=1 but NCCL cannot exchange the rows: {reasons[0]}")
    return not reasons


def _split_gpus():
    """The number of this process's logical GPUs where there are more of them
    than physical GPUs (tf.config's logical device configuration split
    one), else 0. Only this process's own devices count: once a
    MultiWorkerMirroredStrategy has connected the cluster, the logical
    devices list every worker's GPUs too."""
    logical = len(_local_devices(tf.config.experimental.list_logical_devices("GPU")))
    physical = len(tf.config.experimental.list_physical_devices("GPU"))
    return logical if logical > physical else 0


def _local_devices(devices):
    """The logical devices of `devices` that belong to this process."""
    from tensorflow.python.eager import context as eager_context

    # TF 1.15's eager context has no address: it never connects a cluster,
    # so its own devices are the local ones.
    address = getattr(eager_context.context(), "host_address_space", None)
    here = tf.DeviceSpec.from_string(address()) if address is not None else None
    local = []
    for device in devices:
        spec = tf.DeviceSpec.from_string(device.name)
        if spec.job in (None, "localhost") or (
                here is not None and (spec.job, spec.task) == (here.job, here.task)):
            local.append(device)
    return local


def unique_id_hex():
    """A fresh ncclUniqueId as hex, drawn by rank 0 of a multi-process
    clique (for the engine to broadcast)."""
    nccl = load_library()
    if nccl is None:
        raise RuntimeError(why_not())
    buf = ctypes.create_string_buffer(128)
    rc = nccl.ncclGetUniqueId(buf)
    if rc != 0:
        raise RuntimeError(f"ncclGetUniqueId failed with NCCL error {rc}")
    return buf.raw.hex()


# (cluster, task, GPU) -> the hex unique id of that worker's clique, drawn
# once: every engine over the same workers shares one communicator.
_cliques = {}


def known_clique(key):
    """The clique this process joined for `key` before, or None."""
    with _lock:
        return _cliques.get(key)


def remember_clique(key, clique):
    with _lock:
        _cliques[key] = clique
    return clique


class Transport:
    """The all-to-all of one clique of ranks (see the module's docstring).
    `clique` is "local:<devices>" for the GPUs of this process or a unique
    id's hex for one GPU per process."""

    def __init__(self, clique, world_size):
        os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
        # Each rank launches its kernels from its own thread; NCCL's GROUP
        # launch mode would make the ranks of one process wait for each other
        # at every launch.
        os.environ.setdefault("NCCL_LAUNCH_MODE", "PARALLEL")
        self.clique = clique
        self.world_size = world_size

    @classmethod
    def local(cls, devices):
        names = ",".join(tf.DeviceSpec.from_string(d).to_string() for d in devices)
        return cls("local:" + names, len(devices))

    def _known(self):
        if tf.executing_eagerly():
            return None
        # {splits tensor's ref: the splits of the reverse direction}, per
        # graph and communicator
        known = compat.graph_state(tf.compat.v1.get_default_graph(), "nccl_reverse_splits")
        return known.setdefault(self.clique, {})

    def alltoall(self, tensor, splits, rank, name=None, padded=False):
        """(received rows, received splits [world_size] int64) on `rank`'s
        device (the caller's device scope). padded: `tensor` may have rows
        past the splits' sum, not sent."""
        known = self._known()
        reverse = known.get(splits.ref()) if known is not None else None
        if reverse is not None:
            received = collective_ops.alltoall_sized(tensor, splits, reverse, self.clique, rank,
                                                     self.world_size, name=name)
            received_splits, sent_splits = reverse, splits
        else:
            received, received_splits, sent_splits = collective_ops.alltoall(
                tensor, splits, self.clique, rank, self.world_size, padded=padded, name=name)
        if known is not None:
            known[received_splits.ref()] = sent_splits
        return received, received_splits
