"""The SOK 1.x embedding layers, `All2AllDenseEmbedding` and
`DistributedEmbedding`, on the 2.x engine (sok.Variable / DynamicVariable
tables, the fused lookup), plus `get_embedding` and `GraphKeys`.

Each layer owns one table, `embedding_variable`, holding
max_vocabulary_size_per_gpu rows on each worker:
- use_hashtable=True: keys are arbitrary integers of key_dtype; the table is
  a DynamicVariable bounded by the vocabulary size (least recently used keys
  are evicted once it is full);
- use_hashtable=False: keys index rows directly; the table is a distributed
  sok.Variable of max_vocabulary_size_per_gpu * workers rows (key k lives on
  worker k % workers), and a key outside it is an error.

Tables hold float32 rows: a layer's `dtype` is float32 or a mixed-precision
policy of float32 variables ("mixed_float16", "mixed_bfloat16"), whose compute
dtype the output is cast to, as Keras's Embedding does; another dtype is a
ValueError.

Keras 3 lists only its own Variable type among a layer's weights, so the
layers report their table through `variables` / `trainable_variables` /
`weights` themselves: `model.trainable_variables` includes the table on
Keras 2 and 3 alike, and `sok.split_embedding_variable_from_others` finds it.
"""

import weakref

import numpy as np
import tensorflow as tf

from sok_graph import compat, context
from sok_graph.initializers import initializer_spec, own_seed, static_initializer
from sok_graph.tables.static import Variable
from sok_graph.tables.dynamic import DynamicVariable
from sok_graph.tables.keras_weights import hold_for_keras
from sok_graph.lookup import all2all_dense_embedding, lookup_sparse
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.ops import lookup as lookup_ops
from sok_graph.v1 import session


class GraphKeys:
    """Graph collections the 1.x layers add themselves and their tables to
    (graph mode). Exported meta graphs hold them empty: Python objects are
    not rebuilt by an import (build the layers again after one)."""
    SparseOperationKitEmbeddingLayers = "SparseOperationKitEmbeddingLayers"
    SparseOperationKitEmbeddingVariables = "SparseOperationKitEmbeddingVariables"


for _collection in (GraphKeys.SparseOperationKitEmbeddingLayers,
                    GraphKeys.SparseOperationKitEmbeddingVariables):
    compat.leave_out_of_meta_graphs(_collection)


_layers_by_name = weakref.WeakValueDictionary()


def get_embedding(name):
    """The 1.x embedding layer called `name` (its Keras name)."""
    layer = _layers_by_name.get(name)
    if layer is None:
        raise ValueError(f"no sok embedding layer is named {name!r}; there are "
                         f"{sorted(_layers_by_name.keys())}")
    return layer


class _BoundedTable(DynamicVariable):
    """A DynamicVariable bounded by a vocabulary size that need not be a
    power of two (SOK's power-of-two rule is for var_type='hybrid'), created
    after the ops in `initialize_after` (sok.Init's op in graph mode)."""

    def __init__(self, *args, initialize_after=(), **kwargs):
        self._initialize_after = list(initialize_after)
        super().__init__(*args, **kwargs)

    def _create_op(self):
        # Only the creating op waits for Init's op; lookups read the handle.
        with tf.control_dependencies(self._initialize_after):
            return super()._create_op()

    def _capacity_config(self, cfg):
        bound = int(cfg["max_capacity"])
        if bound > dynamic_ops.MAX_ROWS:
            raise ValueError(f"max_capacity must be <= {dynamic_ops.MAX_ROWS} (the most rows a "
                             f"table holds); got {bound}")
        return dict(init_capacity=min(bound, 1 << 16), max_capacity=bound, hbm_bytes=-1)


