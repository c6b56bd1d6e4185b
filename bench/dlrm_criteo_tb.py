"""SOK's DLRM benchmark shape (Criteo Terabyte) trained model parallel over the
GPUs of one host: 26 sok tables sharded over every GPU, dense layers data
parallel (tf.distribute.MirroredStrategy, one replica per GPU).

    python bench/dlrm_criteo_tb.py --gpus 2                       # 89.5 GiB of tables
    python bench/dlrm_criteo_tb.py --gpus 1 --table_scale 0.5     # cut to fit one GPU
    python bench/dlrm_criteo_tb.py --gpus 2 --side both --table_scale 0.02   # vs plain TF
    python -m sok_graph.launch -np 2 bench/dlrm_criteo_tb.py --workers      # a process per GPU
    python -m sok_graph.launch -np 2 bench/dlrm_criteo_tb.py --horovod      # the same on Horovod
    python bench/dlrm_criteo_tb.py --cpu --gpus 2 --table_scale 1e-5 --count_ops   # ops a step

The model is the one SOK publishes its figure for: 26 tables with the
Criteo-TB cardinalities (187.8M rows), dimension 128, float32, one id per
table per sample, 13 dense features, bottom MLP 512-256-128, dot
interaction, top MLP 1024-1024-512-256-1, SGD, 8192 samples per GPU per
step. The batches are synthetic, generated on each GPU (uniform ids, or
Zipf-like ids with --ids zipf: P(id) ~ 1/(id+1)), --pool of them kept in GPU
memory and used in turn, so the step reads no host data.

--side tf trains the same model with plain TensorFlow under the same
strategy: every table replicated on every GPU (tf.Variable, gather, its
gradient all-gathered by the strategy), so only a table set that fits on
one GPU replicated can run (--table_scale). --side both runs sok then plain
TF in one process and prints the ratio.

Prints a progress line every --log_every steps and, at the end, samples/s
(total and per GPU), and with --trace N the per-step breakdown of N traced
steps (GPU time by part: lookup, all-to-all forward and backward, dense,
update; host synchronisations), read from a TensorFlow profiler trace with
bench/host_syncs.py's reader.
"""

import argparse
import math
import os
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# NVLink multicast stays off in every process (it can take a shared host's
# GPUs out of service); NCCL reads this when TensorFlow's collectives start it.
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

import numpy as np  # noqa: E402

CARDINALITIES = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546,
                 403346, 10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984,
                 585935, 12972, 108, 36]
