"""One worker of the resharding dump/load test (tests/test_multiworker.py).

  --phase dump: trains a static and a dynamic table for a few steps with
      Adam (OptimizerWrapper), dumps them with the optimizer's state to
      --path, and writes what this worker holds (global ids/keys, rows, Adam's
      m and v) to <out>/rank<r>.npz, and what sok.incremental_model_dump
      returns on this process to <out>/incremental<r>.npz; and a table's
      count-min sketch (admission counts) to --path + "_sketch".
  --phase load: builds the same tables and optimizer, sok.load's --path and
      writes what this worker holds after the load, the same way; with
      --redump, dumps again (so a chain of world sizes can be checked),
      the sketch too.
      With --refuse_on R, worker R's dynamic table holds at most 4 rows, so
      its checks refuse the dump; with --unreadable_on R, worker R reads
      --path + "_damaged" (a copy whose file the test damaged) instead:
      either way every worker must raise CheckpointError with worker R's
      reason and keep its tables as built (nothing is written to --out).
  --refused_path P (phase dump): first a dump to P, a directory of the
      user's files, which rank 0 (the writer) refuses: every worker must
      raise FileExistsError (the others naming rank 0), P must be as it
      was; then a dump whose workers pass the tables in other orders, which
      every worker must refuse (ValueError) without writing, and one whose
      workers pass other paths, refused the same way; the dump to --path
      must then work on every worker, and a load whose workers read
      different dumps is refused by every worker (CheckpointError). The refused loads first
      try a load whose workers pass other tables, refused the same way.

Run by N workers for the dump and M for the load, the union of the npz files
must be the same rows and slots, bit for bit. --engine mirrored --world N:
one process whose MirroredStrategy has N replicas (logical CPUs), each a
worker; it writes one npz per replica.
"""

import argparse
import os

import numpy as np

DIM, ROWS, BATCH = 4, 50, 12


