"""DeepRec's `CollectiveStrategy` front end: synchronous training with
model-parallel embedding tables, on sok_graph.

    strategy = sok.CollectiveStrategy()
    with strategy.scope(), tf.Graph().as_default():
        with strategy.embedding_scope():
            var = tf.compat.v1.get_variable(
                "var_1", shape=(1000, 3), initializer=tf.ones_initializer(),
                partitioner=tf.compat.v1.fixed_size_partitioner(strategy.world_size()))
        emb = tf.nn.embedding_lookup(var, ids)          # rows from their owners
        ...
        opt.minimize(loss)                              # gradients averaged over workers
        with tf.compat.v1.train.MonitoredTrainingSession() as sess:  # dense variables
            ...                                         # broadcast from rank 0

Engine (environment variable COLLECTIVE_STRATEGY):
  "sok"   (the default) Horovod: hvd.init() if needed, then sok.init("horovod").
          Start N workers with `python -m sok_graph.launch -np N script.py`
          (or horovodrun); a plain `python script.py` is one worker.
  "none"  one process, no communication.
DeepRec's "hb" (HybridBackend) is not available in sok_graph.

What the scopes do (each patch is installed when the outermost scope opens
and removed when it closes; nesting is allowed):

scope()
  - tf.compat.v1.train.Optimizer.compute_gradients (so minimize too): the
    gradient of an ordinary (data-parallel) variable is all-reduced and divided
    by the number of workers; the gradient of a sok variable is divided by it
    (the all-to-all backward already summed every worker's contribution).
    With each worker's loss a mean over its local batch this trains as one
    process would on the global batch (as Horovod's DistributedOptimizer).
    A sok table's gradient given to apply_gradients with several workers
    must come from compute_gradients (not tf.gradients or a GradientTape,
    which average nothing): a ValueError says so.
  - tf.clip_by_global_norm (tf.linalg.global_norm) and tf.clip_by_norm of a
    table's gradient take the norm over every worker's rows of the tables
    (each worker holds the gradient of its own rows), and the v1 loss
    scales (MixedPrecisionLossScaleOptimizer) skip a step where any
    worker's gradients are not finite: the workers clip and skip alike.
    Their norm is that of the gradient with each row's repeats summed (the
    lookup's gradient), where plain TensorFlow's IndexedSlices count each
    repeat apart: with repeated ids the two clip differently.
  - MonitoredTrainingSession gets a hook that, after the session is created
    (or restored), broadcasts every variable that is not part of a sok table
    (the tables' shards and their optimizer slots stay on their workers) from
    rank 0. Workers other than rank 0 write checkpoints and summaries under
    <checkpoint_dir>/worker<rank>: each worker's checkpoint holds its own
    shard of every sok table, so a restart restores all of them. Before the
    session starts, the workers check that all or none of them would
    restore a checkpoint and that its tables' shards have the shapes the
    checkpoint holds: a ValueError on every worker, before anything is
    restored, where one lacks its directory or the checkpoint was written
    by another number of workers (sok.dump / sok.load move tables between
    numbers of workers). Checkpoints of different steps (time-based saves
    on each worker's clock) are restored as they are, with a warning. A name-based tf.compat.v1.train.Saver of your own
    is not checked: restore each worker's own file, with the number of
    workers that wrote it.
  - tf.nn.embedding_lookup / embedding_lookup_sparse /
    safe_embedding_lookup_sparse (tf.nn and tf.compat.v1.nn) on a sok variable
    go to sok.all2all_dense_embedding / sok.lookup_sparse; anything else goes
    to TensorFlow's own function.

embedding_scope()
  - tf.compat.v1.get_variable (and a variable_scope's partitioner) with a
    partitioner and a [rows, dim] shape creates ONE sok.Variable holding the
    whole table's shape, sharded over the workers (row i on worker i % N),
    from the initializer evaluated for the full shape, under the name
    get_variable would give; not a PartitionedVariable. Feature columns
    (tf.compat.v1.feature_column.input_layer with embedding_column) use it,
    and their lookups are routed as above.
  - ids address the table as plain TensorFlow would address the partitioned
    variable: with partition_strategy='div' (TF 2, feature columns) id i is
    row i; with 'mod' (TF 1's default for tf.nn.embedding_lookup and
    embedding_lookup_sparse, every tf.compat.v1.nn lookup) id i is row i // n
    of part i % n, so the same initializer gives the same training on one
    process and on N workers. The exported serving table keeps that layout.

  - get_variable's regularizer sees this worker's shard; its loss is
    multiplied by the number of workers, so that the workers' mean loss is
    the whole table's and the table trains as in one process.

Limits: only tf.compat.v1 optimizers are patched (Keras optimizers are not);
wrapping an optimizer in hvd.DistributedOptimizer as well would average
twice; a variable_scope custom_getter is not applied to the sok tables. The
table is read through the routed lookups only: anything else that reads it
as a tensor (tf.gather, tf.reduce_sum, Session.run of it) gets this
worker's shard (rows i with i % N == rank, in order), as a sharded
sok.Variable's value is everywhere.

Modules: strategy (the CollectiveStrategy class), engine (COLLECTIVE_STRATEGY
and Horovod's start), patching (installing and removing the scopes' patches),
data_parallel (scope(): gradients, BroadcastHook, MonitoredTrainingSession),
model_parallel (embedding_scope(): partitioned get_variable), lookups (the
embedding lookups of both scopes), export (the SavedModel of
export_saved_model).
"""

from .data_parallel import BroadcastHook
from .engine import ENGINES
from .strategy import CollectiveStrategy

__all__ = ["BroadcastHook", "CollectiveStrategy", "ENGINES"]