DENSE_FEATURES = 13
BOTTOM = [512, 256, 128]
TOP = [1024, 1024, 512, 256, 1]


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--gpus", type=int, default=None, help="GPUs to use (default: all)")
    p.add_argument("--batch_per_gpu", type=int, default=8192)
    p.add_argument("--global_batch", type=int, default=None,
                   help="global batch (overrides --batch_per_gpu; must divide by --gpus)")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--table_scale", type=float, default=1.0,
                   help="rows of each table times this (at least 1 row): cuts the "
                        "tables to fit fewer GPUs")
    p.add_argument("--ids", choices=["uniform", "zipf"], default="uniform")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--pool", type=int, default=8, help="batches kept on each GPU")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--side", choices=["sok", "tf", "both"], default="sok")
    p.add_argument("--log_every", type=int, default=100)
    p.add_argument("--trace", type=int, default=0, help="trace this many steps at the end")
    p.add_argument("--trace_dir", default=None,
                   help="where the trace goes (default: a temporary folder)")
    p.add_argument("--host_level", type=int, default=2, choices=[1, 2, 3],
                   help="the profiler's host tracer level for --trace (3 records every "
                        "op's host time, at some cost to the step)")
    p.add_argument("--timeline", type=float, default=None, metavar="MIN_GAP_US",
                   help="with --trace: also print the traced steps' GPU events and host ops "
                        "in order, marking GPU idle gaps of at least MIN_GAP_US (rank 0 only)")
    p.add_argument("--bytes_per_pack", type=int, default=0, metavar="BYTES",
                   help="with --workers: the dense gradients' all-reduce in packs of about "
                        "BYTES (TensorFlow's CommunicationOptions; 0: one pack), so the "
                        "first layers' gradients reduce while the backward goes on")
    p.add_argument("--trace_top", type=int, default=8, metavar="N",
                   help="with --trace: list N entries of each ranking (device-to-host "
                        "copies, kernels, host time by op type), and host time by node")
    p.add_argument("--bytes", type=int, default=0, metavar="STEPS",
                   help="after the timed steps, count the bytes the exchanges send over "
                        "STEPS steps with ids deduplicated per table before the exchange "
                        "(the default) and without, per step and GPU")
    p.add_argument("--transfers", action="store_true",
                   help="after the timed steps, print every tensor one step moves between "
                        "devices (from the placed, partitioned graph): each GPU-to-host "
                        "one is a host synchronisation")
    p.add_argument("--steps_per_call", type=int, default=1,
                   help="training steps per call of the step function (unrolled in its "
                        "graph); --steps, --warmup, --log_every and --trace count steps "
                        "and must divide by it")
    p.add_argument("--reduce_loss", action="store_true",
                   help="each step returns the global loss, summed over the replicas into "
                        "host memory (the step then ends when the GPUs finish it); by "
                        "default the replicas' losses stay on their devices and are summed "
                        "only where a loss is printed")
    p.add_argument("--count_ops", action="store_true",
                   help="print the ops of one step's graph (constants aside) per replica, "
                        "by type and by name scope, and stop: the host's executor runs "
                        "each, so their number bounds a step that waits for the host "
                        "(works with --cpu)")
    p.add_argument("--workers", action="store_true",
                   help="one process per GPU: run under python -m sok_graph.launch -np N "
                        "(MultiWorkerMirroredStrategy, sok's tf.distribute engine)")
    p.add_argument("--horovod", action="store_true",
                   help="one process per GPU on Horovod (SOK's own set-up): run under "
                        "python -m sok_graph.launch -np N or horovodrun; sok's horovod "
                        "engine exchanges the rows, hvd.allreduce sums the dense gradients")
    p.add_argument("--cpu", action="store_true",
                   help="run on logical CPUs instead (a smoke test of the program)")
    args = p.parse_args(argv)
    if args.steps < 1:
        p.error(f"--steps must be >= 1; got {args.steps}")
    for name in ("steps", "warmup", "log_every", "trace", "bytes"):
        if args.steps_per_call < 1 or getattr(args, name) % args.steps_per_call:
            p.error(f"--{name} {getattr(args, name)} must divide by --steps_per_call "
                    f"{args.steps_per_call} (>= 1)")
    return args


def table_rows(scale):
    return [max(1, int(math.ceil(c * scale))) for c in CARDINALITIES]


class HorovodWorkers:
    """What the benchmark asks of a tf.distribute strategy, on Horovod: one
    replica per process, this process's GPU (the launcher pins one)."""

    def __init__(self, tf):
        import contextlib

        import horovod.tensorflow as hvd

        hvd.init()
        self.hvd, self.tf = hvd, tf
        self.num_replicas_in_sync = hvd.size()
        gpus = tf.config.list_logical_devices("GPU")
        device = gpus[0].name if gpus else tf.config.list_logical_devices("CPU")[0].name
        self.extended = type("Extended", (), {"worker_devices": (device,)})()
        self.scope = contextlib.nullcontext

    def experimental_distribute_values_from_function(self, fn):
        ctx = type("Context", (), {"replica_id_in_sync_group": self.hvd.rank()})()
        return fn(ctx)

    def run(self, fn, args=()):
        return fn(*args)

    def reduce(self, op, value, axis=None):
        del op, axis  # a sum of the replicas' scalars
        return self.hvd.allreduce(value, op=self.hvd.Sum)

    def sum_gradients(self, grads):
        dense = [g for g in grads if not isinstance(g, self.tf.IndexedSlices)]
        summed = iter(self.hvd.grouped_allreduce(dense, op=self.hvd.Sum) if dense else [])
        # a replicated table's gradient (plain TF): Horovod gathers the slices
        return [self.hvd.allreduce(g, op=self.hvd.Sum) if isinstance(g, self.tf.IndexedSlices)
                else next(summed) for g in grads]


