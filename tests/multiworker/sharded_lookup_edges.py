"""Edge cases of sok.lookup_sparse over sharded static tables
(tests/test_sharded_lookup_edges.py): one process, a MirroredStrategy over
--replicas logical CPUs, each replica a worker holding a shard of every
table. The forward values and the tables' gradients must equal a numpy
reference computed on the whole tables (global row i lives on replica
i % N as local row i // N; a localized table lives whole on one replica).

--mode function   tf.function, ids as constants: every size is known when
                  the graph is built (lookup._table_of_each_id's constant
                  and range branches);
--mode signature  tf.function with an input_signature of [None] shapes:
                  no size is known (its fill branch);
--mode graph      a tf.compat.v1 Session graph fed through placeholders.

Each case mixes int32 and int64 ids, empty samples, a table whose batch is
empty on some or every replica, repeated ids within and across tables,
the sum / mean / sqrtn combiners with and without weights, tables of 1 row
and of fewer rows than replicas, a localized table, one table given
three times in one lookup, and no id on one or on every replica. Then an id out of range (past the end, or
negative) must fail naming its table. Prints "OK" at the end; any mismatch is
an AssertionError.
"""

import argparse

import numpy as np

DIM = 3


def table_specs(n):
    """(name, rows, mode) of every table; the last is localized on the
    last replica."""
    return [("t_seven", 7, "distributed"), ("t_one", 1, "distributed"),
            ("t_fewer", max(n - 1, 1), "distributed"), ("t_five", 5, "distributed"),
            ("t_local", 4, f"localized:{n - 1}")]


def make_cases(n, specs):
    """Cases: per case, combiners, per replica per table (ids [nnz],
    row_lengths [batch], weights or None), and which table each entry of
    the lookup's params is (one table may come several times)."""
    rng = np.random.default_rng(7 + n)
    count = len(specs)
    cases = []

    def batch(rows, lengths, weighted, dtype):
        ids = rng.integers(0, rows, size=int(np.sum(lengths)))
        weights = rng.uniform(0.5, 2.0, size=ids.size).astype(np.float32) if weighted else None
        return ids.astype(dtype), np.asarray(lengths, np.int64), weights

    # 1: sums, every table in one group (distributed) or its own (localized);
    # nnz differs per table; t_fewer is empty on replica 0, t_one on every
    # replica; repeated ids.
    per = []
    for r in range(n):
        row = []
        for k, (_, rows, _) in enumerate(specs):
            lengths = [[2, 0, 3], [0, 0], [0, 4, 1] if r else [0, 0, 0], [1, 1, 2, 0],
                       [3, 0]][k]
            if k == 1:
                lengths = [0, 0, 0]  # t_one: an all-empty table batch everywhere
            dtype = np.int32 if (k + r) % 2 else np.int64
            row.append(batch(rows, lengths, False, dtype))
        per.append(row)
    cases.append((["sum"] * count, per, list(range(count))))

    # 2: every table the same nnz on every replica (the range branch),
    # combiners mean, all int64.
    per = []
    for r in range(n):
        per.append([batch(rows, [2, 1, 0, 3], False, np.int64) for _, rows, _ in specs])
    cases.append((["mean"] * count, per, list(range(count))))

    # 3: mixed combiners, weights on some tables, int32 everywhere, a
    # batch of one empty sample, ids repeated within a sample.
    combiners = ["sqrtn", "mean", "sum", "sqrtn", "mean"]
    weighted = [True, False, True, True, False]
    per = []
    for r in range(n):
        row = []
        for k, (_, rows, _) in enumerate(specs):
            lengths = [[4, 2], [1], [3, 0, 2], [0], [2, 2, 2]][(k + r) % 5]
            row.append(batch(rows, lengths, weighted[k], np.int32))
        per.append(row)
    # The same id twice in one sample, and the same ids across tables.
    ids, lengths, w = per[0][0]
    ids[:2] = 3
    per[0][0] = (ids, lengths, w)
    cases.append((combiners, per, list(range(count))))

    # 4: one table three times in one lookup (twice in one group, once in a
    # group of its own by its combiner), beside another of its group and
    # the localized table: its gradient sums all three.
    which = [0, 0, 3, 4, 0]
    combiners = ["sum", "sum", "sum", "sum", "mean"]
    per = []
    for r in range(n):
        per.append([batch(specs[t][1], [2, 0, 1 + r], False, np.int64 if k % 2 else np.int32)
                    for k, t in enumerate(which)])
    cases.append((combiners, per, which))

    # 5: no id at all on replica 0 (it only answers the others), then 6: no
    # id on any replica (every all-to-all empty).
    for empty in ({0}, set(range(n))):
        per = [[batch(rows, [0, 0] if r in empty else [1, 2], False,
                      np.int32 if k % 2 else np.int64)
                for k, (_, rows, _) in enumerate(specs)] for r in range(n)]
        cases.append((["sqrtn", "sum", "mean", "sum", "sum"], per, list(range(count))))
    return cases