def _positive_int(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer; got {value!r}")
    return int(value)


class _EmbeddingLayer(tf.keras.layers.Layer):
    """What both 1.x layers share: the table, its registration, and how it is
    reported as the layer's weights."""

    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable,
                 key_dtype, embedding_initializer, **kwargs):
        super().__init__(**kwargs)
        # sok's ops have no XLA kernels. Keras 3 compiles Model.fit's step
        # with XLA on a GPU unless a layer says it cannot (compile's
        # jit_compile="auto"), and fit then failed with "Detected
        # unsupported operations ... XLA_GPU_JIT". Keras 2 ignores this.
        self.supports_jit = False
        self._output_dtype = self._checked_dtype(kwargs.get("dtype"))
        comm = context.communicator(f"creating a sok.{type(self).__name__} (call "
                                    "sok.Init(global_batch_size=...) first)")
        self.max_vocabulary_size_per_gpu = _positive_int("max_vocabulary_size_per_gpu",
                                                         max_vocabulary_size_per_gpu)
        self.embedding_vec_size = _positive_int("embedding_vec_size", embedding_vec_size)
        if not isinstance(use_hashtable, bool):
            raise TypeError(f"use_hashtable must be a bool; got {use_hashtable!r}")
        self.use_hashtable = use_hashtable
        try:
            self.key_dtype = tf.as_dtype(key_dtype or tf.int64)
        except TypeError:
            # TensorFlow's "Cannot convert the argument `type_value`" named
            # neither the layer's argument nor what it takes.
            raise TypeError(f"key_dtype must be int32 or int64; got {key_dtype!r}") from None
        if self.key_dtype not in (tf.int32, tf.int64):
            raise TypeError(f"key_dtype must be int32 or int64; got {self.key_dtype.name}")
        # sok.Init(seed=s): each layer's rows from a seed of its own drawn
        # from s (one seed for all made every layer of a shape an identical
        # copy), numbered from sok.Init; without it, Keras' unseeded draws
        # and the table's own seed.
        seed = context.v1_config("seed")
        if seed is not None:
            seed = own_seed(seed)
        if use_hashtable and isinstance(embedding_initializer, (np.ndarray, tf.Tensor,
                                                                  tf.Variable, list)):
            # A hashtable has no row numbers that an array of rows could fill.
            raise TypeError("embedding_initializer of a hashtable layer (use_hashtable=True) "
                            "must be None, a name, a number or an initializer; got an array "
                            f"({type(embedding_initializer).__name__})")
        if embedding_initializer is None:
            # A Keras Embedding's default: uniform in [-0.05, 0.05).
            embedding_initializer = tf.keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)
        self.embedding_initializer = embedding_initializer
        # In graph mode the table is initialized after sok.Init's op.
        after = session.creation_dependencies()
        if use_hashtable:
            # The initializer's own errors name it, not the table's capacity
            # (the ValueError of the table below is about that).
            try:
                initializer_spec(embedding_initializer, seed)
            except (TypeError, ValueError) as e:
                raise type(e)(f"embedding_initializer: {e}") from None
            try:
                self.embedding_variable = _BoundedTable(
                    self.embedding_vec_size, initializer=embedding_initializer,
                    var_type="hybrid", key_type=self.key_dtype, name=f"{self.name}_table",
                    initialize_after=after, max_capacity=self.max_vocabulary_size_per_gpu,
                    seed=seed)
            except ValueError as e:
                # The table's own argument names mean nothing to the layer's user.
                raise ValueError(
                    f"max_vocabulary_size_per_gpu={self.max_vocabulary_size_per_gpu} does not "
                    f"make a hashtable of {self.embedding_vec_size}-wide rows: the table "
                    f"(max_capacity = max_vocabulary_size_per_gpu) says: {e}") from None
        else:
            rows = self.max_vocabulary_size_per_gpu * comm.world_size
            with tf.control_dependencies(after):
                initial = self._initial_rows(rows)
            self.embedding_variable = Variable(initial, mode="distributed",
                                               name=f"{self.name}_table")
        # The layer saves its table in Keras weights files (save_own_variables).
        hold_for_keras(self.embedding_variable, self)
        _layers_by_name[self.name] = self
        if not tf.executing_eagerly():
            tf.compat.v1.add_to_collection(GraphKeys.SparseOperationKitEmbeddingLayers, self)
            tf.compat.v1.add_to_collection(GraphKeys.SparseOperationKitEmbeddingVariables,
                                           self.embedding_variable)

    def __call__(self, inputs, *args, **kwargs):
        # Keras 3 builds a layer from its input's shape before the first
        # call, and ids of no known rank (a placeholder or sparse_placeholder
        # made without a shape, which the layers take) failed there with "as_list()
        # is not defined on an unknown TensorShape", naming neither the
        # layer nor its argument. The table was made in __init__: building
        # needs no shape, and call checks the ids' rank when the graph runs.
        shape = getattr(inputs, "shape", None)
        # A Keras 3 input (keras.Input, a functional model's KerasTensor)
        # has a tuple for a shape, which has no rank.
        if not self.built and shape is not None and tf.TensorShape(shape).rank is None:
            self.built = True
        return super().__call__(inputs, *args, **kwargs)

    def _checked_dtype(self, given):
        """The dtype of the layer's output: float32, or a mixed-precision
        policy's compute dtype (float16, bfloat16), to which the float32 rows
        are cast as Keras's Embedding casts them. Tables hold float32 rows, so
        a layer whose variables would be of another dtype (dtype=tf.float16,
        "float64", ...) is a ValueError naming `dtype`: it used to be ignored,
        and float32 rows returned."""
        variable = tf.as_dtype(self.dtype or tf.float32)
        compute = tf.as_dtype(getattr(self, "compute_dtype", None)
                              or getattr(self, "_compute_dtype", None) or variable)
        if variable != tf.float32 or compute not in (tf.float32, tf.float16, tf.bfloat16):
            raise ValueError(
                f"{type(self).__name__}: dtype={given!r} makes the layer's variables "
                f"{variable.name} and its computation {compute.name}; its table holds float32 "
                f"rows: dtype must be float32 (the default) or a mixed-precision policy of "
                f"float32 variables (\"mixed_float16\", \"mixed_bfloat16\"), whose compute "
                f"dtype the output takes")
        return compute

    def _output(self, rows):
        """The rows in the layer's output dtype (see _checked_dtype)."""
        return rows if self._output_dtype == tf.float32 else tf.cast(rows, self._output_dtype)

    def _initial_rows(self, rows):
        init = self.embedding_initializer
        shape = [rows, self.embedding_vec_size]
        if isinstance(init, (str, int, float, np.number)) and not isinstance(init, bool):
            try:
                init = static_initializer(init)
            except ValueError as e:  # Keras's "Could not interpret initializer identifier"
                raise ValueError(f"embedding_initializer: {e}") from None
        if isinstance(init, type):
            # Called as init(shape=..., dtype=...), the class failed with
            # "Zeros() takes no arguments", naming neither the layer nor
            # embedding_initializer.
            raise TypeError(f"{self.name}: embedding_initializer must be an initializer "
                            f"object, a name, a number or a {shape} array; got the class "
                            f"{init.__name__} (give an instance: {init.__name__}())")
        if callable(init):
            try:
                value = init(shape=shape, dtype=tf.float32)
            except (TypeError, ValueError) as e:
                # A callable of another signature (np.zeros: "Cannot interpret
                # 'tf.float32' as a data type") named nothing of the layer's.
                kind = TypeError if isinstance(e, TypeError) else ValueError
                raise kind(f"{self.name}: embedding_initializer {init!r} failed when called "
                           f"as init(shape={shape}, dtype=tf.float32): {e}") from None
        else:
            array = init if isinstance(init, (tf.Tensor, tf.Variable)) else np.asarray(init)
            if isinstance(array, np.ndarray) and array.dtype.kind not in "iuf":
                raise TypeError(f"embedding_initializer must be an initializer, a name, a "
                                f"number or a {shape} array of numbers; got "
                                f"{type(init).__name__} (a numpy array of {array.dtype})")
            with np.errstate(over="ignore"):
                value = tf.convert_to_tensor(array, tf.float32)
            if value.shape.as_list() != shape:
                raise ValueError(f"embedding_initializer holds a tensor of shape "
                                 f"{value.shape.as_list()}; the table is {shape}")
        # The rows must be finite, as a hashtable's initializer must be: a
        # NaN or an infinity (also float64 values beyond float32, which the
        # conversion made inf) was the table's initial value, without an
        # error.
        message = (f"{self.name}: embedding_initializer gives NaN or infinite rows (or values "
                   f"beyond float32); the table's initial rows must be finite")
        try:
            # Also the identity op on which the dependency on sok.Init's op
            # (graph mode) sits, before the variable is initialized from it.
            return tf.debugging.check_numerics(value, message)
        except tf.errors.InvalidArgumentError:  # eagerly: at once
            raise ValueError(message) from None

    # The table is this layer's only weight (see the module docstring).
    def _tables(self):
        return [self.embedding_variable]

    # Keras' save_weights / load_weights (and ModelCheckpoint) in the
    # .weights.h5 format store each layer's Keras variables through these
    # two; a table is none, so Keras 3 saved an empty group for the layer
    # and a load restored nothing, without a word. The table's keys (row
    # numbers of a static table) and rows are stored instead.
    def save_own_variables(self, store):
        self._whole_table_here("save_weights")
        from sok_graph.variables import export

        keys, rows = export(self.embedding_variable)
        store["keys"] = np.asarray(keys)
        store["rows"] = np.asarray(rows)

    def load_own_variables(self, store):
        self._whole_table_here("load_weights")
        if sorted(store.keys()) != ["keys", "rows"]:
            raise ValueError(f"load_weights: the file's entry for sok layer '{self.name}' holds "
                             f"{sorted(store.keys())}, not the table's keys and rows (a file "
                             f"saved before sok layers saved their tables keeps none)")
        keys, rows = np.asarray(store["keys"]), np.asarray(store["rows"])
        table = self.embedding_variable
        if self.use_hashtable:
            table.replace_rows(keys, rows)
            return
        shape = tuple(table.shape.as_list())
        if rows.shape != shape or not np.array_equal(keys, np.arange(shape[0])):
            raise ValueError(f"load_weights: the file holds {rows.shape[0]} rows of "
                             f"{rows.shape[1:]} for sok layer '{self.name}', whose table is "
                             f"{list(shape)}")
        table.assign(rows)

    def _whole_table_here(self, what):
        """A Keras weights file holds one process's view of the table: the
        whole table only where one worker holds it all."""
        comm = context.communicator(what)
        if comm.world_size != 1:
            raise ValueError(
                f"{what}: sok layer '{self.name}' has its table sharded over "
                f"{comm.world_size} workers, which a Keras weights file cannot hold; save and "
                f"restore it with sok.Saver (dump_to_file / restore_from_file)")

    @property
    def trainable_weights(self):
        return self._tables() if self.trainable else []

    @property
    def non_trainable_weights(self):
        return [] if self.trainable else self._tables()

    @property
    def weights(self):
        return self._tables()

    @property
    def trainable_variables(self):
        return self.trainable_weights

    @property
    def non_trainable_variables(self):
        return self.non_trainable_weights

    @property
    def variables(self):
        return self._tables()

    def count_params(self):
        return self.max_vocabulary_size_per_gpu * self.embedding_vec_size

    def _ids(self, ids, what):
        if not ids.dtype.is_integer or ids.dtype not in (tf.int32, tf.int64):
            raise TypeError(f"{what} must hold int32 or int64 keys; got {ids.dtype.name}")
        if self.use_hashtable and ids.dtype != self.key_dtype:
            if self.key_dtype == tf.int32:
                ids = self._checked_int32(ids, what)
            ids = tf.cast(ids, self.key_dtype)
        return ids

    def _checked_int32(self, ids, what):
        """int64 `ids`, once a check that each fits the table's int32 keys
        (key_dtype=tf.int32) has passed: the cast took 2^32 + 5 as key 5,
        another key's row, without an error."""
        info = np.iinfo(np.int32)
        flat = tf.reshape(ids, [-1])
        bad = tf.logical_or(flat < info.min, flat > info.max)
        first = tf.gather(tf.concat([tf.boolean_mask(flat, bad), tf.zeros([1], flat.dtype)], 0),
                          0)
        check = tf.debugging.Assert(
            tf.logical_not(tf.reduce_any(bad)),
            [f"{self.name}: {what} must hold keys in int32's range [{info.min}, {info.max}] "
             f"(the layer's key_dtype is int32); got", first])
        with tf.control_dependencies([check]):
            return tf.identity(ids)

    def get_config(self):
        config = super().get_config()
        config.update(max_vocabulary_size_per_gpu=self.max_vocabulary_size_per_gpu,
                      embedding_vec_size=self.embedding_vec_size,
                      use_hashtable=self.use_hashtable, key_dtype=self.key_dtype.name)
        return config