def make_strategy(args, tf):
    if args.horovod:
        return HorovodWorkers(tf)
    if args.workers:
        # One process per GPU under python -m sok_graph.launch (TF_CONFIG from
        # it). The dense gradients' all-reduce goes over NCCL where the
        # workers have GPUs: TensorFlow's default for several workers is its
        # ring over gRPC, through host memory (measured: 26 ms of a 42 ms
        # step on two H200s).
        options = None
        if tf.config.list_physical_devices("GPU") and not args.cpu:
            options = tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=args.bytes_per_pack,
                implementation=tf.distribute.experimental.CommunicationImplementation.NCCL)
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    if args.cpu:
        n = args.gpus or 2
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * n)
        return tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(n)])
    gpus = tf.config.list_physical_devices("GPU")
    n = args.gpus or len(gpus)
    if len(gpus) < n or n < 1:
        raise SystemExit(f"--gpus {n}: this machine has {len(gpus)} GPUs")
    return tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(n)])


def _columns(tf, ids):
    """The rows of ids [tables, batch] int64 as one tensor per table, in one
    op. (TensorFlow's GPU Unpack of int64 works in host memory, a copy of
    every id to the host and a wait each step; its bits unpacked as float64
    stay on the GPU. A slice per table is an op per table for the host to
    run: 26 of them, and as many reshapes for the ragged ids.)"""
    return [tf.bitcast(c, tf.int64) for c in tf.unstack(tf.bitcast(ids, tf.float64))]


class DLRM:
    """Bottom MLP, one embedding per table, dot interaction, top MLP."""

    def __init__(self, tf, side, rows, dim, seed=0):
        self.tf, self.side = tf, side
        rng = np.random.default_rng(seed)
        self.dense = []
        width = DENSE_FEATURES
        # The bottom MLP ends at the embeddings' width (128 in SOK's model),
        # which the dot interaction needs.
        for k, out in enumerate(BOTTOM[:-1] + [dim]):
            self.dense.append(self._layer(rng, width, out, f"bottom{k}"))
            width = out
        features = len(rows) + 1
        width = dim + features * (features - 1) // 2
        for k, out in enumerate(TOP):
            self.dense.append(self._layer(rng, width, out, f"top{k}"))
            width = out
        init = tf.keras.initializers.RandomUniform(-0.05, 0.05)
        if side == "sok":
            import sok_graph as sok

            # Each GPU initialises its own rows: no whole table is ever made.
            self.tables = [sok.Variable(shape=[r, dim], initializer=init, name=f"table{t}")
                           for t, r in enumerate(rows)]
        else:
            self.tables = [tf.Variable(init(shape=[r, dim]), name=f"table{t}")
                           for t, r in enumerate(rows)]

    def _layer(self, rng, fan_in, fan_out, name):
        tf = self.tf
        scale = math.sqrt(2.0 / (fan_in + fan_out))
        w = tf.Variable(rng.normal(0, scale, (fan_in, fan_out)).astype(np.float32),
                        name=name + "_w")
        b = tf.Variable(np.zeros(fan_out, np.float32), name=name + "_b")
        return w, b

    def embeddings(self, ids):
        """ids: [tables, batch] int64; [batch, tables, dim]."""
        tf = self.tf
        columns = _columns(tf, ids)
        if self.side == "sok":
            import sok_graph as sok

            # One id per sample: every table's ragged ids share one row
            # splits tensor, 0..batch, made once (from_uniform_row_length
            # builds its own splits, four ops per table for the host to run
            # each step).
            batch = columns[0].shape[0]
            with tf.device("/device:CPU:0"):  # the range reads its bounds on the host
                bounds = (tf.constant(0, tf.int64), tf.constant(batch + 1, tf.int64),
                          tf.constant(1, tf.int64))
            splits = tf.range(*bounds)
            ragged = [tf.RaggedTensor.from_row_splits(c, splits, validate=False)
                      for c in columns]
            out = sok.lookup_sparse(self.tables, ragged, combiners=["sum"] * len(columns))
        else:
            out = [tf.gather(t, c) for t, c in zip(self.tables, columns)]
        return tf.stack(out, axis=1)

    def logits(self, dense_x, ids):
        tf = self.tf
        x = dense_x
        layers = iter(self.dense)
        for _ in BOTTOM:
            w, b = next(layers)
            x = tf.nn.relu(tf.nn.bias_add(tf.matmul(x, w), b))
        vectors = tf.concat([x[:, None, :], self.embeddings(ids)], axis=1)  # [B, F, dim]
        dots = tf.matmul(vectors, vectors, transpose_b=True)  # [B, F, F]
        features = vectors.shape[1]
        lower = [i * features + j for i in range(features) for j in range(i)]
        flat = tf.reshape(dots, [-1, features * features])
        x = tf.concat([x, tf.gather(flat, lower, axis=1)], axis=1)
        for k in range(len(TOP)):
            w, b = next(layers)
            # bias_add, as Keras' Dense: its gradient is one BiasAddGrad, where
            # a broadcast add's is a column Sum (0.1 ms each on an H200).
            x = tf.nn.bias_add(tf.matmul(x, w), b)
            if k < len(TOP) - 1:
                x = tf.nn.relu(x)
        return tf.squeeze(x, 1)

    def dense_variables(self):
        return [v for layer in self.dense for v in layer]


