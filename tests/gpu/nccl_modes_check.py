"""Where the NCCL all-to-all between the GPUs of one process stops: the op
for 2 GPUs run three ways, each in a process of its own with a time bound.

    python tests/gpu/nccl_modes_check.py            # all three modes
    python tests/gpu/nccl_modes_check.py threads    # one mode, in this process

- threads: each rank's op called eagerly from a Python thread of its own
  (no TensorFlow executor involved: the op and NCCL alone);
- session: both ranks' ops in one tf.compat.v1 Session graph;
- function: both ranks' ops in one tf.function.

Prints one line per mode: "ok" with the rows received, "error" with the
message, or "no answer within N s". SOK_GRAPH_NCCL=1 is set (the exchange
is opt-in); NCCL_DEBUG=INFO shows NCCL's own view of its set-up. Where a
mode does not answer and cuda-gdb is on the PATH (it attaches to programs
without GPU code too), every thread's native stack is printed before the
process is ended, with the frames of sok_graph, NCCL and CUDA first; the
whole dump goes to $SOK_GRAPH_STACKS_DIR/<mode>.txt where that is set.
"""

import os
import shutil
import subprocess
import sys
import threading

MODES = ("threads", "session", "function")
BOUND_S = int(os.environ.get("SOK_GRAPH_MODES_BOUND_S", "60"))


def run_mode(mode):
    os.environ["SOK_GRAPH_NCCL"] = "1"
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    import numpy as np
    import tensorflow as tf

    from sok_graph.communication import nccl
    from sok_graph.ops import collective

    if nccl.load_library() is None:
        sys.exit(f"error: {nccl.why_not()}")
    nccl.Transport("local:check", 2)  # its environment defaults (multicast off, launch mode)
    rows = [np.full((3, 4), r, np.float32) for r in range(2)]
    splits = [np.array([1, 2], np.int64), np.array([2, 1], np.int64)]
    clique = f"local:{mode}"

    def exchange(r):
        with tf.device(f"/GPU:{r}"):
            return collective.alltoall(tf.constant(rows[r]), tf.constant(splits[r]), clique, r, 2)[0]

    if mode == "threads":
        got = {}

        def work(r):
            try:
                got[r] = exchange(r).numpy()
            except Exception as e:  # noqa: BLE001 (reported below)
                got[r] = e
        threads = [threading.Thread(target=work, args=(r,)) for r in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        out = [got[0], got[1]]
    elif mode == "session":
        graph = tf.Graph()
        with graph.as_default():
            fetches = [exchange(r) for r in range(2)]
            with tf.compat.v1.Session(graph=graph) as sess:
                out = sess.run(fetches)
    else:
        out = [o.numpy() for o in tf.function(lambda: [exchange(r) for r in range(2)])()]
    # Rank 0 receives row 0 of its own and rows 0-1 of rank 1's; rank 1 the rest.
    want = [np.concatenate([rows[0][:1], rows[1][:2]]), np.concatenate([rows[0][1:], rows[1][2:]])]
    for r in range(2):
        if isinstance(out[r], Exception):
            sys.exit(f"error: rank {r}: {out[r]}")
        if not np.array_equal(out[r], want[r]):
            sys.exit(f"error: rank {r} received {out[r].tolist()}, expected {want[r].tolist()}")
    print(f"ok: {[o.shape for o in out]}")


def native_stacks(pid, mode):
    """Every thread's stack of process `pid` (cuda-gdb attached in batch
    mode); prints the threads whose frames name sok, nccl or cuda."""
    if shutil.which("cuda-gdb") is None:
        return
    try:
        dump = subprocess.run(["cuda-gdb", "-p", str(pid), "-batch", "-ex",
                               "thread apply all bt 40"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, timeout=90).stdout
    except subprocess.TimeoutExpired:
        print(f"  (cuda-gdb did not answer within 90 s)", flush=True)
        return
    where = os.environ.get("SOK_GRAPH_STACKS_DIR")
    if where:
        os.makedirs(where, exist_ok=True)
        with open(os.path.join(where, f"{mode}.txt"), "w") as f:
            f.write(dump)
    for thread in dump.split("\nThread ")[1:]:
        frames = thread.splitlines()
        if any(k in thread.lower() for k in ("sok", "nccl", "cuda")):
            print("  Thread " + "\n    ".join(frames[:14]), flush=True)


def main():
    if len(sys.argv) > 1:
        run_mode(sys.argv[1])
        return
    failed = False
    for mode in MODES:
        proc = subprocess.Popen([sys.executable, __file__, mode], stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        try:
            out, _ = proc.communicate(timeout=BOUND_S)
            last = [l for l in out.splitlines() if l.startswith(("ok", "error"))]
            line = last[-1] if last else f"exit {proc.returncode}: {out[-500:]}"
            failed |= proc.returncode != 0
        except subprocess.TimeoutExpired:
            line, failed = f"no answer within {BOUND_S} s", True
            print(f"nccl_modes_check {mode}: {line}; native stacks:", flush=True)
            native_stacks(proc.pid, mode)
            proc.kill()
            out, _ = proc.communicate()
            print("  last output: " + out[-1500:].replace("\n", "\n    "), flush=True)
        print(f"nccl_modes_check {mode}: {line}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