class All2AllDenseEmbedding(_EmbeddingLayer):
    """``All2AllDenseEmbedding(max_vocabulary_size_per_gpu, embedding_vec_size,
    slot_num, nnz_per_slot, dynamic_input=False, use_hashtable=True,
    key_dtype=None, embedding_initializer=None, **kwargs)``

    call(inputs [batch, slot_num, nnz_per_slot], training=True) returns
    [batch, slot_num, nnz_per_slot, embedding_vec_size]: the row of every key,
    as tf.nn.embedding_lookup. With dynamic_input=True the inputs may have any
    shape (e.g. the output of tf.unique) and the result is inputs.shape + [dim].
    """

    def __init__(self, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num, nnz_per_slot,
                 dynamic_input=False, use_hashtable=True, key_dtype=None,
                 embedding_initializer=None, **kwargs):
        self.slot_num = _positive_int("slot_num", slot_num)
        self.nnz_per_slot = _positive_int("nnz_per_slot", nnz_per_slot)
        if not isinstance(dynamic_input, bool):
            raise TypeError(f"dynamic_input must be a bool; got {dynamic_input!r}")
        self.dynamic_input = dynamic_input
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable,
                         key_dtype, embedding_initializer, **kwargs)

    def call(self, inputs, training=True):
        if isinstance(inputs, (tf.SparseTensor, tf.RaggedTensor)):
            # tf.convert_to_tensor's message named neither the layer nor inputs.
            raise TypeError(f"{self.name}: inputs must be a dense tensor of keys [batch, "
                            f"slot_num, nnz_per_slot]; got a {type(inputs).__name__} (a "
                            f"DistributedEmbedding takes sparse or ragged keys)")
        ids = self._ids(tf.convert_to_tensor(inputs), "inputs")
        checks = []
        if not self.dynamic_input:
            shape = ids.shape
            want = [self.slot_num, self.nnz_per_slot]
            message = (f"{self.name}: inputs must have shape [batch, slot_num={self.slot_num}, "
                       f"nnz_per_slot={self.nnz_per_slot}]")
            advice = "(pass dynamic_input=True for inputs of any shape)"
            if shape.rank is not None and (shape.rank != 3 or [
                    d for d, w in zip(shape.as_list()[1:], want) if d is not None and d != w]):
                raise ValueError(f"{message}; got {shape} {advice}")
            if shape.rank is None or not shape[1:].is_fully_defined():
                # Known only when the graph runs (a tf.function of
                # TensorSpec([None, None, None]), a placeholder): inputs of
                # any shape were looked up, [batch, 1, 4] giving rows
                # [batch, 1, 4, dim], where eagerly they are refused.
                got = tf.shape(ids, out_type=tf.int64)
                checks.append(tf.debugging.Assert(
                    tf.reduce_all(tf.equal(
                        tf.concat([tf.size(got, out_type=tf.int64)[None],
                                   tf.pad(got, [[0, 3]])[1:3]], 0),
                        tf.constant([3] + want, tf.int64))),
                    [f"{message} {advice}; got shape", got]))
        # Everything the lookup reads waits for the check (graph mode).
        with tf.control_dependencies(session.check_initialized() + checks):
            return self._output(all2all_dense_embedding(self.embedding_variable, ids,
                                                        name=self.name))

    def get_config(self):
        config = super().get_config()
        config.update(slot_num=self.slot_num, nnz_per_slot=self.nnz_per_slot,
                      dynamic_input=self.dynamic_input)
        return config