def make_pool(strategy, args, rows, tf):
    """--pool batches per replica, generated on its device: dense features,
    ids (one per table, [tables, batch] per batch), labels."""
    batch = args.global_batch // strategy.num_replicas_in_sync
    high = tf.constant(rows, tf.float32 if args.ids == "zipf" else tf.int64)[:, None]

    def generate(ctx):
        seed = tf.constant([17, ctx.replica_id_in_sync_group], tf.int32)
        shape = [args.pool, len(rows), batch]
        if args.ids == "zipf":
            # P(id) ~ 1/(id+1): (rows+1)^u - 1 for u uniform in [0, 1).
            u = tf.random.stateless_uniform(shape, seed)
            ids = tf.cast(tf.floor(tf.exp(u * tf.math.log(high + 1.0))) - 1.0, tf.int64)
            ids = tf.minimum(ids, tf.cast(high, tf.int64) - 1)
        else:
            ids = tf.random.stateless_uniform(shape, seed, minval=0, maxval=tf.int64.max,
                                              dtype=tf.int64) % high
        dense = tf.random.stateless_normal([args.pool, batch, DENSE_FEATURES], seed + 1)
        labels = tf.cast(tf.random.stateless_uniform([args.pool, batch], seed + 2) < 0.25,
                         tf.float32)
        return dense, ids, labels

    return strategy.experimental_distribute_values_from_function(generate)


def build_step(strategy, model, args, tf):
    import sok_graph as sok

    dense_opt = tf.keras.optimizers.SGD(args.lr)
    if model.side == "sok":
        table_opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(args.lr))
    else:
        table_opt = dense_opt
    global_batch = float(args.global_batch)

    def replica_step(pool, k):
        dense_x, ids, labels = (tf.gather(p, k) for p in pool)
        with tf.GradientTape() as tape:
            logits = model.logits(dense_x, ids)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=labels, logits=logits)) / global_batch
        dense_vars = model.dense_variables()
        grads = tape.gradient(loss, model.tables + dense_vars)
        n = len(model.tables)
        if isinstance(strategy, HorovodWorkers):
            # A strategy's optimizer sums the replicas' gradients itself; sok
            # tables' gradients are this worker's shard's already.
            first = n if model.side == "sok" else 0
            grads = grads[:first] + strategy.sum_gradients(grads[first:])
        if model.side == "sok":
            table_opt.apply_gradients(zip(grads[:n], model.tables))
            dense_opt.apply_gradients(zip(grads[n:], dense_vars))
        else:
            dense_opt.apply_gradients(zip(grads, model.tables + dense_vars))
        return loss

    @tf.function
    def step(pool, k):
        # --steps_per_call steps, unrolled: one Python call (about 1 ms of
        # the host's time on a multi-GPU machine, with the GPUs idle) runs
        # them all, and the host can start a step while the GPUs finish the
        # one before, as Keras' steps_per_execution does.
        for j in range(args.steps_per_call):
            losses = strategy.run(replica_step, args=(pool, (k + j) % args.pool))
        if args.reduce_loss:
            return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
        # Each replica's loss stays on its device: a step that returned a
        # value in host memory would end only when the GPUs finish it, and
        # the GPUs would idle while the host starts the next call.
        return losses

    def loss_of(losses):
        """The global batch's loss as a float (waits for the step)."""
        if not args.reduce_loss:
            losses = strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)
        return float(losses)

    step.loss_of = loss_of
    return step


