"""The all-to-all of rows between the GPUs of one host: sok_graph's exchange
against NCCL's own all-to-all (through torch.distributed, one process per GPU)
for the same bytes.

    python bench/alltoall_bench.py --engine sok   [--gpus 2] [--mib 8,64,256] [--trace 2]
    python -m sok_graph.launch -np 2 bench/alltoall_bench.py --engine sok --workers
    python bench/alltoall_bench.py --engine torch [--gpus 2] [--mib 8,64,256]

sok runs in one process over the GPUs (MirroredStrategy), or with --workers
one process per GPU under the launcher (MultiWorkerMirroredStrategy, as
`bench/dlrm_criteo_tb.py --workers`). Two lines per size for sok: "sok" is
an exchange whose receive counts the GPUs must first tell each other (the
ids of a lookup: the host waits for them), "sok-sz" one whose counts the
host knows already (the rows sent back, and every gradient). Each is timed
twice: per exchange of a call of --iters + 1 exchanges (the call's own cost,
its dispatch and the wait for its end, spread over them), and with a "+" the
marginal cost of an exchange in a chain (a call of 2 x --iters + 1 less one
of --iters + 1, over --iters), the figure to set against NCCL's.

Each GPU sends MiB per rank (float32 rows of --dim, split evenly over the
ranks, a rank's own share included, as NCCL's tests count it) and the time is
the mean of --iters exchanges after warm-up. Printed per size: time, algbw
(bytes per rank / time) and busbw (algbw x (n-1)/n, NCCL's bus bandwidth);
the two engines' lines can be set side by side. NCCL_NVLS_ENABLE=0 (NVLink
multicast off) in every process.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")


def parse():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engine", choices=["sok", "torch"], required=True)
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--mib", default="8,64,256")
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--iters", type=int, default=20,
                   help="exchanges per call after the first (at least 1)")
    p.add_argument("--workers", action="store_true",
                   help="sok: one process per GPU under python -m sok_graph.launch")
    p.add_argument("--trace", type=int, default=0, metavar="CALLS",
                   help="sok: after the timing of each size, trace CALLS calls (each of "
                        "--iters + 1 exchanges) with TensorFlow's profiler and print the GPU "
                        "time by kernel: against the time per exchange it says whether the "
                        "GPU or the host sets the pace")
    args = p.parse_args()
    if args.iters < 1:
        p.error(f"--iters must be at least 1; got {args.iters}")
    return args


def report(engine, n, size_bytes, seconds):
    algbw = size_bytes / seconds / 1e9
    print(f"{engine:6} {n} GPUs {size_bytes / 2**20:8.1f} MiB per rank: {seconds * 1e3:8.3f} ms, "
          f"algbw {algbw:7.1f} GB/s, busbw {algbw * (n - 1) / n:7.1f} GB/s", flush=True)


def run_sok(args):
    import json

    import tensorflow as tf

    import sok_graph as sok

    if args.workers:
        nccl = tf.distribute.experimental.CommunicationImplementation.NCCL
        strategy = tf.distribute.MultiWorkerMirroredStrategy(
            communication_options=tf.distribute.experimental.CommunicationOptions(
                implementation=nccl))
        rank = int(json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0))
    else:
        strategy = tf.distribute.MirroredStrategy([f"/gpu:{i}" for i in range(args.gpus)])
        rank = 0
    with strategy.scope():
        sok.init(comm_tool="tf")
    comm = sok.context.communicator()
    if args.trace:
        import sys

        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import host_syncs
    n = strategy.num_replicas_in_sync
    for mib in (float(m) for m in args.mib.split(",")):
        rows = int(mib * 2**20 / (4 * args.dim)) // n * n

        def make(ctx):
            return tf.random.stateless_uniform([rows, args.dim], [1, ctx.replica_id_in_sync_group])

        x = strategy.experimental_distribute_values_from_function(make)
        splits = tf.constant([rows // n] * n, tf.int64)

        for label, sized in (("sok", False), ("sok-sz", True)):
            def chain(iters):
                @tf.function
                def exchange(x):
                    def replica(x):
                        out, received = comm.alltoall(x, splits)
                        for _ in range(iters):
                            # The splits an exchange returned are known on
                            # the host: an exchange sent with them is sized
                            # from there.
                            out, received = comm.alltoall(out, received if sized else splits)
                        return tf.reduce_sum(out[:1])
                    return strategy.run(replica, args=(x,))
                return exchange

            def timed(exchange):
                for _ in range(2):
                    float(strategy.reduce("SUM", exchange(x), axis=None))
                t0 = time.perf_counter()
                float(strategy.reduce("SUM", exchange(x), axis=None))
                return time.perf_counter() - t0

            exchange = chain(args.iters)
            once = timed(exchange)
            # The call's own cost (the function's dispatch, the loss's
            # all-reduce, the wait for it) is in every call: a chain twice as
            # long, less this one, leaves what --iters more exchanges cost.
            marginal = (timed(chain(2 * args.iters)) - once) / args.iters
            # iters + 1 exchanges, the first of them unsized in both modes
            if rank == 0:
                report(label, n, rows * args.dim * 4, once / (args.iters + 1))
                report(label + "+", n, rows * args.dim * 4, marginal)
            if args.trace:
                host_syncs.print_traced_steps(
                    f"rank {rank} {label} {mib:g} MiB, per call of {args.iters + 1} exchanges",
                    lambda _: strategy.reduce("SUM", exchange(x), axis=None), args.trace)


def _torch_worker(rank, args, port):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=args.gpus)
    n = args.gpus
    for mib in (float(m) for m in args.mib.split(",")):
        rows = int(mib * 2**20 / (4 * args.dim)) // n * n
        x = torch.rand(rows, args.dim, device="cuda")
        out = torch.empty_like(x)
        for _ in range(3):
            dist.all_to_all_single(out, x)
        torch.cuda.synchronize()
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(args.iters):
            dist.all_to_all_single(out, x)
        torch.cuda.synchronize()
        elapsed = (time.perf_counter() - t0) / args.iters
        if rank == 0:
            report("torch", n, rows * args.dim * 4, elapsed)
    dist.destroy_process_group()


def run_torch(args):
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_torch_worker, args=(args, port), nprocs=args.gpus, join=True)


def main():
    args = parse()
    if args.engine == "sok":
        run_sok(args)
    else:
        run_torch(args)


if __name__ == "__main__":
    main()