def _dump_refused(rank, path, tables, opt, *said):
    """sok.dump(path, tables, optimizer=opt) raises a ValueError saying each
    of `said` (as it must on every worker)."""
    import sok_graph as sok

    try:
        sok.dump(path, tables, optimizer=opt)
    except ValueError as e:
        for text in said:
            assert text in str(e), (rank, str(e))
    else:
        raise AssertionError(f"rank {rank}: sok.dump to {path} returned")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--phase", choices=["dump", "load"], required=True)
    p.add_argument("--engine", choices=["horovod", "none", "mirrored"], required=True)
    p.add_argument("--world", type=int, default=1, help="replicas of --engine mirrored")
    p.add_argument("--path", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--redump", help="after loading, dump again to this path")
    p.add_argument("--refuse_on", type=int, help="the worker whose table refuses the load")
    p.add_argument("--unreadable_on", type=int,
                   help="the worker that reads a damaged copy of the dump")
    p.add_argument("--reason", help="what the refusing worker's error says (every worker's must)")
    p.add_argument("--refused_path", help="a directory of the user's files to dump into first")
    args = p.parse_args()
    import tensorflow as tf

    tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode

    import sok_graph as sok

    rank, world = 0, 1
    strategy = None
    if args.engine == "horovod":
        import horovod.tensorflow as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
    if args.engine == "mirrored":
        from mirrored_cpus import mirrored_strategy_on_cpus

        world = args.world
        strategy = mirrored_strategy_on_cpus(world)
        with strategy.scope():
            sok.init(comm_tool="tf")
    else:
        sok.init(comm_tool=args.engine)
    init = np.random.default_rng(7).normal(size=(ROWS, DIM)).astype(np.float32)
    static = sok.Variable(init, name="static_table")
    bound = {}
    if args.refuse_on == rank:
        bound = dict(var_type="hybrid", init_capacity=4, max_capacity=4)
    dynamic = sok.DynamicVariable(dimension=DIM, initializer="normal", name="dynamic_table",
                                  **bound)
    tables = [static, dynamic]
    # A count-min sketch's counters: every lookup counts its keys, on the
    # key's owner; only dumped and loaded (it trains nothing).
    sketched = sok.DynamicVariable(dimension=DIM, initializer="zeros", name="sketched_table",
                                   min_count=1000, min_count_counters=64, min_count_hashes=2)
    opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.1))
    if args.phase == "dump":
        # Each worker (replica) its own ids.
        rngs = [np.random.default_rng(100 + r) for r in range(rank, rank + (
            world if strategy is not None else 1))]

        def replica_step(inputs):
            if strategy is not None:
                ctx = tf.distribute.get_replica_context()
                inputs = inputs[tf.get_static_value(ctx.replica_id_in_sync_group)]
            ids_s, ids_d = inputs
            with tf.GradientTape() as tape:
                a, b = sok.lookup_sparse(tables, [ids_s, ids_d], combiners=["sum", "sum"])
                loss = tf.reduce_sum(a * a) + tf.reduce_sum(b)
            sok.lookup_sparse(sketched, ids_d, combiners="sum")
            grads = tape.gradient(loss, tables)
            opt.apply_gradients(zip(grads, tables))
            return loss

        @tf.function
        def step(inputs):
            if strategy is None:
                return replica_step(inputs[0])
            return strategy.run(replica_step, args=(inputs,))

        for _ in range(3):
            inputs = []
            for rng in rngs:
                ids_s = tf.RaggedTensor.from_row_lengths(rng.integers(0, ROWS, 2 * BATCH),
                                                         [2] * BATCH)
                ids_d = tf.RaggedTensor.from_row_lengths(
                    rng.integers(-10 ** 6, 10 ** 6, 2 * BATCH), [2] * BATCH)
                inputs.append((ids_s, ids_d))
            step(inputs)
        if args.refused_path:
            before = sorted(os.listdir(args.refused_path))
            try:
                sok.dump(args.refused_path, tables, optimizer=opt)
            except FileExistsError as e:
                assert "holding" in str(e), (rank, str(e))
                if rank != 0:
                    assert f"failed on rank 0 of {world}" in str(e), (rank, str(e))
                    assert "no dump was written there" in str(e), (rank, str(e))
            else:
                raise AssertionError(f"rank {rank}: the dump rank 0 refused returned")
            assert sorted(os.listdir(args.refused_path)) == before
            # Workers passing the tables in another order: refused on every
            # worker, nothing written (rank 1's rows of one table were
            # written as the other's).
            mixed = args.path + "_mixed"
            _dump_refused(rank, mixed, tables if rank == 0 else tables[::-1], opt,
                          "the workers passed different dump_vars",
                          "rank 0: ['static_table', 'dynamic_table']")
            assert not os.path.exists(mixed)
            # Workers passing other paths: refused on every worker, nothing
            # written (rank 0 wrote its path; rank 1's sok.dump returned as
            # if it had written its own).
            apart = [args.path + "_rank0", args.path + "_rank1"]
            _dump_refused(rank, apart[min(rank, 1)], tables, opt,
                          "the workers passed different paths")
            assert not any(os.path.exists(p) for p in apart)
            # The optimizer given on one worker only: refused on every
            # worker, naming the argument, nothing written (it failed in
            # TensorFlow's collectives, naming nothing, and left the
            # collective group aborted).
            lonely = args.path + "_one_optimizer"
            _dump_refused(rank, lonely, tables, opt if rank == 0 else None,
                          "the workers passed different optimizer arguments",
                          "rank 1: no optimizer")
            assert not os.path.exists(lonely)
        sok.dump(args.path, tables, optimizer=opt)
        sok.dump(args.path + "_sketch", [sketched])
        if args.refused_path:
            from sok_graph.dump_load import CheckpointError

            # Workers reading different dumps (rank 0 another one): refused
            # on every worker before any table changes (each kept its
            # shard's rows from its own dump, without an error).
            other = args.path + "_static_only"
            sok.dump(other, [static])
            before = sok.export(static)[1].numpy()
            try:
                sok.load(other if rank == 0 else args.path, [static])
            except CheckpointError as e:
                assert "the workers read different dumps" in str(e), (rank, str(e))
            else:
                raise AssertionError(f"rank {rank}: a load of different dumps returned")
            np.testing.assert_array_equal(sok.export(static)[1].numpy(), before)
        # Every row was updated after the epoch: the whole table, on every
        # worker (SOK's incremental dump gathers all workers' rows).
        (keys,), (rows,) = sok.incremental_model_dump([dynamic], 0)
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"incremental{rank}.npz"), keys=np.asarray(keys),
                 rows=np.asarray(rows))
    elif args.refuse_on is not None or args.unreadable_on is not None:
        from sok_graph.dump_load import CheckpointError

        refusing = args.refuse_on if args.refuse_on is not None else args.unreadable_on
        path = args.path + ("_damaged" if rank == args.unreadable_on else "")
        # Workers loading other tables: refused on every worker before any
        # changes (rank 0's shard of the dynamic table was loaded, rank 1's
        # left as it was).
        try:
            sok.load(path, tables if rank == 0 else tables[:1], optimizer=opt)
        except ValueError as e:
            assert "the workers passed different load_vars" in str(e), (rank, str(e))
        else:
            raise AssertionError(f"rank {rank}: a load of the workers' other lists returned")
        # The optimizer given on one worker only: refused on every worker
        # (rank 0 took the dump's slots and step, rank 1 kept its own).
        try:
            sok.load(path, tables, optimizer=opt if rank == 0 else None)
        except ValueError as e:
            assert "the workers passed different optimizer arguments" in str(e), (rank, str(e))
        else:
            raise AssertionError(f"rank {rank}: a load with one worker's optimizer returned")
        try:
            sok.load(path, tables, optimizer=opt)
        except CheckpointError as e:
            # The refusing worker's own error; the others name it and say why.
            assert args.reason in str(e), (rank, str(e))
            if rank != refusing:
                assert f"failed on rank {refusing} of {world}" in str(e), (rank, str(e))
                assert "no worker changed its tables" in str(e), (rank, str(e))
        else:
            raise AssertionError(f"rank {rank}: the load another worker refused went through")
        # Every worker's tables as built: no row of the dump, no Adam step.
        np.testing.assert_array_equal(sok.export(static)[1].numpy(),
                                      init[np.asarray(sok.export(static)[0])])
        assert int(sok.export(dynamic)[0].shape[0]) == 0 and int(opt.iterations.numpy()) == 0
        print(f"rank {rank}/{world} refused load: ok", flush=True)
        return
    else:
        sok.load(args.path, tables, optimizer=opt)
        sok.load(args.path + "_sketch", [sketched])
        if args.redump:
            sok.dump(args.redump, tables, optimizer=opt)
            sok.dump(args.redump + "_sketch", [sketched])
    os.makedirs(args.out, exist_ok=True)
    # A mirrored run holds every replica's shard: one file per replica.
    for r, shards in enumerate(zip(*[getattr(t, "shards", [t]) for t in tables]), rank):
        step_var = opt._step_variable(r - rank) if strategy is not None else opt.iterations
        out = {"step": np.int64(step_var.numpy())}
        for name, table, t in zip(("static", "dynamic"), tables, shards):
            keys, rows = sok.export(t)
            out[f"{name}_keys"], out[f"{name}_rows"] = keys.numpy(), rows.numpy()
            for slot in ("m", "v"):
                # A table sharded over replicas: its whole slot's shards.
                s = opt.get_slot(table, slot)
                if strategy is not None:
                    s = s.shards[r - rank]
                if isinstance(t, sok.DynamicVariable):
                    vals = s.find(tf.cast(keys, s.key_type))[0]
                else:
                    vals = tf.convert_to_tensor(s)
                out[f"{name}_{slot}"] = vals.numpy()
        np.savez(os.path.join(args.out, f"rank{r}.npz"), **out)
    print(f"rank {rank}/{world} {args.phase}: ok", flush=True)


if __name__ == "__main__":
    main()
