"""One of two Horovod workers of tests/test_serving_clocks.py: an export and
a delta where rank 0's clock runs --shift microseconds ahead of rank 1's.

Rank 0's clock as the serving code reads it (serving/collective.py's
now_micros) is moved ahead, and rank 0 stamps the keys it writes with that
clock (SokDynamicTableImport with timestamps); rank 1 writes through
sok.assign, stamped by the kernels' (the machine's) clock.

  1. tables "dyn" and "other" (dimension 4) get keys 0..9, each on the
     worker that holds it (key % 2 == rank): row k = k + [0, .1, .2, .3];
  2. every worker exports (--mode eager: sok.export_for_serving of a TF2
     module; session: of a TF1 graph, session=; strategy: through
     CollectiveStrategy.export_saved_model);
  3. after the export, keys 3, 4, 11, 12 of "dyn" are written, each on its
     worker: row k = 100 + k + [0, .1, .2, .3];
  4. sok.export_serving_delta of "dyn" since the export's created, to
     <out>/delta; rank 0 applies it to the export;
  5. the same delta again (delta_dir exists), and a delta of "dyn" and
     "other" in which rank 0 reads the keys of "dyn" twice (as a table
     changed while it is read), and an export into <out>/taken, a
     directory holding a file of the user's: what each worker raised.

Writes <out>/rank<r>.json: rank 1's own clock (time.time_ns) just before
and after its export call, and the errors.
"""

import argparse
import json
import os
import time

import numpy as np

DIM = 4
BEFORE = list(range(10))
AFTER = [3, 4, 11, 12]


def rows_of(keys, base):
    keys = np.asarray(keys, np.float32)
    return (base + keys[:, None] + np.arange(DIM, dtype=np.float32)[None, :] / 10).astype(
        np.float32)


