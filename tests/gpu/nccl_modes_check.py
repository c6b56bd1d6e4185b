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
is opt-in); NCCL_DEBUG=INFO shows NCCL's own view of its set-up.
"""

import os
import subprocess
import sys
import threading

MODES = ("threads", "session", "function")
BOUND_S = 60


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


def main():
    if len(sys.argv) > 1:
        run_mode(sys.argv[1])
        return
    failed = False
    for mode in MODES:
        try:
            proc = subprocess.run([sys.executable, __file__, mode], stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True, timeout=BOUND_S)
            last = [l for l in proc.stdout.splitlines() if l.startswith(("ok", "error"))]
            line = last[-1] if last else f"exit {proc.returncode}: {proc.stdout[-500:]}"
            failed |= proc.returncode != 0
        except subprocess.TimeoutExpired:
            line, failed = f"no answer within {BOUND_S} s", True
        print(f"nccl_modes_check {mode}: {line}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