def _run_steps(step, pool, args, tf, steps, start=0):
    """Runs `steps` training steps (calls of --steps_per_call steps) on pool
    batches start, start + 1, ...; the last call's losses."""
    loss = None
    for i in range(start, start + steps, args.steps_per_call):
        loss = step(pool, tf.constant(i % args.pool))
    return loss


def _trace_breakdown(strategy, step, pool, args, tf, steps):
    """GPU time per part and host waits per step, from a profiler trace."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import host_syncs

    logdir = args.trace_dir or tempfile.mkdtemp(prefix="dlrm_tb_trace_")
    rank = _rank(args)
    if args.trace_dir and (args.workers or args.horovod):
        logdir = os.path.join(logdir, f"rank{rank}")  # one trace per process
    tf.profiler.experimental.start(logdir, options=tf.profiler.experimental.ProfilerOptions(
        host_tracer_level=args.host_level))
    loss = _run_steps(step, pool, args, tf, steps)
    step.loss_of(loss)
    tf.profiler.experimental.stop()
    space = host_syncs._xspace(logdir)
    planes, blocking, dtoh, op_time, device_time = host_syncs.analyse(space)
    parts = {"lookup": 0, "all-to-all forward": 0, "all-to-all backward": 0, "dense": 0,
             "update": 0, "other": 0}
    gpus = strategy.num_replicas_in_sync
    for plane in space.planes:
        if not plane.name.startswith("/device:GPU"):
            continue
        for _, line, name, s, e, op in host_syncs._events(plane, with_op=True):
            if "Stream" not in line:
                continue
            parts[_part_of(op, name)] += e - s
    print(f"per step, mean over {steps} traced steps and {gpus} GPUs (GPU busy time, ms):")
    for part, ps in parts.items():
        print(f"  {part:22} {ps / 1e9 / steps / gpus:8.3f}")
    # Waits of the host show as CUDA API calls (a CUPTI plane), which not
    # every TensorFlow records (2.21 does not): then the device-to-host
    # copies, each of which a host thread waits for, are the count to read.
    if any("CUPTI" in name for name in planes):
        waits = sum(blocking.values())
        print(f"  host synchronisations per step (all replicas): {waits / steps:.1f}")
    else:
        print("  host synchronisations per step: not in this trace (no CUDA API events)")
    print(f"  device-to-host copies per step (all replicas): {sum(dtoh.values()) / steps:.1f}")
    top = args.trace_top
    for op, count in dtoh.most_common(top):
        print(f"    {count / steps:5.1f}  {op}")
    for (op, call), count in blocking.most_common(top):
        print(f"    {count / steps:5.1f}  {op:32} {call}")
    print("  GPU kernels and copies by busy time (ms per step and GPU):")
    for name, ps in device_time.most_common(top):
        print(f"    {ps / 1e9 / steps / gpus:7.3f}  {name}")
    print("  host time by TensorFlow op type (ms per step, all replicas):")
    for name, ps in op_time.most_common(top):
        print(f"    {ps / 1e9 / steps:7.3f}  {name}")
    if top > 8:
        print("  host time by node, numbered repeats folded (ms per step, all replicas):")
        for name, ps in host_syncs.host_time_by_node(space).most_common(top):
            print(f"    {ps / 1e9 / steps:7.3f}  {name}")
    if args.timeline is not None and rank == 0:
        print(f"  the traced steps in order (GPU idle gaps of {args.timeline:g} us or more):")
        host_syncs.timeline(space, args.timeline)


def _rank(args):
    """This process's rank among the workers (0 in one process)."""
    if args.horovod:
        import horovod.tensorflow as hvd

        return hvd.rank()
    if args.workers:
        import json

        return int(json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0))
    return 0


