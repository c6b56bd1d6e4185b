"""Host synchronisations per training step, from a TensorFlow profiler trace.

Runs bench/e2e_bench.py's DLRM step (sok side and plain-TF side, tf.function
and graph mode) on the GPU, traces --steps steps with tf.profiler, and reads
the trace (XSpace protobuf, the format TensorBoard's profile plugin reads):

  - every CUDA driver/runtime call that makes the host wait for the GPU
    (cu*Synchronize, and the blocking device-to-host copies cuMemcpyDtoH /
    cudaMemcpy), attributed to the TensorFlow op running on that thread;
  - every device-to-host copy the GPU ran (Memcpy DtoH on the device plane).

    python bench/host_syncs.py [--steps 5] [--mode function|graph|both] [--side sok|tf|gather|both]

Prints per step: the blocking calls by TensorFlow op, and the DtoH copies.
The benchmark's own `loss.numpy()` / `sess.run(loss)` at the end of a step
is one DtoH copy that every step of any model has.
"""

import argparse
import collections
import glob
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_bench  # noqa: E402

# CUDA API calls that make the host wait for the GPU: every *Synchronize,
# and the synchronous (not *Async) copies.
BLOCKING_COPIES = ("cuMemcpyDtoH", "cuMemcpy", "cudaMemcpy")


def _xspace(logdir):
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    paths = glob.glob(os.path.join(logdir, "**", "*.xplane.pb"), recursive=True)
    if not paths:
        raise SystemExit(f"no *.xplane.pb under {logdir}")
    space = xplane_pb2.XSpace()
    with open(sorted(paths)[-1], "rb") as f:
        space.ParseFromString(f.read())
    return space


def _events(plane, with_op=False):
    """(line id, line name, event name, start ps, end ps[, tf_op]) of every
    event; tf_op is the TensorFlow op a device event ran for."""
    names = {k: v.name for k, v in plane.event_metadata.items()}
    stat_names = {k: v.name for k, v in plane.stat_metadata.items()}
    for line in plane.lines:
        base = line.timestamp_ns * 1000
        for e in line.events:
            start = base + e.offset_ps
            out = (line.id, line.name, names.get(e.metadata_id, "?"), start,
                   start + e.duration_ps)
            if with_op:
                op = ""
                for st in e.stats:
                    if stat_names.get(st.metadata_id) == "tf_op":
                        op = st.str_value or stat_names.get(st.ref_value, "")
                out += (op,)
            yield out


def _op_type(traceme):
    """The op type of a TensorFlow op's TraceMe name ("scope/name:Type"), else
    None (kernel launches and executor events have other names)."""
    if ":" not in traceme or "(" in traceme or " " in traceme or traceme.startswith("__"):
        return None
    kind = traceme.rsplit(":", 1)[1]
    return kind if kind.isidentifier() else None


def _is_blocking(name):
    return "Synchronize" in name or (name.split("_v")[0] in BLOCKING_COPIES)


def analyse(space):
    """(planes, blocking calls by (op, call), device-to-host copies,
    host time by TensorFlow op type, device time by kernel/copy name) of a
    trace."""
    host_ops = collections.defaultdict(list)  # thread id -> [(start, end, name)]
    blocking, dtoh, planes = [], collections.Counter(), []
    op_time, device_time = collections.Counter(), collections.Counter()
    for plane in space.planes:
        planes.append(plane.name)
        if plane.name.startswith("/host:CPU"):
            for tid, _, name, s, e in _events(plane):
                host_ops[tid].append((s, e, name))
                kind = _op_type(name)
                if kind:
                    op_time[kind] += e - s
    for plane in space.planes:
        if "CUPTI" in plane.name:
            for tid, _, name, s, e in _events(plane):
                if _is_blocking(name):
                    blocking.append((tid, name, s, e))
        elif plane.name.startswith("/device:GPU"):
            for _, line, name, s, e, op in _events(plane, with_op=True):
                if "D2H" in name or "DtoH" in name:
                    dtoh[op.split(":")[-1] or "(no TensorFlow op)"] += 1
                if "Stream" in line:
                    device_time[name[:70]] += e - s
    by_op = collections.Counter()
    for tid, name, s, e in blocking:
        enclosing = [(os_, oe, on) for os_, oe, on in host_ops.get(tid, []) if os_ <= s and e <= oe]
        # The innermost TensorFlow op (TraceMe names look like "name:Type").
        ops = [on for os_, oe, on in sorted(enclosing, key=lambda x: x[1] - x[0]) if ":" in on]
        by_op[(ops[0].split(":")[-1] if ops else "(no TensorFlow op)", name)] += 1
    return planes, by_op, dtoh, op_time, device_time


