"""One worker of the multi-worker equivalence tests (tests/test_multiworker.py).

Trains a small two-table model for a few steps on a fixed global batch
stream, each worker on its slice of every global batch, and writes this
worker's part of the result (its table rows with their global ids/keys, the
dense weights, the losses) to <out>/rank<r>.npz. Run with --engine none and
one process it is the single-process reference the test compares against.

  --engine  horovod | tf | none      communication engine; or mirrored: one
            | mirrored               process, a MirroredStrategy over --world
                                     logical CPUs, each replica a worker
  --mode    function | graph         tf.function, or a tf.compat.v1 Session;
            | unrolled               or two steps in each tf.function call
                                     (Keras' steps_per_execution: a later
                                     step's exchanges may start early)
  --api     v2 | a2a | dist          sok.lookup_sparse on two tables; the 1.x
                                     All2AllDenseEmbedding; DistributedEmbedding
  --table   static | dynamic         sok.Variable / DynamicVariable (v2), or
            | localized              use_hashtable False / True (1.x layers);
                                     localized: the first v2 table lives whole
            | filtered               on the last worker; filtered: dynamic v2
                                     tables with admission filters (min_count
                                     2; filter_ratio 0.5, looked up with
                                     use_low_frequency_filter)
  The 1.x layers train with sok.optimizers.Adam (a2a) and with a native
  Adam through sok.OptimizerScope (dist); v2 with sok.OptimizerWrapper.
  --world   N                        the multi-worker run's size: static 1.x
                                     tables have vocab * N rows
"""

import argparse
import os
import sys
import time

import numpy as np

GLOBAL_BATCH = 24
STEPS = 6
DIM = 8
ROWS = 90          # rows of the v2 static table (global ids 0 .. ROWS-1)
VOCAB = 40         # max_vocabulary_size_per_gpu of the 1.x layers
SLOTS, NNZ = 3, 2  # slot_num, nnz_per_slot (All2AllDenseEmbedding)