def _part_of(op, name):
    """The part of the step a GPU event belongs to, from its TensorFlow op."""
    backward = "gradient" in op.lower()
    if "sok_alltoall" in op or "sok_exchange" in op or "MemcpyP2P" in name \
            or "PtoP" in name or "DtoD" in name:
        return "all-to-all backward" if backward else "all-to-all forward"
    if "sok_lookup_sparse" in op or "SokFusedLookup" in op:
        return "lookup"
    if "SGD" in op or "Sok" in op and "Apply" in op or "OptimizerWrapper" in op \
            or "ResourceScatter" in op or "ApplyGradient" in op:
        return "update"
    if "MatMul" in op or "Relu" in op or "BiasAdd" in op or "gemm" in name.lower() \
            or "sigmoid" in op.lower():
        return "dense"
    return "other"


def run_side(side, strategy, args, rows, tf):
    import sok_graph as sok

    n = strategy.num_replicas_in_sync
    t0 = time.time()
    with strategy.scope():
        if side == "sok":
            sok.context.reset()
            sok.init(comm_tool="horovod" if args.horovod else "tf",
                     use_legacy_optimizer=False)
        model = DLRM(tf, side, rows, args.dim)
        step = build_step(strategy, model, args, tf)
    print(f"[{side}] tables built in {time.time() - t0:.1f} s", flush=True)
    pool = make_pool(strategy, args, rows, tf)
    if args.count_ops:
        # A worker process's graph holds its own replica only.
        _count_ops(step, pool, 1 if args.workers or args.horovod else n, side, tf,
                   args.steps_per_call)
        return None
    t0 = time.time()
    if args.transfers:
        _first_step_with_transfers(step, pool, tf, side, args)
    loss = _run_steps(step, pool, args, tf, args.warmup)
    first = step.loss_of(loss)
    print(f"[{side}] {args.warmup} warm-up steps in {time.time() - t0:.1f} s, loss {first:.4f}",
          flush=True)
    t0 = last = time.time()
    for i in range(0, args.steps, args.log_every or args.steps):
        loss = _run_steps(step, pool, args, tf, min(args.log_every or args.steps, args.steps - i),
                          start=i)
        if args.log_every and i + args.log_every <= args.steps:
            value = step.loss_of(loss)
            now = time.time()
            print(f"[{side}] step {i + args.log_every}/{args.steps}: loss {value:.4f}, "
                  f"{args.log_every * args.global_batch / (now - last) / 1e6:.3f}M samples/s",
                  flush=True)
            last = now
    value = step.loss_of(loss)
    elapsed = time.time() - t0
    rate = args.steps * args.global_batch / elapsed
    print(f"[{side}] {n} replica(s), global batch {args.global_batch}: "
          f"{elapsed / args.steps * 1e3:.2f} ms/step, {rate / 1e6:.3f}M samples/s, "
          f"{rate / n / 1e6:.3f}M per replica (loss {value:.4f})", flush=True)
    if args.trace:
        _trace_breakdown(strategy, step, pool, args, tf, args.trace)
    if args.bytes and side == "sok":
        _bytes_per_step(strategy, model, pool, args, tf)
    return rate