def reference(case, whole, n):
    """numpy (outputs[r][k] [batch, dim], gradients[k] of the whole tables)
    where replica r's loss is sum(output * upstream(r, k))."""
    combiners, per, which = case
    outs, grads = [], [np.zeros_like(t) for t in whole]
    for r in range(n):
        row = []
        for k, (ids, lengths, weights) in enumerate(x[:3] for x in per[r]):
            table = whole[which[k]]
            w = np.ones(ids.size, np.float64) if weights is None else weights.astype(np.float64)
            up = upstream(r, k, len(lengths))
            out = np.zeros((len(lengths), DIM))
            start = 0
            for b, length in enumerate(lengths):
                sl = slice(start, start + length)
                start += length
                if not length:
                    continue
                scale = {"sum": 1.0, "mean": 1.0 / w[sl].sum(),
                         "sqrtn": 1.0 / np.sqrt((w[sl] ** 2).sum())}[combiners[k]]
                coef = w[sl] * scale
                out[b] = (coef[:, None] * table[ids[sl]]).sum(0)
                for i, c in zip(ids[sl], coef):
                    grads[which[k]][i] += c * up[b]
            row.append(out)
        outs.append(row)
    return outs, grads


def upstream(r, k, batch):
    return np.cos(np.arange(batch * DIM).reshape(batch, DIM) + 10 * r + 3 * k + 1)


def whole_tables(specs):
    rng = np.random.default_rng(11)
    return [rng.normal(size=(rows, DIM)).astype(np.float32) for _, rows, _ in specs]


def assemble(shards, rows, mode, n):
    """The whole table's gradient from every replica's shard gradient."""
    if mode.startswith("localized:"):
        return shards[int(mode.split(":")[1])]
    whole = np.zeros((rows, DIM))
    for r in range(n):
        whole[r::n] = shards[r]
    return whole