def print_traced_steps(name, step, count, top=14):
    """Runs step(i) for i < count under TensorFlow's profiler and prints the
    GPU time per step by TensorFlow op type and by CUDA kernel (an op such
    as a table's lookup runs several), and the device-to-host copies per
    step. For the benchmarks that trace one side of theirs (--trace)."""
    logdir = tempfile.mkdtemp(prefix="sok_trace_")
    tf.profiler.experimental.start(logdir)
    for i in range(count):
        out = step(i)
    float(out)  # waits for the last step
    tf.profiler.experimental.stop()
    space = _xspace(logdir)
    _, _, dtoh, _, _ = analyse(space)
    by_op, by_kernel = collections.Counter(), collections.Counter()
    for plane in space.planes:
        if plane.name.startswith("/device:GPU"):
            for _, line, kernel, s, e, op in _events(plane, with_op=True):
                if "Stream" in line:
                    by_op[(op.split(":")[-1] or kernel[:40])] += e - s
                    by_kernel[kernel.replace("(anonymous namespace)::", "").split("(")[0].split("<")[0][-60:]] += e - s
    total = sum(by_op.values())
    print(f"{name}: GPU busy {total / 1e9 / count:.3f} ms per step; by TensorFlow op type:")
    for op, ps in by_op.most_common(top):
        print(f"  {ps / 1e9 / count:8.3f}  {op}")
    print("  by kernel:")
    for kernel, ps in by_kernel.most_common(top):
        print(f"  {ps / 1e9 / count:8.3f}  {kernel}")
    print(f"  device-to-host copies per step: {sum(dtoh.values()) / count:.1f} "
          f"({', '.join(f'{op} {c / count:.1f}' for op, c in dtoh.most_common(5))})")


def host_time_by_node(space):
    """Host time (ps) of each TensorFlow op's TraceMe by node name, numeric
    suffixes folded (_base_name): which ops of a step cost its host most."""
    by_node = collections.Counter()
    for plane in space.planes:
        if plane.name.startswith("/host:CPU"):
            for _, _, name, s, e in _events(plane):
                if _op_type(name):
                    by_node[_base_name(name.rsplit(":", 1)[0])] += e - s
    return by_node


def _device_kind(name):
    """"GPU:0" / "CPU:0" (with the task where the name has one) of a device name."""
    spec = name.rsplit("/", 1)[-1].replace("device:", "")
    task = [p for p in name.split("/") if p.startswith("task:")]
    return f"{task[0]}/{spec}" if task else spec


def _base_name(node):
    """A node's name without the numeric suffixes TensorFlow adds to repeats
    (Gather_12 -> Gather_N), so the same op of every table counts as one."""
    parts = []
    for part in node.split("/"):
        head, _, tail = part.rpartition("_")
        parts.append(head + "_N" if head and tail.isdigit() else part)
    return "/".join(parts)


def transfers(run_metadata):
    """Tensors a traced step moved between devices, from the partitioned
    graphs in `run_metadata` (a RunMetadata: eager's export_run_metadata()
    after a tf.function call, or a Session's with output_partition_graphs).

    Returns a Counter of (sending device -> receiving device, source op
    type, source op name, consumer op types) -> count. A tensor a GPU op
    sends to a host op is a device-to-host copy that the host's executor
    waits for: each is a host synchronisation of the step. `_HostSend`
    tensors (kernels' host-memory outputs) need no copy and are marked."""
    sends, consumers = {}, collections.defaultdict(set)
    graphs = [g for fg in run_metadata.function_graphs for g in fg.partition_graphs]
    graphs += list(run_metadata.partition_graphs)
    for graph in graphs:
        nodes = {n.name: n for n in graph.node}
        recv_of = {}
        for n in graph.node:
            if n.op in ("_Recv", "_HostRecv"):
                recv_of[n.name] = n.attr["tensor_name"].s.decode()
        for n in graph.node:
            for inp in n.input:
                src = inp.lstrip("^").split(":")[0]
                if src in recv_of and not inp.startswith("^"):
                    consumers[recv_of[src]].add(n.op)
            if n.op in ("_Send", "_HostSend"):
                src = n.input[0].lstrip("^").split(":")[0]
                # A function's partitions can be recorded more than once.
                send_dev = n.attr["send_device"].s.decode()
                recv_dev = n.attr["recv_device"].s.decode()
                tensor = n.attr["tensor_name"].s.decode()
                sends[(send_dev, recv_dev, tensor)] = (n.op, nodes[src].op if src in nodes
                                                       else "?", src)
    out = collections.Counter()
    for (send_dev, recv_dev, tensor), (op, src_op, src) in sends.items():
        route = f"{_device_kind(send_dev)} -> {_device_kind(recv_dev)}"
        if op == "_HostSend":
            route += " (host memory)"
        used_by = ",".join(sorted(consumers.get(tensor, {"?"})))
        out[(route, src_op, _base_name(src), used_by)] += 1
    return out