def _count_ops(step, pool, replicas, side, tf, steps_per_call=1):
    """The ops of one step's graph besides constants, per replica: by op type
    and by name scope (replica prefixes and numeric suffixes folded, so the
    same op of every table counts as one name)."""
    import collections
    import re

    graph = step.get_concrete_function(pool, tf.constant(0)).graph.as_graph_def()
    nodes = [node for node in graph.node if node.op != "Const"]
    for f in graph.library.function:
        nodes.extend(node for node in f.node_def if node.op != "Const")

    def scope(name):
        parts = [p for p in name.split("/") if not p.startswith("replica_")]
        return "/".join(re.sub(r"_\d+$", "_N", p) for p in parts[:4])

    print(f"[{side}] one step: {len(nodes) / replicas / steps_per_call:.0f} ops per replica "
          f"besides constants ({replicas} replica(s) in this graph; a call unrolls "
          f"{steps_per_call} step(s))")
    for title, key in (("by op type", lambda node: node.op),
                       ("by name scope", lambda node: scope(node.name))):
        counts = collections.Counter(key(node) for node in nodes)
        print(f"  {title}:")
        for name, count in counts.most_common(40):
            print(f"    {count / replicas / steps_per_call:7.1f}  {name}")


def _bytes_per_step(strategy, model, pool, args, tf):
    """Bytes the forward exchange (ids, and rows back) sends to other GPUs
    per step and GPU, with and without deduplication before the exchange.
    Counting is fixed when a step is traced, so each count gets a new step;
    they train the model further, after the timed steps."""
    import sok_graph as sok

    n = strategy.num_replicas_in_sync
    sent = {}
    for dedup in (True, False):
        sok.lookup.dedup_before_exchange = dedup
        sok.communication.count_bytes(True)
        with strategy.scope():
            counted = build_step(strategy, model, args, tf)
        counted.loss_of(counted(pool, tf.constant(0)))  # traced now, with counting on
        sok.communication.count_bytes(False)
        sok.communication.reset_bytes_sent()
        counted.loss_of(_run_steps(counted, pool, args, tf, args.bytes))
        # One process counts every replica it runs.
        local = 1 if args.workers or args.horovod else n
        sent[dedup] = sok.communication.bytes_sent() / args.bytes / local
    sok.lookup.dedup_before_exchange = True
    # The count covers the forward exchange (ids out, rows back); the
    # backward sends the rows' gradients, as many bytes as the rows.
    print(f"[sok] forward exchange, bytes sent to other GPUs per step and GPU ({args.ids} ids, "
          f"dim {args.dim}): "
          f"{sent[True] / 1e6:.2f} MB with dedup, {sent[False] / 1e6:.2f} MB without "
          f"({sent[False] / max(sent[True], 1):.2f}x)", flush=True)


def _first_step_with_transfers(step, pool, tf, side, args):
    """The first step, with the tensors it moves between devices printed:
    TensorFlow records a function's partitioned graphs when it instantiates
    the function, so this must be its first call."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import host_syncs
    from tensorflow.python.eager import context as eager_context

    ctx = eager_context.context()
    ctx.enable_run_metadata()
    try:
        loss = step(pool, tf.constant(0))
        step.loss_of(loss)
        metadata = ctx.export_run_metadata()
    finally:
        ctx.disable_run_metadata()
    host_syncs.print_transfers(host_syncs.transfers(metadata),
                               f"[{side}] one call ({args.steps_per_call} step(s))")
    return loss


def main(argv=None):
    args = parse(argv)
    import tensorflow as tf

    strategy = make_strategy(args, tf)
    n = strategy.num_replicas_in_sync
    if args.global_batch is None:
        args.global_batch = args.batch_per_gpu * n
    if args.global_batch % n:
        raise SystemExit(f"--global_batch {args.global_batch} must divide by {n} replicas")
    rows = table_rows(args.table_scale)
    gib = sum(rows) * args.dim * 4 / 2**30
    print(f"DLRM Criteo-TB shape: {len(rows)} tables, {sum(rows):,} rows x {args.dim} "
          f"(float32: {gib:.1f} GiB, {gib / n:.1f} GiB per replica sharded), "
          f"{n} replicas on {strategy.extended.worker_devices}, global batch "
          f"{args.global_batch}, ids {args.ids}", flush=True)
    rates = {}
    for side in (["sok", "tf"] if args.side == "both" else [args.side]):
        rates[side] = run_side(side, strategy, args, rows, tf)
    if len(rates) == 2 and not args.count_ops:
        print(f"sok / plain TF: {rates['sok'] / rates['tf']:.2f}x samples/s")


if __name__ == "__main__":
    main()