def micros():
    return time.time_ns() // 1000


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["eager", "session", "strategy"], required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--shift", type=int, required=True,
                   help="microseconds rank 0's serving clock is moved ahead")
    args = p.parse_args()
    import tensorflow as tf

    if args.mode == "eager":
        tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode
    import sok_graph as sok
    from sok_graph import context
    from sok_graph.ops import dynamic as dynamic_ops
    from sok_graph.serving import collective, sources

    import horovod.tensorflow as hvd

    strategy = None
    if args.mode == "strategy":
        strategy = sok.CollectiveStrategy()  # starts Horovod
    else:
        hvd.init()
        sok.init()
    rank, world = hvd.rank(), hvd.size()
    assert world == 2 and context.active().world_size == 2, world
    barriers = []

    def barrier():
        """Returns once both workers called it (a Horovod all-reduce in a
        graph of its own: eagerly and in graph mode alike)."""
        barriers.append(len(barriers))
        with tf.Graph().as_default() as g:
            op = hvd.allreduce(tf.constant(0.0), name=f"clock_test_barrier_{len(barriers)}")
        with tf.compat.v1.Session(graph=g) as s:
            s.run(op)

    if rank == 0:
        unshifted = collective.now_micros
        collective.now_micros = lambda: unshifted() + args.shift

    def stamps(keys):
        """Rank 0's update times of `keys`: its (shifted) clock's now."""
        return np.full([len(keys)], collective.now_micros(), np.int64)

    export_dir = os.path.join(args.out, "export")
    delta_dir = os.path.join(args.out, "delta")
    report = {"rank": rank}

    def mine(keys):
        return [k for k in keys if k % world == rank]

    def created_of(path):
        with open(path) as f:
            return json.load(f)["created"]

    def refusals(run_delta, run_export):
        """What export_serving_delta raised on this worker, for a delta_dir
        that exists and for a key read twice on rank 0; and what the export
        raised for an export_dir that holds a file of the user's."""
        out = {}
        taken = os.path.join(args.out, "taken")
        if rank == 0:
            os.makedirs(taken)
            with open(os.path.join(taken, "notes.txt"), "w") as f:
                f.write("the user's")
        barrier()
        try:
            out["taken"] = ["returned", repr(run_export(taken))]
        except Exception as e:  # reported, checked by the test
            out["taken"] = [type(e).__name__, str(e)]
        try:
            out["exists"] = ["returned", repr(run_delta(("dyn",), delta_dir))]
        except Exception as e:  # reported, checked by the test
            out["exists"] = [type(e).__name__, str(e)]
        real = sources.whole_table

        def dyn_twice(table, runner, chunk_rows=1 << 20, updated_after=None,
                      keys_only=False):
            count, chunks = real(table, runner, chunk_rows, updated_after, keys_only)
            if table is not tables["dyn"]:
                return count, chunks
            read = list(chunks)  # every worker takes part in the gathers
            return count, iter(read + read[:1])  # rank 0 (which has chunks) gets one twice

        sources.whole_table = dyn_twice
        try:
            out["twice"] = ["returned", repr(run_delta(("dyn", "other"),
                                                       os.path.join(args.out, "twice")))]
        except Exception as e:  # reported, checked by the test
            out["twice"] = [type(e).__name__, str(e)]
        finally:
            sources.whole_table = real
        return out

    if args.mode == "eager":
        tables = {name: sok.DynamicVariable(dimension=DIM, initializer="zeros", name=name)
                  for name in ("dyn", "other")}
        def write(table, which, base):
            which = mine(which)
            keys, rows = tf.constant(which, tf.int64), tf.constant(rows_of(which, base))
            if rank == 0:
                dynamic_ops.import_rows(table.handle, keys, rows, timestamps=stamps(which))
            else:
                sok.assign(table, keys, rows)

        for table in tables.values():
            write(table, BEFORE, 0)

        class Model(tf.Module):
            def __call__(self, ids):
                return tf.concat([sok.all2all_dense_embedding(tables["dyn"], ids),
                                  sok.all2all_dense_embedding(tables["other"], ids)], 1)

        def run_export(where):
            return sok.export_for_serving(Model(), where,
                                          [tf.TensorSpec([None], tf.int64, name="ids")])

        barrier()  # every key is in before any worker reads its clock
        report["rank1_clock_before_export"] = micros()
        run_export(export_dir)
        report["rank1_clock_after_export"] = micros()
        barrier()  # rank 0 wrote the export
        write(tables["dyn"], AFTER, 100)

        def run_delta(which, where):
            return sok.export_serving_delta(
                {name: tables[name] for name in which}, since, where)
    else:
        graph = tf.Graph()
        with graph.as_default():
            tables = {name: sok.DynamicVariable(dimension=DIM, initializer="zeros", name=name)
                      for name in ("dyn", "other")}
            keys = tf.compat.v1.placeholder(tf.int64, [None])
            rows = tf.compat.v1.placeholder(tf.float32, [None, DIM])
            if rank == 0:
                times = tf.compat.v1.placeholder(tf.int64, [None])
                assign = {name: dynamic_ops.import_rows(t.handle, keys, rows, timestamps=times)
                          for name, t in tables.items()}
            else:
                assign = {name: sok.assign(t, keys, rows) for name, t in tables.items()}
            sess = tf.compat.v1.Session(graph=graph)
            sess.run(tf.compat.v1.global_variables_initializer())

            def write(name, which, base):
                feed = {keys: mine(which), rows: rows_of(mine(which), base)}
                if rank == 0:
                    feed[times] = stamps(mine(which))
                sess.run(assign[name], feed)

            for name in tables:
                write(name, BEFORE, 0)

            def build():
                ids = tf.compat.v1.placeholder(tf.int64, [None], name="ids")
                served = [sok.DynamicVariable(dimension=DIM, initializer="zeros", name=name)
                          for name in ("dyn", "other")]
                out = tf.concat([sok.all2all_dense_embedding(t, ids) for t in served], 1)
                return {"ids": ids}, {"out": out}

            def signature_def_fn():
                inputs, outputs = build()
                return {"serving_default": tf.compat.v1.saved_model.predict_signature_def(
                    inputs, outputs)}

            def run_export(where):
                if strategy is not None:
                    return strategy.export_saved_model(where, signature_def_fn=signature_def_fn,
                                                       session=sess)
                return sok.export_for_serving(build, where, session=sess)

            barrier()
            report["rank1_clock_before_export"] = micros()
            run_export(export_dir)
            report["rank1_clock_after_export"] = micros()
            barrier()
            write("dyn", AFTER, 100)

            def run_delta(which, where):
                return sok.export_serving_delta(
                    {name: tables[name] for name in which}, since, where, session=sess)

    since = created_of(os.path.join(export_dir, "assets.extra", "sok_serving.json"))
    written = run_delta(("dyn",), delta_dir)
    assert (written == delta_dir) == (rank == 0), written
    if rank == 0:
        report["applied"] = sok.apply_serving_delta(export_dir, delta_dir)
    barrier()
    report.update(refusals(run_delta, run_export))
    with open(os.path.join(args.out, f"rank{rank}.json"), "w") as f:
        json.dump(report, f)
    print(f"rank {rank}: done", flush=True)


if __name__ == "__main__":
    main()