class DistributedEmbedding(_EmbeddingLayer):
    """``DistributedEmbedding(combiner, max_vocabulary_size_per_gpu,
    embedding_vec_size, slot_num, max_nnz, max_feature_num=1,
    use_hashtable=True, key_dtype=None, embedding_initializer=None, **kwargs)``

    call(sp_ids, training=True): sp_ids is a SparseTensor (or RaggedTensor)
    [batch * slot_num, max_nnz] of keys, row b * slot_num + s holding sample
    b's keys of slot s; returns [batch, slot_num, embedding_vec_size], each
    slot's rows combined by `combiner` ("sum", "mean"; also "sqrtn") as
    tf.nn.embedding_lookup_sparse does. A slot without keys gives zeros.
    """

    def __init__(self, combiner, max_vocabulary_size_per_gpu, embedding_vec_size, slot_num,
                 max_nnz, max_feature_num=1, use_hashtable=True, key_dtype=None,
                 embedding_initializer=None, **kwargs):
        names = lookup_ops.combiner_names()
        if not isinstance(combiner, str) or combiner.lower() not in names:
            raise ValueError(f"combiner must be one of {names}; got {combiner!r}")
        self.combiner = combiner.lower()
        self.slot_num = _positive_int("slot_num", slot_num)
        self.max_nnz = _positive_int("max_nnz", max_nnz)
        self.max_feature_num = _positive_int("max_feature_num", max_feature_num)
        super().__init__(max_vocabulary_size_per_gpu, embedding_vec_size, use_hashtable,
                         key_dtype, embedding_initializer, **kwargs)

    def call(self, inputs, training=True):
        checks = []
        if isinstance(inputs, tf.SparseTensor):
            static = compat.constant_value(inputs.dense_shape)
            if static is not None and len(static) != 2:
                raise ValueError(f"{self.name}: inputs must be a 2-D SparseTensor [batch * "
                                 f"slot_num, max_nnz]; got dense_shape {[int(d) for d in static]}")
            if static is not None and static[-1] > self.max_nnz:
                raise ValueError(f"{self.name}: the SparseTensor's second dimension "
                                 f"({static[-1]}) exceeds max_nnz={self.max_nnz}")
            if static is not None and static[0] % self.slot_num:
                raise ValueError(f"{self.name}: the SparseTensor has {static[0]} rows; it must "
                                 f"have batch * slot_num rows (slot_num={self.slot_num})")
            rank = compat.sparse_static_shape(inputs).rank
            if static is None and rank is not None and rank != 2:
                # The lookup's own message named its argument, sp_ids[0].
                raise ValueError(f"{self.name}: inputs must be a 2-D SparseTensor [batch * "
                                 f"slot_num, max_nnz]; got rank {rank}")
            if static is None:
                # Its dense shape is known when the graph runs (a tf.function
                # of a SparseTensorSpec([None, None]), a sparse placeholder):
                # the checks above, then (rows failed in a reshape, naming
                # nothing; a dimension beyond max_nnz was accepted; another
                # rank was named as the lookup's sp_ids[0]).
                shape = tf.cast(inputs.dense_shape, tf.int64)
                checks += [
                    tf.debugging.assert_equal(
                        tf.size(shape), 2,
                        message=f"{self.name}: inputs must be a 2-D SparseTensor [batch * "
                                f"slot_num, max_nnz]; its dense_shape has another rank"),
                    tf.debugging.assert_less_equal(
                        shape[-1], tf.constant(self.max_nnz, tf.int64),
                        message=f"{self.name}: the second dimension of the SparseTensor exceeds "
                                f"max_nnz={self.max_nnz}"),
                    tf.debugging.assert_equal(
                        shape[0] % self.slot_num, tf.zeros([], tf.int64),
                        message=f"{self.name}: the SparseTensor must have batch * slot_num "
                                f"rows (slot_num={self.slot_num})")]
            values = inputs.values
        elif isinstance(inputs, tf.RaggedTensor):
            if inputs.ragged_rank != 1 or inputs.flat_values.shape.rank != 1:
                # The lookup's own message named its argument, sp_ids[0].
                raise ValueError(f"{self.name}: inputs must be a 2-D RaggedTensor [batch * "
                                 f"slot_num, (keys)]; got ragged rank {inputs.ragged_rank} with "
                                 f"values of rank {inputs.flat_values.shape.rank}")
            values = inputs.flat_values
            # A SparseTensor's dense shape bounds its rows by max_nnz; a
            # RaggedTensor's rows are bounded here, at run time.
            nrows = inputs.nrows()
            checks += [
                tf.debugging.assert_less_equal(
                    tf.reduce_max(tf.concat([[0], inputs.row_lengths()], 0)),
                    tf.cast(self.max_nnz, inputs.row_splits.dtype),
                    message=f"{self.name}: a row of the RaggedTensor has more than "
                            f"max_nnz={self.max_nnz} keys"),
                tf.debugging.assert_equal(
                    nrows % self.slot_num, tf.zeros([], nrows.dtype),
                    message=f"{self.name}: the RaggedTensor must have batch * slot_num "
                            f"rows (slot_num={self.slot_num})")]
        else:
            raise TypeError(f"{self.name}: inputs must be a tf.SparseTensor (or RaggedTensor) "
                            f"[batch * slot_num, max_nnz]; got {type(inputs).__name__}")
        ids = self._ids(values, "inputs")
        if isinstance(inputs, tf.SparseTensor):
            inputs = tf.SparseTensor(inputs.indices, ids, inputs.dense_shape)
        else:
            inputs = inputs.with_flat_values(ids)
        # Everything the lookup reads waits for the check (graph mode).
        with tf.control_dependencies(session.check_initialized() + checks):
            rows = lookup_sparse(self.embedding_variable, inputs, combiners=self.combiner,
                                 name=self.name)
        return self._output(tf.reshape(rows, [-1, self.slot_num, self.embedding_vec_size]))

    def get_config(self):
        config = super().get_config()
        config.update(combiner=self.combiner, slot_num=self.slot_num, max_nnz=self.max_nnz,
                      max_feature_num=self.max_feature_num)
        return config