def parse():
    p = argparse.ArgumentParser()
    p.add_argument("--engine", choices=["horovod", "tf", "none", "mirrored"], required=True)
    p.add_argument("--configs", required=True,
                   help="comma-separated api:table:mode, e.g. v2:static:function,a2a:dynamic:graph")
    p.add_argument("--world", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--no-dedup", action="store_true")
    p.add_argument("--steps", type=int, default=STEPS)
    p.add_argument("--fault", choices=["kill", "stall", "shape", "badid", "hugeid"],
                   help="rank 1 kills itself before step 3, stalls there forever, "
                        "builds its tables with another dimension, or looks up a row "
                        "id past the end of the first (static v2) table")
    args = p.parse_args()
    configs = []
    for text in args.configs.split(","):
        api, table, mode = text.split(":")
        assert api in ("v2", "a2a", "dist") and table in ("static", "dynamic", "localized", "filtered") \
            and mode in ("function", "graph", "unrolled"), text
        configs.append(argparse.Namespace(api=api, table=table, mode=mode, text=text,
                                          engine=args.engine, world=args.world,
                                          steps=args.steps, fault=args.fault))
    return args, configs


def zipf_ids(rng, shape, high):
    """Skewed ids in [0, high): a few ids repeat often, as real features do."""
    return np.minimum(rng.zipf(1.3, size=shape) - 1, high - 1).astype(np.int64)


def batches(args):
    """The global batches: per step, ragged ids for two features and labels."""
    rng = np.random.default_rng(1234)
    dynamic = args.table in ("dynamic", "filtered")
    key_space = 10 ** 9 if dynamic else ROWS
    out = []
    for _ in range(args.steps):
        b = {}
        if args.api == "v2":
            for f in ("a", "b"):
                lengths = rng.integers(0, 4, size=GLOBAL_BATCH)
                ids = zipf_ids(rng, lengths.sum(), key_space)
                if dynamic:  # large, sparse keys, also negative ones
                    ids = ids * 7919 - 500
                b[f] = (ids, lengths)
        elif args.api == "a2a":
            high = VOCAB * args.world
            b["ids"] = zipf_ids(rng, (GLOBAL_BATCH, SLOTS, NNZ), high)
        else:
            high = VOCAB * args.world
            lengths = rng.integers(1, 4, size=GLOBAL_BATCH * SLOTS)
            b["ids"] = (zipf_ids(rng, lengths.sum(), high), lengths)
        b["label"] = rng.integers(0, 2, size=GLOBAL_BATCH).astype(np.float32)
        out.append(b)
    return out


def local_slice(batch, rank, world, api):
    """This worker's samples of a global batch."""
    per = GLOBAL_BATCH // world
    lo, hi = rank * per, (rank + 1) * per
    out = {"label": batch["label"][lo:hi]}
    for f, v in batch.items():
        if f == "label":
            continue
        if isinstance(v, tuple):
            ids, lengths = v
            samples_per_row = SLOTS if api == "dist" else 1
            starts = np.concatenate([[0], np.cumsum(lengths)])
            rlo, rhi = lo * samples_per_row, hi * samples_per_row
            out[f] = (ids[starts[rlo]:starts[rhi]], lengths[rlo:rhi])
        else:
            out[f] = v[lo:hi]
    return out


def table_values(rows, seed, dim=DIM):
    return np.random.default_rng(seed).uniform(-0.5, 0.5, size=(rows, dim)).astype(np.float32)


def main():
    args, configs = parse()
    import tensorflow as tf

    tf.compat.v1.enable_eager_execution()  # TF 1.x starts in graph mode

    import sok_graph as sok

    strategy = None
    if args.engine == "horovod":
        import horovod.tensorflow as hvd

        hvd.init()
        rank, world = hvd.rank(), hvd.size()
    elif args.engine == "tf":
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        rank = strategy.cluster_resolver.task_id
        world = strategy.num_replicas_in_sync
    elif args.engine == "mirrored":
        from mirrored_cpus import mirrored_strategy_on_cpus

        # One process: each replica (a logical CPU) is a worker.
        strategy = mirrored_strategy_on_cpus(args.world)
        rank, world = 0, args.world
    else:
        rank, world = 0, 1
    if args.no_dedup:
        sok.lookup.dedup_before_exchange = False  # what the byte-count test compares
    sok.communication.count_bytes(True)
    for config in configs:
        sok.context.reset()
        graph = tf.Graph() if config.mode == "graph" else None
        with graph.as_default() if graph is not None else _null():
            run_config(config, args, strategy, rank, world, sok, tf)


def run_config(config, args, strategy, rank, world, sok, tf):
    started = time.time()
    init_op = None
    mirrored = config.engine == "mirrored"
    with strategy.scope() if strategy is not None else _null():
        if config.api == "v2":
            # The same Keras optimizers for every configuration of this process
            # (init's legacy rebinding would otherwise carry over into the 1.x
            # configurations run after it).
            sok.init(comm_tool="tf" if mirrored else config.engine, use_legacy_optimizer=False)
        else:
            init_op = sok.Init(global_batch_size=GLOBAL_BATCH)
    comm = sok.context.communicator()
    assert comm.world_size == world, (comm.world_size, world)
    assert comm.in_process == mirrored, comm.describe()
    if mirrored:  # per step, every replica's slice
        data = [[local_slice(b, r, world, config.api) for r in range(world)]
                for b in batches(config)]
    else:
        data = [local_slice(b, rank, world, config.api) for b in batches(config)]
    if config.fault in ("badid", "hugeid") and rank == 1:
        ids, lengths = data[0]["a"]
        lengths = lengths.copy()
        lengths[0] += 1  # the first sample gets the id ROWS (or one that wraps id * tables) too
        bad = ROWS if config.fault == "badid" else 2 ** 62 + 1
        data[0]["a"] = (np.concatenate([[bad], ids]), lengths)
    sok.communication.reset_bytes_sent()
    # The mirrored run builds its model (Keras optimizers, the dense weight)
    # under the strategy's scope and steps through strategy.run.
    with strategy.scope() if mirrored else _null():
        model = Model(config, sok, tf, rank, strategy if mirrored else None)
    losses = model.train(data, comm, init_op)
    out = os.path.join(args.out, config.text.replace(":", "-"))
    os.makedirs(out, exist_ok=True)
    np.savez(os.path.join(out, f"rank{rank}.npz"), losses=np.array(losses),
             dense=model.dense_value(), bytes_sent=np.int64(sok.communication.bytes_sent()),
             **model.tables())
    print(f"rank {rank} {config.text}: losses {losses} ({time.time() - started:.1f} s)",
          flush=True)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class Model:
    """The model, built once for tf.function or graph mode."""

    def __init__(self, args, sok, tf, rank=0, strategy=None):
        self.args, self.sok, self.tf = args, sok, tf
        self.strategy = strategy
        self.fault = args.fault if rank == 1 else None
        dim = DIM + 1 if self.fault == "shape" else DIM
        self.graph = args.mode == "graph"
        if args.api == "v2":
            if args.table in ("static", "localized"):
                # "localized": the first table lives whole on the last worker.
                mode = f"localized:{args.world - 1 if args.engine != 'none' else 0}" \
                    if args.table == "localized" else "distributed"
                self.embs = [sok.Variable(table_values(ROWS, 1, dim), name="ta", mode=mode),
                             sok.Variable(table_values(ROWS, 2, dim), name="tb")]
            else:
                filters = ({"min_count": 2}, {"filter_ratio": 0.5}) \
                    if args.table == "filtered" else ({}, {})
                # Names of their own: the tf engine's graph-mode Session
                # outlives a config's graph, and a table created under a
                # name it already holds keeps that table's rows.
                names = ("fa", "fb") if args.table == "filtered" else ("da", "db")
                self.embs = [sok.DynamicVariable(dimension=dim, initializer="zeros",
                                                 name=names[0], **filters[0]),
                             sok.DynamicVariable(dimension=dim, initializer="zeros",
                                                 name=names[1], **filters[1])]
            in_dim = 2 * dim
        else:
            cls = sok.All2AllDenseEmbedding if args.api == "a2a" else sok.DistributedEmbedding
            kw = dict(max_vocabulary_size_per_gpu=VOCAB * (args.world if args.engine == "none"
                                                           else 1),
                      embedding_vec_size=DIM, slot_num=SLOTS,
                      use_hashtable=args.table == "dynamic")
            if args.api == "a2a":
                self.layer = cls(nnz_per_slot=NNZ, **kw)
            else:
                self.layer = cls(combiner="sum", max_nnz=4, **kw)
            self.embs = [self.layer.embedding_variable]
            in_dim = SLOTS * (NNZ if args.api == "a2a" else 1) * DIM
        # A resource variable on TF 1.x too (TF2's default): a TF1 graph's ref
        # variable is read again by the backward matmul, which may then see
        # the dense update of the same step.
        self.w = tf.compat.v1.Variable(
            np.linspace(-0.3, 0.3, in_dim, dtype=np.float32).reshape(in_dim, 1), name="w",
            use_resource=True)
        if args.api != "v2" or args.table in ("dynamic", "filtered"):
            # Same starting rows on every run: keys 0 .. R-1 of the whole table.
            rows = VOCAB * args.world if args.api != "v2" else 0
            self.initial = table_values(rows, 3) if rows else None
        self.scope = None
        if args.api == "dist":
            # A native optimizer on the tables, through sok.OptimizerScope.
            self.emb_opt = tf.compat.v1.train.AdamOptimizer(0.05) if self.graph else \
                tf.keras.optimizers.Adam(0.05)
            self.scope = sok.OptimizerScope(self.embs)
        elif args.api == "a2a":
            self.emb_opt = sok.optimizers.Adam(learning_rate=0.05)
        elif self.graph:
            self.emb_opt = sok.OptimizerWrapper(tf.compat.v1.train.AdamOptimizer(0.05))
        else:
            self.emb_opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.05))
        self.dense_opt = tf.keras.optimizers.SGD(0.5) if not self.graph else \
            tf.compat.v1.train.GradientDescentOptimizer(0.5)

    # ------------------------------------------------------------- the step
    def forward(self, inputs):
        tf, sok = self.tf, self.sok
        if self.args.api == "v2":
            ids = [tf.RaggedTensor.from_row_lengths(inputs[f][0], inputs[f][1])
                   for f in ("a", "b")]
            a, b = sok.lookup_sparse(self.embs, ids, combiners=["sum", "mean"],
                                     use_low_frequency_filter=self.args.table == "filtered")
            x = tf.concat([a, b], 1)
        elif self.args.api == "a2a":
            x = tf.reshape(self.layer(inputs["ids"]), [-1, SLOTS * NNZ * DIM])
        else:
            sp = tf.RaggedTensor.from_row_lengths(inputs["ids"][0],
                                                  inputs["ids"][1]).to_sparse()
            x = tf.reshape(self.layer(sp), [-1, SLOTS * DIM])
        logits = tf.squeeze(tf.matmul(x, self.w), 1)
        per_sample = tf.nn.sigmoid_cross_entropy_with_logits(labels=inputs["label"],
                                                              logits=logits)
        # Each worker's share of the global mean: summed over workers (the
        # all-to-all backward sums the tables' gradients; the dense gradient
        # is all-reduced below) it is the single-process loss.
        return tf.reduce_sum(per_sample) / GLOBAL_BATCH

    def step(self, inputs, comm):
        tf = self.tf
        if self.graph:
            loss = self.forward(inputs)
            grads = tf.compat.v1.gradients(loss, self.embs + [self.w])
        else:
            with tf.GradientTape() as tape:
                loss = self.forward(inputs)
            grads = tape.gradient(loss, self.embs + [self.w])
        # Under MirroredStrategy the dense optimizer sums the replicas' gradients.
        dense_grad = grads[-1] if self.strategy is not None else comm.allreduce(
            tf.convert_to_tensor(grads[-1]))
        with self.scope if self.scope is not None else _null():
            emb_update = self.emb_opt.apply_gradients(zip(grads[:-1], self.embs))
        ops = [emb_update, self.dense_opt.apply_gradients([(dense_grad, self.w)])]
        total = comm.allreduce(loss)
        if self.graph:
            with tf.control_dependencies([op for op in ops if op is not None]):
                return tf.identity(total)
        return total

    def replicated_step(self, inputs, comm):
        """The step: on this worker, or (mirrored) on every replica, each on
        its slice inputs[replica]; the loss of the first."""
        tf = self.tf
        if self.strategy is None:
            return self.step(inputs, comm)

        def replica_step():
            ctx = tf.distribute.get_replica_context()
            return self.step(inputs[tf.get_static_value(ctx.replica_id_in_sync_group)], comm)

        losses = self.strategy.experimental_local_results(self.strategy.run(replica_step))
        # In a Session every replica's step (its updates) runs only if fetched.
        with tf.control_dependencies(losses):
            return tf.identity(losses[0])

    def _set_initial_rows(self):
        if getattr(self, "initial", None) is None:
            return None
        return self.sok.Saver().load_embedding_values(self.embs[0], self.initial)

    def train(self, data, comm, init_op):
        tf = self.tf
        losses = []
        if self.graph:
            ph = [self._placeholders(d) for d in data[0]] if self.strategy is not None \
                else self._placeholders(data[0])
            loss = self.replicated_step(ph, comm)
            init = self._set_initial_rows()
            # The tf.distribute engine runs graphs in a Session of its worker's
            # gRPC server, the mirrored run in one that sees every replica's
            # CPU; the others in a plain one.
            self.sess = comm.session() if hasattr(comm, "session") else tf.compat.v1.Session()
            if init_op is not None:
                self.sess.run(init_op)
            self.sess.run([tf.compat.v1.global_variables_initializer(),
                           tf.compat.v1.local_variables_initializer()])
            if init is not None:
                self.sess.run(init)
            for i, batch in enumerate(data):
                self._maybe_fail(i)
                losses.append(float(self.sess.run(loss, self._feed(ph, batch))))
            return losses
        self._set_initial_rows()
        replicated = lambda inputs: self.replicated_step(inputs, comm)  # noqa: E731
        try:
            step = tf.function(replicated, reduce_retracing=True)
        except TypeError:  # TF 1.15's name for it
            step = tf.function(replicated, experimental_relax_shapes=True)
        if self.args.mode == "unrolled":
            # Two steps a call, as one graph: the second step's lookup may
            # start before the first step's update (its keys' exchange
            # does; its rows must wait for the update).
            pairs = tf.function(lambda a, b: (replicated(a), replicated(b)))
            assert len(data) % 2 == 0, len(data)
            for i in range(0, len(data), 2):
                inputs = [tf.nest.map_structure(tf.constant, b) for b in data[i:i + 2]]
                losses.extend(float(x) for x in pairs(*inputs))
            return losses
        for i, batch in enumerate(data):
            self._maybe_fail(i)
            inputs = tf.nest.map_structure(tf.constant, batch)
            losses.append(float(step(inputs)))
        return losses

    def _maybe_fail(self, step):
        if step != 2 or self.fault not in ("kill", "stall"):
            return
        print(f"rank 1: {self.fault} before step {step} at {time.time():.3f}", flush=True)
        if self.fault == "kill":
            os.kill(os.getpid(), 9)
        while True:
            time.sleep(60)

    def _placeholders(self, example):
        tf = self.tf
        ph = {}
        for k, v in example.items():
            if isinstance(v, tuple):
                ph[k] = (tf.compat.v1.placeholder(tf.int64, [None]),
                         tf.compat.v1.placeholder(tf.int64, [None]))
            else:
                ph[k] = tf.compat.v1.placeholder(tf.as_dtype(v.dtype), [None] + list(v.shape[1:]))
        return ph

    def _feed(self, ph, batch):
        if isinstance(batch, list):  # mirrored: every replica's slice
            feed = {}
            for p, b in zip(ph, batch):
                feed.update(self._feed(p, b))
            return feed
        feed = {}
        for k, v in batch.items():
            if isinstance(v, tuple):
                feed[ph[k][0]], feed[ph[k][1]] = v
            else:
                feed[ph[k]] = v
        return feed

    # ------------------------------------------------------------ results
    def _run(self, x):
        if self.graph:
            return self.sess.run(x)
        return self.tf.nest.map_structure(lambda t: t.numpy(), x)

    def dense_value(self):
        return self._run(self.tf.convert_to_tensor(self.w))

    def tables(self):
        out = {}
        for i, t in enumerate(self.embs):
            keys, rows = self._run(self.sok.export(t))
            out[f"keys{i}"], out[f"rows{i}"] = keys, rows
        return out


if __name__ == "__main__":
    sys.exit(main())