def print_transfers(counter, title, top=40):
    """The report of transfers() grouped by route, device-to-host first."""
    print(f"{title}: {sum(counter.values())} tensors moved between devices")
    routes = collections.Counter()
    for (route, *_), count in counter.items():
        routes[route] += count
    for route, count in routes.most_common():
        print(f"  {count:5}  {route}")
    for (route, src_op, src, used_by), count in sorted(
            counter.items(), key=lambda kv: ("GPU" not in kv[0][0].split("->")[0], -kv[1]))[:top]:
        print(f"  {count:5}  {route:34} {src_op:24} {src[-70:]}  -> {used_by}")


def timeline(space, min_gap_us):
    """The traced steps as one ordered list: every GPU kernel and copy (with
    the TensorFlow op it ran for), every blocking CUDA call and every host op
    of min_gap_us or more, times in us from the first GPU event; GPU idle
    gaps of min_gap_us or more are marked, so a wait can be told from the
    host work that follows it."""
    rows = []
    for plane in space.planes:
        if plane.name.startswith("/host:CPU"):
            # TensorFlow ops on the host (name:Type), long enough to matter.
            for tid, _, name, s, e in _events(plane):
                if _op_type(name) and e - s >= min_gap_us * 1e6:
                    rows.append((s, e, f"host {tid % 1000:3}", name[-60:], ""))
        if "CUPTI" in plane.name:
            for _, _, name, s, e in _events(plane):
                if _is_blocking(name):
                    rows.append((s, e, "host wait", name, ""))
        elif plane.name.startswith("/device:GPU"):
            for _, line, name, s, e, op in _events(plane, with_op=True):
                if "Stream" in line:
                    # "gpu s13": kernels of different streams (NCCL's) overlap.
                    stream = line.split("(")[0].replace("Stream #", "s").strip()
                    rows.append((s, e, f"gpu {stream}", name[:60], op.split(":")[0][-50:]))
    rows.sort()
    gpu = [r for r in rows if r[2].startswith("gpu")]
    if not gpu:
        return
    t0, busy_end = gpu[0][0], gpu[0][0]
    rows = [r for r in rows if r[0] >= t0]
    for s, e, kind, name, op in rows:
        mark = ""
        if kind.startswith("gpu"):
            if s - busy_end >= min_gap_us * 1e6:
                mark = f"  <- GPU idle {(s - busy_end) / 1e6:.0f} us"
            busy_end = max(busy_end, e)
        print(f"  {(s - t0) / 1e6:9.1f} {(e - s) / 1e6:8.1f}  {kind:9} {name:60} {op}{mark}")