def check_initializer_shape(sok, strategy, n):
    """shape= and initializer=: each worker makes only its own rows, and an
    initializer whose value has another shape than the rows asked of it is
    refused naming both (the table took the value's size before)."""
    import tensorflow as tf

    with strategy.scope():
        try:
            sok.Variable(shape=[7, 3], initializer=lambda shape, dtype=None: tf.zeros([1, 3]))
        except ValueError as e:
            assert "shape is [7, 3]" in str(e) and "[1, 3]" in str(e), e
        else:
            raise AssertionError("an initializer's value of another shape made a table")
        made = sok.Variable(shape=[7, 3], initializer="ones")
    shards = [x.numpy() for x in made.shards]
    assert len(shards) == n and sum(len(x) for x in shards) == 7, [x.shape for x in shards]
    assert all((x == 1).all() and x.shape[1] == 3 for x in shards)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--modes", default="function,signature,graph",
                   help="comma-separated modes, run in turn in this process")
    args = p.parse_args()
    modes = args.modes.split(",")
    assert set(modes) <= {"function", "signature", "graph"}, modes
    n = args.replicas
    import tensorflow as tf

    tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode

    from mirrored_cpus import mirrored_strategy_on_cpus

    strategy = mirrored_strategy_on_cpus(n)
    import sok_graph as sok

    with strategy.scope():
        comm = sok.init(comm_tool="tf", use_legacy_optimizer=False)
    assert comm.world_size == n, comm.describe()
    check_initializer_shape(sok, strategy, n)
    specs = table_specs(n)
    whole = whole_tables(specs)
    cases = make_cases(n, specs)
    local_results = strategy.experimental_local_results

    def make_tables():
        with strategy.scope():
            return [sok.Variable(v, name=name, mode=mode)
                    for v, (name, _, mode) in zip(whole, specs)]

    def replica_lookup(tables, combiners, inputs, batches):
        """inputs: per table (ids, row_splits, weights or None) of this
        replica; batches: per table its number of samples. Returns the
        outputs and the dense shard gradients."""
        ids = [tf.RaggedTensor.from_row_splits(v, s, validate=False) for v, s, _ in inputs]
        weights = [None if w is None else tf.RaggedTensor.from_row_splits(w, s, validate=False)
                   for _, s, w in inputs]
        r = tf.get_static_value(tf.distribute.get_replica_context().replica_id_in_sync_group)
        with tf.GradientTape() as tape:
            outs = sok.lookup_sparse(tables, ids, sp_weights=weights, combiners=combiners)
            loss = tf.add_n([tf.reduce_sum(o * tf.constant(upstream(r, k, batches[k]),
                                                           o.dtype))
                             for k, o in enumerate(outs)])
        if tf.executing_eagerly() or tf.compat.v1.executing_eagerly_outside_functions():
            grads = tape.gradient(loss, tables,
                                  unconnected_gradients=tf.UnconnectedGradients.ZERO)
        else:
            from sok_graph.tables.replica_shards import resolve

            grads = tf.gradients(loss, [resolve(t) for t in tables],
                                 unconnected_gradients=tf.UnconnectedGradients.ZERO)
        return outs, [tf.convert_to_tensor(g) for g in grads]

    def feed_arrays(case):
        """Per replica, per table: (ids, row_splits, weights or None) as numpy."""
        per = case[1]
        return [[(ids, np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64), w)
                 for ids, lengths, w in row] for row in per]

    def run_case(case, tables):
        combiners, tables = case[0], [tables[t] for t in case[2]]
        arrays = feed_arrays(case)
        batches = [[len(s) - 1 for _, s, _ in row] for row in arrays]
        if state["mode"] == "function":
            def step():
                def fn():
                    r = tf.get_static_value(
                        tf.distribute.get_replica_context().replica_id_in_sync_group)
                    # Tables whose samples have the same lengths share one
                    # row splits tensor, as a batch of one id per table does
                    # (lookup._merged_splits reads a shared one once).
                    shared = {}
                    inputs = [(tf.constant(i),
                               shared.setdefault(s.tobytes(), tf.constant(s)),
                               None if w is None else tf.constant(w)) for i, s, w in arrays[r]]
                    return replica_lookup(tables, combiners, inputs, batches[r])
                return strategy.run(fn)
            out = tf.function(step)()
            return [[[t.numpy() for t in local_results(o)] for o in part] for part in out]
        flat = [x for row in arrays for entry in row for x in entry if x is not None]
        specs_ = [tf.TensorSpec([None], tf.as_dtype(x.dtype)) for x in flat]

        def unflatten(tensors):
            it = iter(tensors)
            return [[(next(it), next(it), None if w is None else next(it))
                     for _, _, w in row] for row in arrays]

        def step_on(tensors):
            nested = unflatten(tensors)

            def fn():
                r = tf.get_static_value(
                    tf.distribute.get_replica_context().replica_id_in_sync_group)
                return replica_lookup(tables, combiners, nested[r], batches[r])
            return strategy.run(fn)

        if state["mode"] == "signature":
            out = tf.function(lambda *t: step_on(t), input_signature=specs_)(
                *[tf.constant(x) for x in flat])
            return [[[t.numpy() for t in local_results(o)] for o in part] for part in out]
        placeholders = [tf.compat.v1.placeholder(s.dtype, [None]) for s in specs_]
        out = step_on(placeholders)
        fetches = [[list(local_results(o)) for o in part] for part in out]
        return state["session"].run(fetches, dict(zip(placeholders, flat)))

    def check(case, got, what):
        want_out, want_grad = reference(case, whole, n)
        outs, grads = got
        for k, t in enumerate(case[2]):
            for r in range(n):
                np.testing.assert_allclose(
                    outs[k][r], want_out[r][k], rtol=1e-5, atol=1e-5,
                    err_msg=f"{what}: output {k} (table {specs[t][0]}) on replica {r}")
            # The gradient of a table given several times is every use's.
            shards = [grads[k][r] for r in range(n)]
            for r, s in enumerate(shards):
                assert s.shape[1:] == (DIM,), (what, specs[t][0], r, s.shape)
            got_grad = assemble(shards, specs[t][1], specs[t][2], n)
            np.testing.assert_allclose(got_grad, want_grad[t], rtol=1e-5, atol=1e-5,
                                       err_msg=f"{what}: gradient of table {specs[t][0]} "
                                               f"(output {k})")

    def bad_id_case(k, bad):
        """Id `bad` for table k in the first sample of the last replica."""
        combiners, per, which = cases[0]
        per = [list(row) for row in per]
        ids, lengths, w = per[n - 1][k]
        ids = np.concatenate([[bad], ids]).astype(np.int64)  # int64: bad may not fit int32
        lengths = lengths.copy()
        lengths[0] += 1
        per[n - 1][k] = (ids, lengths, w)
        return combiners, per, which

    def expect_bad_id(k, bad):
        """An id out of range (past the end of t_five; one whose key in the
        group's shared key space, id * tables + table, would wrap; negative
        in the localized table) is an error naming the table, never a
        row."""
        try:
            run_case(bad_id_case(k, bad), tables)
        except tf.errors.InvalidArgumentError as e:
            # The table's own name, also in a Session graph, which names
            # replica r's shard of t_five "t_five_r".
            words = f"ids of {specs[k][0]} (sp_ids[{k}]) must be in [0, {specs[k][1]})"
            assert words in str(e) and str(bad) in str(e), str(e)[-2000:]
        else:
            raise AssertionError(f"id {bad} of table {specs[k][0]} was looked up")

    def bad_splits_case(longer, shorter=None):
        """Table `longer` of the last replica with one id more than its row
        lengths count (row_splits made with validate=False that end short),
        and table `shorter` with one fewer (the merged splits then end right,
        and only each table's own would tell)."""
        combiners, per, which = cases[0]
        per = [list(row) for row in per]
        ids, lengths, w = per[n - 1][longer]
        per[n - 1][longer] = (np.concatenate([ids, ids[:1]]), lengths, w)
        if shorter is not None:
            ids, lengths, w = per[n - 1][shorter]
            per[n - 1][shorter] = (ids[:-1], lengths, w)
        return combiners, per, which

    def expect_bad_splits(longer, shorter=None):
        """Such splits are an error naming the table, never ids moved into
        another table's samples."""
        try:
            run_case(bad_splits_case(longer, shorter), tables)
        except tf.errors.InvalidArgumentError as e:
            words = (f"row_splits of {specs[longer][0]} (sp_ids[{longer}]) must start at 0 and "
                     f"end at its number of ids")
            assert words in str(e), str(e)[-2000:]
        else:
            raise AssertionError(f"the row_splits of table {specs[longer][0]} were merged")

    def expect_empty_splits(tables):
        """Empty row_splits (no leading 0) for a table of a group: refused
        when the graph is built, naming the argument."""
        def fn():
            ids = [tf.RaggedTensor.from_row_splits(tf.constant([], tf.int64),
                                                   tf.constant([], tf.int64), validate=False)]
            ids += [tf.RaggedTensor.from_row_splits(tf.constant([1], tf.int64),
                                                    tf.constant([0, 1], tf.int64),
                                                    validate=False)]
            return sok.lookup_sparse(tables[:2], ids, combiners=["sum", "sum"])
        try:
            tf.function(lambda: strategy.run(fn))()
        except ValueError as e:
            assert "sp_ids[0] has empty row_splits" in str(e), str(e)[-2000:]
        else:
            raise AssertionError("empty row_splits were merged")

    bad_ids = [(3, specs[3][1]), (0, 2 ** 62 + 1), (4, -1)]
    bad_splits = [(0, None), (0, 3)]
    state = {}
    for mode in modes:
        sok.context.reset()
        with strategy.scope():
            comm = sok.init(comm_tool="tf", use_legacy_optimizer=False)
        state["mode"], state["session"] = mode, None
        if mode == "graph":
            with tf.Graph().as_default():
                tables = make_tables()
                session = state["session"] = comm.session()
                session.run(tf.compat.v1.global_variables_initializer())
                for c, case in enumerate(cases):
                    check(case, run_case(case, tables), f"graph, case {c}")
                for k, bad in bad_ids:
                    expect_bad_id(k, bad)
                for longer, shorter in bad_splits:
                    expect_bad_splits(longer, shorter)
                session.close()
        else:
            tables = make_tables()
            for c, case in enumerate(cases):
                check(case, run_case(case, tables), f"{mode}, case {c}")
            for k, bad in bad_ids:
                expect_bad_id(k, bad)
            for longer, shorter in bad_splits:
                expect_bad_splits(longer, shorter)
            if mode == "function":
                expect_empty_splits(tables)
    print("OK", flush=True)


if __name__ == "__main__":
    main()
