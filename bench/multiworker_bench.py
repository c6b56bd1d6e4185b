"""Multi-worker training on CPU: steps/s and bytes sent per step, 1 vs 2 workers.

A DLRM-shaped model (--tables tables of --rows x 16 sok.Variables, ragged
Zipf-distributed ids, hotness 1..4, combiner sum, MLP 256-128-1) trains with
the same global batch on one worker (no communication: the baseline) and on
--workers workers (Horovod over Gloo, started by sok_graph.launch), with and
without deduplicating ids before the exchange, and on a MirroredStrategy
with --workers replicas (logical CPUs) in one process, each replica a worker
(the in-process engine; no wire at all). Each run reports the median
step time and the bytes each worker sent per step (all-to-all payloads to
other workers; sok_graph.communication counts them). The single-worker run in
the same invocation is the baseline of the printed ratios.

On one 2-core machine the workers share the cores, so the steps/s ratio says
what the exchange costs, not what more machines would gain; bytes per step
is the figure that carries over (see docs/multiworker.md for the cost model).

    python bench/multiworker_bench.py [--workers 2] [--batch 8192] [--steps 30]
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

import numpy as np

from sok_graph.data.flags import int_at_least

DIM = 16


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workers", type=int_at_least(1), default=2)
    p.add_argument("--batch", type=int_at_least(1), default=8192, help="global batch size")
    p.add_argument("--tables", type=int_at_least(1), default=8)
    p.add_argument("--rows", type=int_at_least(1), default=200_000)
    p.add_argument("--steps", type=int_at_least(1), default=30)
    p.add_argument("--zipf", type=float, default=1.2, help="Zipf exponent of the ids")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--engine", default="none", help=argparse.SUPPRESS)
    p.add_argument("--no-dedup", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.batch % args.workers:
        # Each worker takes batch // workers samples: the runs with workers
        # would train a smaller global batch than the one-process baseline.
        p.error(f"--batch {args.batch} must be a multiple of --workers {args.workers}")
    return args


def worker(args):
    """One worker: build, warm up, time --steps steps, write a JSON result."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import sok_graph as sok

    rank, world = 0, 1
    strategy = None
    if args.engine == "horovod":
        import horovod.tensorflow as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
    if args.engine == "mirrored":
        world = args.workers
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration()] * world)
        strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(world)])
        scope = strategy.scope()
        scope.__enter__()  # tables, dense variables and optimizers: the strategy's
        sok.init(comm_tool="tf")
    else:
        sok.init(comm_tool=args.engine)
    comm = sok.context.communicator()
    sok.lookup.dedup_before_exchange = not args.no_dedup
    sok.communication.count_bytes(True)
    rng = np.random.default_rng(0)
    tables = [sok.Variable(rng.uniform(-0.05, 0.05, (args.rows, DIM)).astype(np.float32))
              for _ in range(args.tables)]
    dense = [tf.Variable(rng.normal(0, 0.05, s).astype(np.float32))
             for s in ((args.tables * DIM, 256), (256, 128), (128, 1))]
    emb_opt = sok.OptimizerWrapper(tf.keras.optimizers.SGD(0.05))
    dense_opt = tf.keras.optimizers.SGD(0.05)
    local = args.batch // world

    def batch(step, rank=rank):
        r = np.random.default_rng(1000 + step * world + rank)
        ids = []
        for _ in range(args.tables):
            lengths = r.integers(1, 5, local)
            v = np.minimum(r.zipf(args.zipf, lengths.sum()) - 1, args.rows - 1)
            ids.append(tf.RaggedTensor.from_row_lengths(v.astype(np.int64), lengths))
        return ids, tf.constant(r.integers(0, 2, local).astype(np.float32))

    def replica_step(ids, labels):
        with tf.GradientTape() as tape:
            x = tf.concat(sok.lookup_sparse(tables, ids, combiners="sum"), 1)
            for i, w in enumerate(dense):
                x = tf.matmul(x, w)
                if i < len(dense) - 1:
                    x = tf.nn.relu(x)
            loss = tf.reduce_sum(tf.nn.sigmoid_cross_entropy_with_logits(
                labels=labels, logits=tf.squeeze(x, 1))) / args.batch
        grads = tape.gradient(loss, tables + dense)
        emb_opt.apply_gradients(zip(grads[:len(tables)], tables))
        dense_grads = grads[len(tables):]
        if strategy is None:  # MirroredStrategy's optimizer sums over replicas itself
            dense_grads = [comm.allreduce(g) for g in dense_grads]
        dense_opt.apply_gradients(zip(dense_grads, dense))
        return comm.allreduce(loss)

    @tf.function(reduce_retracing=True)
    def step(ids, labels):
        if strategy is None:
            return replica_step(ids, labels)

        def on_replica():  # each replica its slice: data[r]
            r = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
            return replica_step(ids[r], labels[r])

        return strategy.experimental_local_results(strategy.run(on_replica))[0]

    if strategy is None:
        data = [batch(s) for s in range(args.steps + 3)]
    else:
        data = [tuple(zip(*[batch(s, r) for r in range(world)])) for s in range(args.steps + 3)]
    for ids, labels in data[:3]:
        step(ids, labels).numpy()
    sok.communication.reset_bytes_sent()
    times = []
    for ids, labels in data[3:]:
        t0 = time.perf_counter()
        step(ids, labels).numpy()
        times.append(time.perf_counter() - t0)
    # One process counts every replica's bytes.
    senders = world if strategy is not None else 1
    result = {"rank": rank, "world": world, "median_step_s": float(np.median(times)),
              "bytes_per_step": sok.communication.bytes_sent() / args.steps / senders}
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)