_PART_TITLES = {"whole": "whole step", "embedding": "embedding work alone",
                "dense": "dense layers alone", "bare": "dense layers on a bare embedding"}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--model", choices=["dlrm", "demo"], default="dlrm")
    p.add_argument("--demo_batch", type=int, default=8192)
    p.add_argument("--demo_vocab", type=int, default=8192)
    p.add_argument("--demo_units", type=int, default=1024)
    p.add_argument("--demo_layers", type=int, default=7)
    p.add_argument("--mode", choices=["function", "graph", "both"], default="both")
    p.add_argument("--side", choices=["sok", "tf", "gather", "both"], default="both",
                   help="gather (DemoModel): e2e_bench's gather* step, a lookup by row "
                        "number with sok's gradient kernel (no hash table, no wait)")
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--rows", type=int, default=100000)
    p.add_argument("--optimizer", choices=["adam", "sgd"], default="adam")
    p.add_argument("--top", type=int, default=12)
    p.add_argument("--host_level", type=int, default=2, choices=[1, 2, 3],
                   help="the profiler's host tracer level: 3 records every op kernel's host "
                        "time (most ops are 'inexpensive', traced at level 3 only), at some "
                        "cost to the step")
    p.add_argument("--timeline", type=float, default=None, metavar="MIN_GAP_US",
                   help="also print the traced steps' GPU events and blocking calls in "
                        "order, marking GPU idle gaps of at least MIN_GAP_US")
    p.add_argument("--graph_inputs", choices=["device", "feed"], default="device",
                   help="graph mode's inputs, as in e2e_bench.py")
    p.add_argument("--function_inputs", choices=["resident", "args"], default="resident",
                   help="tf.function's inputs, as in e2e_bench.py")
    p.add_argument("--emb_only", action="store_true",
                   help="the embedding work alone (lookups, gradients, table update); "
                        "the same as --part embedding")
    p.add_argument("--part", choices=["whole", "embedding", "dense", "bare"], default="whole",
                   help="which of e2e_bench.py's steps to trace: the whole step, the "
                        "embedding work alone, the dense layers alone or on a bare "
                        "embedding (Variant.logits); the dense and bare steps have no "
                        "embedding tables, and run once whatever --side says")
    args = p.parse_args()
    part = "embedding" if args.emb_only else args.part
    bench_args = args
    import numpy as np

    make = e2e_bench.dlrm_batches if args.model == "dlrm" else e2e_bench.demo_batches
    batches = make(bench_args, np.random.default_rng(0), e2e_bench.NUM_BATCHES)
    modes = ["function", "graph"] if args.mode == "both" else [args.mode]
    sides = ["sok", "tf"] if args.side == "both" else [args.side]
    if args.side == "gather" and args.model != "demo":
        p.error("--side gather is the DemoModel's (--model demo)")
    if part in e2e_bench.FIXED_INPUT_PARTS:
        sides = ["tf"]  # no embedding tables on either side's step
    print(f"TensorFlow {tf.__version__}, GPUs {len(tf.config.list_physical_devices('GPU'))}; "
          f"{args.model} ({_PART_TITLES[part]}), "
          f"{args.steps} traced steps, optimizer {args.optimizer}")
    for mode in modes:
        for side in sides:
            build = e2e_bench.function_step if mode == "function" else e2e_bench.graph_step
            step = build(args.model, side, bench_args, batches,
                         part)
            for i in range(e2e_bench.warmup_steps(3)):
                step(i)
            logdir = tempfile.mkdtemp(prefix="sok_syncs_")
            tf.profiler.experimental.start(logdir, options=tf.profiler.experimental.ProfilerOptions(
                host_tracer_level=args.host_level))
            for i in range(args.steps):
                step(i)
            tf.profiler.experimental.stop()
            space = _xspace(logdir)
            planes, by_op, dtoh, op_time, device_time = analyse(space)
            total = sum(by_op.values())
            print(f"\n{side} / {mode}: {total / args.steps:.1f} blocking CUDA calls per step "
                  f"(CUPTI API trace), {sum(dtoh.values()) / args.steps:.1f} device-to-host "
                  f"copies per step:")
            for op, n in dtoh.most_common():
                print(f"  {n / args.steps:6.1f}/step  device-to-host copy for {op}")
            for (op, call), n in sorted(by_op.items(), key=lambda x: -x[1]):
                print(f"  {n / args.steps:6.1f}/step  {call:28} in {op}")
            if not any("CUPTI" in pl for pl in planes):
                print(f"  (no CUPTI plane in the trace: planes {planes})")
            print(f"  host time per step by TensorFlow op type (top {args.top}):")
            for name, ps in op_time.most_common(args.top):
                print(f"    {ps / 1e9 / args.steps:8.3f} ms  {name}")
            if device_time:
                total_ms = sum(device_time.values()) / 1e9 / args.steps
                print(f"  GPU busy {total_ms:.3f} ms per step; top {args.top}:")
                for name, ps in device_time.most_common(args.top):
                    print(f"    {ps / 1e9 / args.steps:8.3f} ms  {name}")
            if args.timeline is not None:
                print("  timeline (start us, duration us, kind, name, TensorFlow op):")
                timeline(space, args.timeline)


if __name__ == "__main__":
    main()