def run(args, world, dedup, engine="horovod"):
    out = tempfile.mkdtemp(prefix="mwbench-")
    me = os.path.abspath(__file__)
    common = ["--worker", "--batch", str(args.batch), "--tables", str(args.tables), "--rows",
              str(args.rows), "--steps", str(args.steps), "--zipf", str(args.zipf),
              "--out", out] + ([] if dedup else ["--no-dedup"])
    if world == 1:
        cmd = [sys.executable, me, "--engine", "none"] + common
    elif engine == "mirrored":
        cmd = [sys.executable, me, "--engine", "mirrored", "--workers", str(world)] + common
    else:
        cmd = [sys.executable, "-m", "sok_graph.launch", "-np", str(world), me,
               "--engine", "horovod"] + common
    subprocess.run(cmd, check=True, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    results = [json.load(open(os.path.join(out, f))) for f in sorted(os.listdir(out))]
    return {"steps_per_s": 1.0 / max(r["median_step_s"] for r in results),
            "bytes_per_step_per_worker": float(np.mean([r["bytes_per_step"] for r in results]))}


def main():
    args = parse()
    if args.worker:
        return worker(args)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
          f"global batch {args.batch}, {args.tables} tables x {args.rows} rows x {DIM}, "
          f"Zipf {args.zipf}, {args.steps} timed steps")
    base = run(args, 1, True)
    rows = [("1 worker (baseline)", base)]
    for dedup in (True, False):
        rows.append((f"{args.workers} workers, dedup {'on' if dedup else 'off'}",
                     run(args, args.workers, dedup)))
    rows.append((f"{args.workers} MirroredStrategy replicas",
                 run(args, args.workers, True, engine="mirrored")))
    print(f"{'run':32s} {'steps/s':>9s} {'vs 1 worker':>12s} {'bytes/step/worker':>18s}")
    for name, r in rows:
        print(f"{name:32s} {r['steps_per_s']:9.2f} {r['steps_per_s'] / base['steps_per_s']:11.2f}x "
              f"{r['bytes_per_step_per_worker']:18,.0f}")
    on, off = rows[1][1], rows[2][1]
    print(f"dedup saves {1 - on['bytes_per_step_per_worker'] / off['bytes_per_step_per_worker']:.1%}"
          f" of the bytes sent per step")


if __name__ == "__main__":
    sys.exit(main())
