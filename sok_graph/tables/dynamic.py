"""`sok.DynamicVariable`: an embedding table keyed by arbitrary int32/int64 ids
that grows as new ids arrive, backed by the dynamic-table resource.

var_type="hbm" (the default, as in SOK): no bound on rows (SOK's
  GPU-memory table; on CPU the rows live in host memory). SOK's capacity
  settings (init_capacity, max_capacity, max_hbm_for_vectors) are accepted
  with it, as SOK passes them to that table too: init_capacity sizes the
  first allocation; the others neither bound nor evict ("hbm" never evicts).
var_type="hybrid" (SOK's HierarchicalKV table): at most max_capacity keys
  (default 2^26, SOK's);
  only when that many are held are the least recently (evict_strategy=
  "lru", the default) or least frequently ("lfu") used rows evicted. On a
  GPU, max_hbm_for_vectors GiB of rows live in GPU memory and the rest in
  pinned host memory that the table's kernels read and write in place, so a
  table may be larger than the GPU; the most used rows are moved into GPU
  memory as it trains (docs/gpu.md); unset, every row is in GPU memory. On
  CPU every row is in host memory. (max_hbm_for_vectors used to bound the
  rows as well, evicting once that much was used; it no longer evicts.)

Gradients w.r.t. a DynamicVariable are IndexedSlices whose indices are keys
(unique when they come from sok lookups), so sparse optimizers touch only the
rows a batch used.

A DynamicVariable is a `tf.Variable` (a subclass of the abstract class
`tf.Variable` names: VariableV1 on TF 1.x), as SOK's is, so TensorFlow's
variable machinery takes it where it takes SOK's:
- isinstance(v, tf.Variable) holds; in graph mode it is in
  tf.compat.v1.global_variables() and, when trainable, in
  trainable_variables(); Keras 2 layers list it among their weights, and
  tf.Module among its variables;
- a Session fetch of it (sess.run(v)) gives its size, [number of keys,
  dimension] as int64, as v.size does (SOK's gives the [1, dimension] value
  of the stand-in variable its table hides behind);
- tf.compat.v1.train.Saver() saves and restores the whole table: its keys,
  rows, last-use times and use counts, under the table's graph name (as a
  tf.Variable's op name: unique in the graph, with its name scope) plus
  "-keys", "-values", "-timestamps", "-frequencies" (SOK's Saver saves the
  stand-in's [1, dimension] value and leaves the table out);
- tf.compat.v1.train optimizers compute its gradient (IndexedSlices of keys);
  the optimizers' own sparse update works for plain gradient descent
  (scatter_sub); others update it inside sok.OptimizerScope or through
  sok.OptimizerWrapper.
It has no dense value: value(), read_value(), assign*(), numpy(), tensor
conversion and the operators raise NotImplementedError, as SOK's do for a
table in dynamic mode. It is not a ResourceVariable (kernels that read a
variable's handle in place never see the table), and it is compared and
hashed by identity (element-wise == means nothing without a dense value).
"""


import re
import weakref

import numpy as np
import tensorflow as tf

from sok_graph import compat, context, placement
from sok_graph.compat import keras as keras_compat
from sok_graph.tables import (admission, checkpoint_tag, register, repeated_key_checks,
                              replica_shards, rows_of_dtype, untagged, DYNAMIC)
from sok_graph.tables.keras_weights import KerasWeights, held_by
from sok_graph import initializers
from sok_graph.initializers import table_spec
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.ops import util as util_ops
from sok_graph.serving import mode as serving_mode


def reading_for_inference():
    """Whether a read built now is for inference: inside a Keras model's
    test_step or predict_step (model.evaluate, fit's validation pass,
    model.predict; compat.keras.in_keras_inference_call).

    An inference read finds the rows of the keys the table holds and reads
    the default row for the others (the admission filter's filter_default,
    else zeros: what the table's serving export serves), changing nothing:
    no key inserted, none evicted, no use count, time or admission count
    moved. A read for training inserts its new keys, which evicts others
    from a bounded table: predict or evaluate on ids training never saw
    evicted the trained rows of a bounded table, and admitted keys or moved
    them up an LRU / LFU order, without an error."""
    return keras_compat.in_keras_inference_call()


_DEFAULT_INIT_CAPACITY = 1 << 16
# A hybrid table's bound when none is given: SOK's (its HierarchicalKV
# table's max_capacity default, 64 x 2^20 keys). It used to be the initial
# capacity (2^16), so a SOK script that left max_capacity out lost rows to
# eviction from the 65,537th key on, without a word.
_DEFAULT_HYBRID_MAX_CAPACITY = 1 << 26


def _is_power_of_two(x):
    # bool is an int: True was taken as a bound of 1 row.
    return isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) \
        and x > 0 and (x & (x - 1)) == 0


class NoDenseValueError(NotImplementedError, ValueError):
    """A dense read or write of a DynamicVariable. NotImplementedError, as
    SOK raises for a table in dynamic mode; ValueError too, as TensorFlow's
    failed tensor conversions are (code that tries a conversion catches it)."""


def _refuse_dense(table, what):
    raise NoDenseValueError(
        f"DynamicVariable '{table._name}': {what} needs a dense value, which a dynamic table "
        f"does not have; read rows with sparse_read / tf.nn.embedding_lookup or sok.export "
        f"(sok.lookup_sparse where tf.nn.embedding_lookup_sparse or "
        f"safe_embedding_lookup_sparse would read the whole table), "
        f"write them with sok.assign or scatter_update, train the table with "
        f"sok.OptimizerWrapper or inside sok.OptimizerScope, and save it with "
        f"tf.train.Checkpoint, tf.compat.v1.train.Saver or sok.dump")


def _no_dense_value(method):
    """A tf.Variable method that needs a dense value: it raises
    NoDenseValueError naming what to use instead."""

    def refuse(self, *args, **kwargs):
        _refuse_dense(self, method)

    refuse.__name__ = method.split("(")[0]
    return refuse


# tf.Variable is VariableV1 on TF 1.x, Variable on TF 2.x: the class that
# isinstance(v, tf.Variable) asks about on each.
class _TableRefs:
    """The tables a table links to (its shadows), in the order linked. Not
    a list: Keras 3's weights files save every table they find in a list,
    tuple or dict attribute of a table they save (tables/keras_weights.py),
    and an optimizer's slot tables are no weights of the model."""

    def __init__(self):
        self._tables = []

    def append(self, table):
        self._tables.append(table)

    def __iter__(self):
        return iter(self._tables)

    def __len__(self):
        return len(self._tables)


# What a table sharded over workers tells a caller who passed another
# worker's key to a method that works on this worker's shard only.
_READ_ADVICE = ("read keys of every worker with sok.lookup_sparse, which sends each key "
                "to its owner")
_WRITE_ADVICE = "write each key on the worker that owns it"


class DynamicVariable(tf.Variable, compat.native_object_class(), KerasWeights):
    """``DynamicVariable(dimension, initializer=None, var_type=None, name=None,
    constraint=None, trainable=True, key_type=None, dtype=None, mode=None,
    **table_config)``

    table_config: init_capacity, max_capacity (hybrid: powers of two; the
    bound on keys, 2^26 when not given, as SOK's), max_hbm_for_vectors
    (hybrid: GiB of rows kept in GPU memory, the rest in host memory),
    evict_strategy ("lru" / "lfu"), seed;
    admission filters (sok_graph/tables/admission.py): filter_ratio (SOK's, for
    lookup_sparse(..., use_low_frequency_filter=True)), min_count,
    min_count_counters, min_count_hashes, filter_default.
    """

    # The tape and tf.Module treat objects with this attribute as resource
    # variables: gradients w.r.t. them are gradients w.r.t. `handle`.
    _should_act_as_resource_variable = True
    # Not sliced across variables (tf.compat.v1.train.Saver asks).
    _save_slice_info = None
    # As a NativeObject (the base above), TensorFlow's ops take the table as
    # it is: tf.nn.embedding_lookup(table, keys) reads rows through
    # sparse_read, as it does for a tf.Variable, and its gradient is
    # IndexedSlices of keys.

    _TABLE_CONFIG_KEYS = ("init_capacity", "max_capacity", "max_hbm_for_vectors",
                          "evict_strategy", "seed") + admission.SETTINGS

    def __new__(cls, *args, **kwargs):
        if serving_mode.active():
            # A servable graph being built: a serving table of plain
            # variables stands for the table (sok_graph/serving).
            return serving_mode.resolver().dynamic_stand_in(args, kwargs)
        # Under a MirroredStrategy whose replicas are the workers: one shard
        # per replica (sok_graph/tables/replica_shards.py), all with the
        # table's one seed, so that each draws a key's row as the whole
        # table would.
        comm = context.active()
        if replica_shards.replicates(comm) and kwargs.get("seed") is None:
            kwargs = dict(kwargs, seed=initializers.SharedSeed())
        shards = replica_shards.replicate(cls, args, kwargs, comm)
        return shards if shards is not None else super().__new__(cls)

    @classmethod
    def _variable_call(cls, *args, **kwargs):
        """TF 2.x's tf.Variable metaclass offers every construction to this
        hook first, with tf.Variable's parameters (a positional dimension
        lands on initial_value, and a keyword such as trainable= can collide
        with a positional argument there); it only builds plain tf.Variables,
        so the table's own constructor runs instead."""
        return None

    def __init__(self, dimension, initializer=None, var_type=None, name=None, constraint=None,
                 trainable=True, key_type=None, dtype=None, mode=None, **table_config):
        # The table is made where TensorFlow makes a variable: outside a
        # tf.function or Keras build being traced (a table made in a layer's
        # build() under model.fit, or in a tf.function's first trace). Made
        # in the traced graph, its handle was out of reach of every later
        # step ("SokDynamicTableHandle ... is out of scope and cannot be
        # used here").
        with tf.init_scope():
            self._make_table(dimension, initializer, var_type, name, constraint, trainable,
                             key_type, dtype, mode, table_config)

    def _make_table(self, dimension, initializer, var_type, name, constraint, trainable,
                    key_type, dtype, mode, table_config):
        if isinstance(dimension, bool) or not isinstance(dimension, (int, np.integer)) \
                or dimension < 1:
            raise ValueError(f"dimension must be a positive integer; got {dimension!r}")
        unknown = sorted(set(table_config) - set(self._TABLE_CONFIG_KEYS))
        if unknown:
            raise TypeError(f"unknown DynamicVariable arguments {unknown}; expected some of "
                            f"{list(self._TABLE_CONFIG_KEYS)}")
        if constraint is not None:
            raise ValueError("constraint is not supported for DynamicVariable")
        self._dimension = int(dimension)
        self._key_type = tf.as_dtype(key_type or tf.int64)
        if self._key_type not in (tf.int32, tf.int64):
            raise TypeError(f"key_type must be int32 or int64; got {self._key_type.name}")
        self._dtype = tf.as_dtype(dtype or tf.float32)
        if self._dtype != tf.float32:
            raise TypeError(f"dtype must be float32 for a DynamicVariable; got {self._dtype.name}")
        self._var_type = var_type or "hbm"
        # Which worker holds which keys: key k on worker k mod N (distributed),
        # or every key on one worker (mode="localized:<rank>").
        world_size, rank = context.world()
        if mode is None:
            mode = "distributed"
        kind, target = placement.parse_mode(mode, world_size)
        self._mode = mode
        self._placement = (world_size, rank, -1 if target is None else target)
        self._trainable = bool(trainable)
        # Graphs around a tf.while_loop body that read this table (see
        # refuse_a_gradient_lost_in_a_loop).
        self._graphs_around_reading_loops = weakref.WeakSet()
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str or None; got {type(name).__name__} {name!r}")
        self._name = name or "DynamicVariable"
        limits = self._capacity_config(table_config)
        eviction = str(table_config.get("evict_strategy", "lru")).lower()
        eviction = {"klru": "lru", "klfu": "lfu"}.get(eviction, eviction)
        if eviction not in dynamic_ops.EVICTIONS:
            raise ValueError(f"evict_strategy must be 'lru' or 'lfu'; got "
                             f"{table_config.get('evict_strategy')!r}")
        seed = table_config.get("seed")
        shared = seed if isinstance(seed, initializers.SharedSeed) else None
        spec = table_spec(initializer, None if shared else seed)
        # Which new keys get a row (sok_graph/tables/admission.py); None: every one.
        self._admission = admission.from_config(table_config)
        if spec["seed"] is None:
            # Drawn once every argument passed its checks: a table refused
            # (and caught) takes no number from the tables after it.
            spec["seed"] = shared.get() if shared else initializers.own_seed()
        self._table_config = dict(table_config)
        if shared:
            del self._table_config["seed"]  # a shard's settings are the table's, as given
        self._initializer_arg = initializer
        self._config = dict(limits, eviction=eviction, **spec)

        if tf.executing_eagerly():
            shared_name = compat.anonymous_name()
        else:
            shared_name = tf.compat.v1.get_default_graph().unique_name(self._name,
                                                                       mark_as_used=True)
        # The table lives where its handle op is placed (the worker's device
        # where the engine names one, else a GPU where one is visible, int32
        # or int64 keys alike); its ops follow the handle.
        with tf.name_scope(scope_name(self._name)), context.table_scope():
            self._handle = dynamic_ops.handle(shared_name)
            self._initializer_op = self._create_op()
            if not tf.executing_eagerly():
                # The initializer starts the table afresh, as a tf.Variable's
                # assigns its initial value: run again in a Session
                # (global_variables_initializer to start training over), it
                # empties the table, its slot tables (its shadows) and its
                # filter's counts. Its create op alone kept an existing
                # table: the dense layers started over, the embeddings and
                # their Adam moments went on trained.
                with tf.control_dependencies([self._initializer_op]):
                    self._initializer_op = dynamic_ops.clear(self._handle)
            if self._admission is not None:
                state = self._admission.create_ops(shared_name, self._key_type)
                if state and not tf.executing_eagerly():
                    with tf.control_dependencies(state):
                        state.append(self._admission.clear())
                    self._initializer_op = tf.group(self._initializer_op, *state)
            self._graph_element = None
            if compat.v1_graph_mode():
                # What a Session fetch of the table gives (see the module
                # docstring), made now: a fetch may come once the graph is
                # finalized. No control dependencies: a fetch runs nothing
                # else. (Not in a tf.function, which would run it each call.)
                with tf.control_dependencies(None):
                    self._graph_element = self._size_tensor()
        self._table_shared_name = shared_name
        if self._admission is not None:
            # The filter's counts and call count, saved by tf.train.Checkpoint.
            self._admission_state = admission.CheckpointState(self._admission, self._name,
                                                              self)
            self._track_trackable(self._admission_state, name="admission")
        # Tables keyed like this one (optimizer slots) that drop the keys this
        # table evicts or removes (add_shadow), so a key that comes back
        # starts afresh in all.
        self._shadows = _TableRefs()
        # Weak references to the tables this one shadows (add_shadow).
        self._shadow_of = []
        self._in_graph_mode = not tf.executing_eagerly()
        if tf.executing_eagerly():
            self._deleter = compat.eager_resource_deleter(self._handle)
        else:
            # global_variables_initializer() runs every GLOBAL_VARIABLES
            # entry's `initializer`; optimizers and Savers read the
            # collections as they do for a tf.Variable.
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, self)
            if self._trainable:
                tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, self)
        register(self)

    def _capacity_config(self, cfg):
        if self._var_type not in ("hbm", "hybrid"):
            raise ValueError(f"var_type must be 'hbm' or 'hybrid'; got {self._var_type!r}")
        init_capacity = cfg.get("init_capacity", _DEFAULT_INIT_CAPACITY)
        if isinstance(init_capacity, (bool, np.bool_)) or \
                not isinstance(init_capacity, (int, np.integer)) or init_capacity < 0:
            raise ValueError(f"init_capacity must be a non-negative integer; got {init_capacity!r}")
        if self._var_type == "hbm":
            # SOK hands every setting to the table as configuration; its
            # unbounded table takes the capacities as sizes, not limits.
            for key in ("max_capacity", "max_hbm_for_vectors"):
                value = cfg.get(key, 0)
                if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) \
                        or not np.isfinite(value) or value < 0:
                    raise ValueError(f"{key} must be a non-negative number; got {value!r}")
            if "evict_strategy" in cfg:
                raise ValueError(
                    f"evict_strategy={cfg['evict_strategy']!r} applies to var_type='hybrid' "
                    f"tables, which evict when full; a var_type='hbm' table grows without "
                    f"bound and never evicts")
            return dict(init_capacity=int(init_capacity), max_capacity=0, hbm_bytes=-1)
        max_capacity = cfg.get("max_capacity", max(_DEFAULT_HYBRID_MAX_CAPACITY, init_capacity))
        if "init_capacity" not in cfg and _is_power_of_two(max_capacity):
            # A bound below the default initial size starts at the bound:
            # max_capacity=1024 alone was refused as "init_capacity (65536)
            # must be <= max_capacity", naming a value nobody gave.
            init_capacity = min(init_capacity, max_capacity)
        for key, value in (("init_capacity", init_capacity), ("max_capacity", max_capacity)):
            if not _is_power_of_two(value):
                raise ValueError(f"{key} must be a power of two for var_type='hybrid'; "
                                 f"got {value!r}")
        if init_capacity > max_capacity:
            raise ValueError(f"init_capacity ({init_capacity}) must be <= max_capacity "
                             f"({max_capacity})")
        for key, value in (("init_capacity", init_capacity), ("max_capacity", max_capacity)):
            if value > dynamic_ops.MAX_ROWS:
                raise ValueError(f"{key} must be <= {dynamic_ops.MAX_ROWS} (the most rows a "
                                 f"table holds); got {value}")
        # HierarchicalKV's split: the values of up to max_hbm_for_vectors GiB
        # of rows live in GPU memory, the others in host memory; only
        # max_capacity bounds the keys. Unset: every row in GPU memory.
        gib = cfg.get("max_hbm_for_vectors")
        if gib is None:
            return dict(init_capacity=int(init_capacity), max_capacity=int(max_capacity),
                        hbm_bytes=-1)
        # Below 2^33 GiB: the op takes bytes as an int64 (1e30 failed with
        # Python's "int too big to convert", naming nothing).
        if isinstance(gib, bool) or not isinstance(gib, (int, float, np.number)) \
                or not np.isfinite(gib) or gib < 0 or gib >= (1 << 33):
            raise ValueError(f"max_hbm_for_vectors must be a non-negative number of GiB below "
                             f"2^33 (its bytes must fit in int64); got {gib!r}")
        return dict(init_capacity=int(init_capacity), max_capacity=int(max_capacity),
                    hbm_bytes=int(gib * (1 << 30)))

    def _create_op(self):
        c = self._config
        return dynamic_ops.create(
            self._handle, self._key_type, self._dimension,
            {k: c[k] for k in initializers.DEFAULT}, init_capacity=c["init_capacity"],
            max_capacity=c["max_capacity"], hbm_bytes=c["hbm_bytes"], eviction=c["eviction"],
            table_name=self._name)

    # ---------------------------------------------------------------- identity
    @property
    def handle(self):
        if serving_mode.active():
            # What TensorFlow's ops take a variable's handle for (the
            # placement of tf.nn.embedding_lookup's gather, colocate_with)
            # finds the serving table's rows: the table's own handle, taken
            # into a servable function, made its export fail as "untracked".
            return serving_mode.table_for(self).rows.handle
        return self._handle

    @property
    def name(self):
        return self._name

    @property
    def dtype(self):
        return self._dtype

    table_kind = DYNAMIC  # what sok_graph/tables/__init__.py asks

    @property
    def key_type(self):
        return self._key_type

    @property
    def dimension(self):
        return self._dimension

    @property
    def shape(self):
        """[None, dimension]: the number of rows is not fixed."""
        return tf.TensorShape([None, self._dimension])

    @property
    def trainable(self):
        return self._trainable

    @property
    def device(self):
        return self._handle.device

    @property
    def initializer(self):
        """The op that makes the table, or empties it (with its slot tables
        and filter counts) where it exists (graph mode)."""
        return self._initializer_op

    @property
    def is_sok_variable(self):
        return True

    @property
    def op(self):
        """The op of the table's handle (graph mode), as tf.Variable.op."""
        return self._handle.op

    def is_initialized(self, name=None):
        """A bool tensor: whether the table exists (tf.compat.v1's
        report_uninitialized_variables and MonitoredTrainingSession ask)."""
        return dynamic_ops.is_initialized(self._handle)

    @property
    def mode(self):
        return self._mode

    @property
    def placement(self):
        """(world_size, rank, fixed_owner): fixed_owner -1 means key k lives on
        worker k mod world_size; otherwise every key lives on that worker."""
        return self._placement

    @property
    def var_type(self):
        return self._var_type

    @property
    def backend_type(self):
        """SOK's name for var_type ("hbm" or "hybrid")."""
        return self._var_type

    @property
    def handle_dtype(self):
        """SOK's name for the rows' dtype."""
        return self._dtype

    @property
    def config_dict(self):
        """The table settings given as keyword arguments (SOK's name)."""
        return dict(self._table_config)

    @property
    def initializer_str(self):
        """The initializer as given (SOK's name; "" for the default)."""
        return "" if self._initializer_arg is None else self._initializer_arg

    @property
    def target_gpu(self):
        """The worker holding every key (mode="localized:<rank>"), else -1."""
        return self._placement[2]

    @property
    def num_gpus(self):
        """The number of workers the table is placed over (SOK's name)."""
        return self._placement[0]

    def key_map(self, indices):
        """Keys stay keys on their owner (SOK's name)."""
        return indices

    @property
    def _unique_id(self):
        return self._table_shared_name

    @property
    def _shared_name(self):
        """The table's name in its graph (unique there, with its name scope)
        or, made eagerly, a unique anonymous name; TF 1.x optimizers key
        their slots by it, as for a tf.Variable (whose version reads it off
        `name`)."""
        return self._table_shared_name

    @property
    def graph(self):
        return self._handle.graph

    def ref(self):
        """A hashable reference to this table, as tf.Variable.ref() gives;
        TensorFlow asks it of every GLOBAL_VARIABLES entry (tf.custom_gradient
        in graph mode does)."""
        return compat.reference(self)

    # TensorFlow 1.15's name for ref(), which its tf.custom_gradient asks for.
    experimental_ref = ref

    def __repr__(self):
        return (f"<sok.DynamicVariable '{self._name}' dimension={self._dimension} "
                f"key_type={self._key_type.name} var_type={self._var_type}>")

    # ------------------------------------------------------------- tf.Variable
    # What TensorFlow asks of every tf.Variable (the module docstring says
    # what holds of the table as one).
    @property
    def constraint(self):
        return None

    @property
    def synchronization(self):
        return tf.VariableSynchronization.AUTO

    @property
    def aggregation(self):
        return tf.VariableAggregation.NONE

    def _as_graph_element(self):
        """What a Session fetch of the table gives: its size [keys,
        dimension] (TF1-style graph mode; None for a table made eagerly, as
        for an eager tf.Variable)."""
        return self._graph_element

    def _ref(self):
        """The tensor that tf.compat.v1.train optimizers differentiate with
        respect to (a variable that is not a VarHandleOp's): the table's
        handle, whose gradient is IndexedSlices of keys."""
        return self._handle

    def to_proto(self, export_scope=None):
        """None: a table is not rebuilt from a VariableDef, so an exported
        meta graph's variable collections leave it out (and keep every other
        variable; a proto function that raised would drop the whole
        collection). Its initializer and Saver ops stay in the graph."""
        return None

    @staticmethod
    def from_proto(variable_def, import_scope=None):
        raise NotImplementedError("a DynamicVariable is not rebuilt from a VariableDef; build "
                                  "the model again and restore the table with a Saver")

    # Compared and hashed by identity, in every mode: tf.Variable's
    # element-wise == (TF 2.x eager) needs a dense value, and the optimizer,
    # Keras' weight lists and sets of variables need == and hash to work.
    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def __hash__(self):
        return id(self)

    value = _no_dense_value("value()")
    read_value = _no_dense_value("read_value()")
    numpy = _no_dense_value("numpy()")
    eval = _no_dense_value("eval()")  # noqa: A003 (tf.Variable's name)
    initialized_value = _no_dense_value("initialized_value()")
    assign = _no_dense_value("assign()")
    assign_add = _no_dense_value("assign_add()")
    assign_sub = _no_dense_value("assign_sub()")
    load = _no_dense_value("load()")
    gather_nd = _no_dense_value("gather_nd()")
    scatter_nd_update = _no_dense_value("scatter_nd_update()")
    scatter_nd_add = _no_dense_value("scatter_nd_add()")
    scatter_nd_sub = _no_dense_value("scatter_nd_sub()")
    scatter_max = _no_dense_value("scatter_max()")
    scatter_min = _no_dense_value("scatter_min()")
    scatter_mul = _no_dense_value("scatter_mul()")
    scatter_div = _no_dense_value("scatter_div()")
    batch_scatter_update = _no_dense_value("batch_scatter_update()")
    count_up_to = _no_dense_value("count_up_to()")
    set_shape = _no_dense_value("set_shape()")

    @property
    def initial_value(self):
        return _refuse_dense(self, "initial_value")

    # ---------------------------------------------------------------- table ops
    def _check_keys(self, keys, widen=False):
        keys = tf.convert_to_tensor(keys)
        if widen and keys.dtype == tf.int32 and self._key_type == tf.int64:
            keys = tf.cast(keys, tf.int64)  # SOK's sparse_read widens int32 keys too
        if keys.dtype != self._key_type:
            raise TypeError(f"keys for DynamicVariable '{self._name}' must be "
                            f"{self._key_type.name} (its key_type); got {keys.dtype.name}")
        return keys

    def sparse_read(self, keys, name=None, low_frequency_filter=False):
        """Rows keys.shape + [dimension] of keys (any shape), inserting
        missing ones (those the table's admission filter admits; the others
        read its default row); differentiable. int32 keys of an int64 table
        are widened (as SOK does). low_frequency_filter: apply filter_ratio
        too (SOK's use_low_frequency_filter). Sharded over workers: keys
        this worker owns only (sok.lookup_sparse reads any key)."""
        keys = self._owned(self._check_keys(keys, widen=True), "sparse_read", _READ_ADVICE)
        return self._read(keys, low_frequency_filter, evicted_rows=False)[0]

    def read_routed(self, keys, low_frequency_filter=False):
        """sparse_read of keys a sharded lookup sent to this worker, their
        owner (not checked again: the exchange routed them)."""
        return self._read(keys, low_frequency_filter, evicted_rows=False)[0]

    def read_evicting(self, keys, low_frequency_filter=False):
        """(rows, evicted_keys [m], evicted_rows [m, dimension]): sparse_read's
        rows, plus the entries the table evicted to make room for the new
        keys (none in serving mode, which inserts nothing)."""
        keys = self._owned(self._check_keys(keys, widen=True), "sok.sparse_read_and_evict",
                           _READ_ADVICE)
        return self._read(keys, low_frequency_filter, evicted_rows=True)

    def _owned(self, keys, what, advice):
        """`keys`, checked to be this worker's (placement.checked_owned)."""
        if not what.startswith("sok."):
            what = f"DynamicVariable.{what}"
        return placement.checked_owned(self, keys, what, advice)

    def _read(self, keys, low_frequency_filter, evicted_rows):
        """(rows, evicted_keys, evicted_rows or None): the rows of keys (any
        shape), with the rows the table evicted when asked for.

        Every read looks up a batch's distinct keys once, then gathers each
        key's row (util_ops.gather_by_position): a key's use count (what LFU
        eviction and the dump's frequencies keep) grows by one per read,
        however often the batch repeats it, as through lookup_sparse; and
        the gradient has one row per distinct key, its repeats summed, in
        eager and graph mode alike, so an optimizer runs no unique or sum of
        its own (a Zipf stream's hot key is hundreds of thousands of rows of
        a step). unique_find_or_insert does both in one op but returns no
        evicted rows; read_evicting takes a unique, then find-or-insert."""
        keys = self._check_keys(keys, widen=True)
        low_frequency_filter = admission.checked_flag(low_frequency_filter,
                                                      "low_frequency_filter")
        self._record_read()
        shaped = keys.shape.rank != 1
        if shaped:  # keys of any shape, as tf.nn.embedding_lookup passes them
            key_shape = tf.shape(keys)
            static_shape = keys.shape
            keys = tf.reshape(keys, [-1])
        evicted_rows_out = None
        if serving_mode.active():
            rows = serving_mode.table_for(self).lookup(keys)
            evicted_keys = tf.zeros([0], self._key_type)
            evicted_rows_out = tf.zeros([0, self._dimension], tf.float32)
        elif reading_for_inference():
            _, rows, positions = self._inference_read(keys)
            rows = util_ops.gather_by_position(rows, positions)
            evicted_keys = tf.zeros([0], self._key_type)
            evicted_rows_out = tf.zeros([0, self._dimension], tf.float32)
        else:
            if self._admission is not None:
                _, rows, positions, evicted_keys, evicted_rows_out = self._admitted_read(
                    keys, low_frequency_filter)
            elif evicted_rows:
                distinct, positions = util_ops.unique(keys, out_idx=tf.int64)
                rows, _, evicted_keys, evicted_rows_out = dynamic_ops.find_or_insert_evicting(
                    self._handle, distinct, self._dimension)
            else:
                _, positions, rows, _, evicted_keys = dynamic_ops.unique_find_or_insert(
                    self._handle, keys, self._dimension)
            rows = util_ops.gather_by_position(rows, positions)
        if shaped:
            rows = tf.reshape(rows, tf.concat([key_shape, [self._dimension]], 0))
            rows.set_shape(static_shape.concatenate([self._dimension]))
        return rows, evicted_keys, evicted_rows_out

    def unique_read(self, keys, name=None, low_frequency_filter=False):
        """(distinct keys [u] in order of first appearance, their rows [u,
        dimension], each key's position among them [n] int64) of 1-D keys,
        inserting missing ones, one use per distinct key; differentiable
        through the rows. One op (SokDynamicTableUniqueFindOrInsert): on a
        GPU a single wait for the device, where unique then sparse_read wait
        once each when the table is full."""
        keys = self._check_keys(keys, widen=True)
        low_frequency_filter = admission.checked_flag(low_frequency_filter,
                                                      "low_frequency_filter")
        if keys.shape.rank is not None and keys.shape.rank != 1:
            raise ValueError(f"keys for DynamicVariable.unique_read must be 1-D; got shape "
                             f"{keys.shape}")
        self._record_read()
        if serving_mode.active():
            # TensorFlow's unique: a servable model holds stock ops only
            # (util_ops.unique is sok's SokUnique, which failed the export).
            distinct, positions = tf.unique(keys, out_idx=tf.int64)
            return distinct, serving_mode.table_for(self).lookup(distinct), positions
        if reading_for_inference():
            return self._inference_read(keys)
        if self._admission is not None:
            distinct, rows, positions, _, _ = self._admitted_read(keys, low_frequency_filter)
            return distinct, rows, positions
        distinct, positions, rows, _, _ = dynamic_ops.unique_find_or_insert(
            self._handle, keys, self._dimension, name=name)
        return distinct, rows, positions

    def _inference_read(self, keys):
        """(distinct keys, their rows, each key's position among them) of
        1-D keys for inference (reading_for_inference): the rows the table
        holds, the default row for the others, nothing changed."""
        distinct, positions = util_ops.unique(keys, out_idx=tf.int64)
        default = 0.0 if self._admission is None else self._admission.default
        rows, _ = dynamic_ops.find(self._handle, distinct, self._dimension, default)
        return distinct, rows, positions

    def room_check(self, keys, low_frequency_filter=False):
        """An op that fails (InvalidArgumentError naming the table and its
        max_capacity) where a read of the 1-D `keys` would be refused for
        room, changing nothing; None for a table without a bound. The read
        refuses itself, but only after the reads before it in the same
        lookup_sparse call inserted (and their filters counted) their keys:
        lookup_sparse runs every table's check before any read. A call of no
        more keys than the bound fits whatever they are, and checks no more."""
        bound = self._config["max_capacity"]
        if not bound or serving_mode.active() or reading_for_inference():
            return None  # (an inference read inserts nothing)
        keys = self._check_keys(keys, widen=True)
        use_ratio = admission.checked_flag(low_frequency_filter, "low_frequency_filter")

        def exact():
            if self._admission is None:
                distinct = tf.size(util_ops.unique(keys, out_idx=tf.int64)[0], out_type=tf.int64)
                check = tf.debugging.assert_less_equal(
                    distinct, tf.constant(bound, tf.int64),
                    message=(f"dynamic table '{self._name}': the batch has more distinct keys "
                             f"than its max_capacity={bound} rows (keys used in this batch are "
                             f"never evicted); no table of the call changed. Distinct keys:"))
            else:
                distinct, _, occurrences = util_ops.unique_with_counts(keys, out_idx=tf.int64)
                _, found = dynamic_ops.find(self._handle, distinct, self._dimension)
                check = self._admission.room_check(distinct, occurrences, found, use_ratio,
                                                   bound, self._name)
            with tf.control_dependencies([check]):
                return tf.constant(True)

        fits = tf.size(keys, out_type=tf.int64) <= bound
        return tf.cond(fits, lambda: tf.constant(True), exact)

    def _admitted_read(self, keys, use_ratio):
        """(distinct keys [u], their rows [u, dimension], positions [n] int64,
        evicted keys, evicted rows) of 1-D keys through the admission filter:
        keys it admits (and keys the table holds) are found or inserted, the
        others read the filter's default row and get no gradient."""
        distinct, positions, occurrences = util_ops.unique_with_counts(keys, out_idx=tf.int64)
        rows, evicted_keys, evicted_rows = self._admitted_rows(distinct, occurrences, use_ratio)
        return distinct, rows, positions, evicted_keys, evicted_rows

    def read_counted(self, distinct, occurrences, low_frequency_filter=False):
        """Rows [u, dimension] of distinct keys [u] that a batch holds
        `occurrences` [u] int64 times each (what a counting admission filter
        counts): sparse_read of the batch, given already deduplicated, as a
        sharded lookup's owner receives it."""
        distinct = self._check_keys(distinct, widen=True)
        low_frequency_filter = admission.checked_flag(low_frequency_filter,
                                                      "low_frequency_filter")
        if self._admission is None or reading_for_inference() or serving_mode.active():
            # (a servable model reads the serving table, which holds no
            # filter: keys it lacks read its default row)
            return self.read_routed(distinct)
        self._record_read()
        return self._admitted_rows(distinct, occurrences, low_frequency_filter)[0]

    def _record_read(self):
        """Tells GradientTapes (and a tf.function being traced) that a
        trainable table was read. Not while a servable model is traced: it
        reads the serving table, and a table listed as read would be saved
        with the export."""
        if self._trainable and not serving_mode.active():
            compat.record_variable_access(self)
            if not tf.executing_eagerly():
                self._graphs_around_reading_loops.update(
                    compat.graphs_around_a_loop_body(tf.compat.v1.get_default_graph()))

    def refuse_a_gradient_lost_in_a_loop(self, partly=False):
        """Raises where this table's gradient is applied in a graph around a
        tf.while_loop (v2 control flow: a tf.function's `for` over a tensor,
        tf.map_fn, tf.scan) whose body reads the table: the loop's own
        gradient passes a variable's gradient only as a dense tensor of the
        variable's shape, so a GradientTape around the loop gives a dynamic
        table nothing from the loop's reads. With no other read the
        gradient is None, and an optimizer passed the table over: it never
        trained, without an error. partly: the gradient is not None (the
        table is read outside the loop too), so it holds the outside reads'
        part alone: the table trained on that part, without an error
        either. A tape inside the body, which Keras' steps_per_execution
        uses, gives the table its gradient there."""
        if tf.executing_eagerly() or \
                tf.compat.v1.get_default_graph() not in self._graphs_around_reading_loops:
            return
        lost = ("holds the reads outside the loop alone" if partly else "is None")
        raise NotImplementedError(
            f"DynamicVariable '{self._name}' is read inside a tf.while_loop (a `for` over a "
            f"tensor in a tf.function, tf.map_fn, tf.scan) and its gradient, taken around "
            f"the loop, {lost}: TensorFlow's loop passes a variable's gradient only as a "
            f"dense tensor of the variable's shape, which a dynamic table has not, so the "
            f"table would not train on the loop's reads. Take the gradient inside the loop "
            f"body (the GradientTape and the optimizer's step in it), or read the rows before "
            f"the loop (one lookup of all the keys, then tf.gather inside)")

    def _admitted_rows(self, distinct, occurrences, use_ratio):
        """(rows [u, dimension], evicted keys, evicted rows) of distinct keys
        seen occurrences times each, through the admission filter."""
        # After the previous read of this lookup_sparse call has inserted
        # its keys (admission.AdmissionFilter.previous_read says why).
        with tf.control_dependencies(self._admission.previous_read()):
            _, found = dynamic_ops.find(self._handle, distinct, self._dimension)
        admitted = self._admission.admitted(distinct, occurrences, found, use_ratio,
                                            bound=self._config["max_capacity"],
                                            table=self._name)
        index = tf.where(admitted)
        rows, _, evicted_keys, evicted_rows = dynamic_ops.find_or_insert_evicting(
            self._handle, tf.gather_nd(distinct, index), self._dimension)
        self._admission.read_built(rows)
        shape = tf.stack([tf.size(distinct, out_type=tf.int64),
                          tf.constant(self._dimension, tf.int64)])
        rows = tf.scatter_nd(index, rows, shape)
        if self._admission.default != 0.0:
            waiting = tf.cast(tf.logical_not(admitted), tf.float32)[:, None]
            rows = rows + waiting * self._admission.default
        return rows, evicted_keys, evicted_rows

    @property
    def admission(self):
        """The table's admission filter (sok_graph/tables/admission.py), or None."""
        return self._admission

    def slot_settings(self):
        """What an optimizer slot table of this table is made with besides its
        dimension and initializer: a hybrid table that keeps part of its rows
        in host memory gives its slots the same split and bound (slots as
        large as the table would not fit where the table does not)."""
        if self._var_type != "hybrid" or "max_hbm_for_vectors" not in self._table_config:
            return {}
        keys = ("init_capacity", "max_capacity", "max_hbm_for_vectors", "evict_strategy")
        return dict(var_type="hybrid",
                    **{k: self._table_config[k] for k in keys if k in self._table_config})

    def row_count(self):
        """The number of keys this table holds (an int64 scalar; the table
        protocol, sok_graph/tables/__init__.py)."""
        return dynamic_ops.stats(self._handle)[0]

    def export_chunk(self, offset, limit, updated_after=None):
        """(keys, rows, next_offset) of up to `limit` entries from position
        `offset` in the table's order, with updated_after (microseconds) only
        those written since (the table protocol)."""
        after = dynamic_ops.INT64_MIN if updated_after is None else updated_after
        keys, rows, _, _, next_offset = dynamic_ops.export(
            self._handle, self.key_type, self.dimension, offset, limit, updated_after=after)
        return keys, rows, next_offset

    # What dump, load and the Saver ask (sok_graph/tables/__init__.py).
    key_metadata = ("timestamps", "frequencies")  # last write (UTC microseconds), use count
    fixed_rows = None  # keys come and go
    replace_can_fail = True  # replace_rows builds a new table, which may not fit

    @property
    def key_dtype(self):
        """key_type: the dtype of the keys the table is addressed by."""
        return self._key_type

    def row_limit(self):
        """The most keys the table can hold, an int64 scalar: max_capacity of
        a "hybrid" table; for an "hbm" table the most its device's table
        holds (dynamic_ops.MAX_ROWS on the CPU, 2^29 on a GPU)."""
        return dynamic_ops.stats(self._handle)[1]

    def read_all(self):
        """(keys, rows, {"timestamps": ..., "frequencies": ...}) of every key,
        in one export, so that rows and metadata are of the same moment."""
        keys, rows, times, counts, _ = dynamic_ops.export(
            self._handle, self._key_type, self._dimension, offset=0, limit=(1 << 62))
        return keys, rows, {"timestamps": times, "frequencies": counts}

    def read_slot(self, slot, keys, initial_value):
        """The rows of optimizer slot `slot` (make_slot's) for `keys`;
        initial_value for keys the slot does not hold (no step has updated
        them yet)."""
        return slot.find(keys, default_value=initial_value)[0]

    def replace_slot(self, slot, keys, rows):
        """replace_rows for optimizer slot `slot` (make_slot's)."""
        return slot.replace_rows(keys, rows)

    def global_ids(self, ids):
        """Keys stay keys (key_map's inverse)."""
        return ids

    def make_slot(self, name, initial_value, start=None):
        """An optimizer slot of this table (sok_graph/tables/__init__.py): a dynamic
        table with the same keys whose new rows start at `initial_value`,
        with this table's memory split and bound, dropping every key this
        table evicts. `start` (a static table's native state) has no meaning
        here."""
        del start
        # On this table's device: a shadow lives where its table does.
        with tf.device(self._handle.device):
            slot = DynamicVariable(self._dimension, initializer=float(initial_value),
                                   key_type=self._key_type, trainable=False,
                                   name=f"{self._name}/{name}", **self.slot_settings())
        self.add_shadow(slot)
        return slot

    def add_shadow(self, table):
        """Makes `table` (a DynamicVariable with the same keys, on the same
        device, such as an optimizer slot) drop every key this table evicts
        or removes, in the op that evicts or removes it
        (SokDynamicTableAddShadow): whichever write made room, eagerly or in
        any graph, whenever it was built. In graph mode the link is made
        by `table`'s initializer, and by either table's restore (a Saver's
        restore runs no initializer)."""
        if table.key_type != self._key_type:
            raise TypeError("a shadow table must have the same key_type")
        if tf.executing_eagerly():
            dynamic_ops.add_shadow(self._handle, table.handle)
        else:
            table._initializer_op = tf.group(table._initializer_op, self._link_op(table))
        self._shadows.append(table)
        table._shadow_of.append(weakref.ref(self))

    def _link_op(self, shadow):
        """The op that links `shadow` to this table once both exist (their
        create ops make a table once, and only the tables: not the rest of
        an initializer, such as an admission filter's call count)."""
        with tf.control_dependencies([self._create_op(), shadow._create_op()]):
            return dynamic_ops.add_shadow(self._handle, shadow.handle)

    def _links(self):
        """Graph mode: the ops that make this table, its shadows and the
        tables it shadows, and link them."""
        shadowed = [t for t in (r() for r in self._shadow_of) if t is not None]
        return [self._link_op(s) for s in self._shadows] + [t._link_op(self) for t in shadowed]

    def find(self, keys, default_value=0.0):
        """(rows, found) for inference: missing keys get default_value, nothing is inserted."""
        keys = self._check_keys(keys)
        if serving_mode.active():
            # A servable model reads the serving table (the export failed
            # with TensorFlow's "untracked resource" for this table's handle).
            return serving_mode.table_for(self).find(keys, default_value)
        return dynamic_ops.find(self._handle, keys, self._dimension, default_value)

    def _scatter(self, method, keys, rows):
        """keys and rows of a scatter_* call: (keys, rows), or one
        tf.IndexedSlices of rows addressed by key as tf.Variable's scatter
        methods take (what tf.compat.v1.train.GradientDescentOptimizer
        passes to scatter_sub)."""
        if isinstance(keys, tf.IndexedSlices):
            if rows is not None and not isinstance(rows, bool):  # bool: tf's use_locking
                raise TypeError(f"DynamicVariable.{method} takes (keys, rows) or one "
                                f"tf.IndexedSlices; got an IndexedSlices and rows {rows!r}")
            keys, rows = keys.indices, keys.values
        elif rows is None:
            raise TypeError(f"DynamicVariable.{method} takes (keys, rows) or one "
                            f"tf.IndexedSlices; got keys {keys!r} and no rows")
        keys = self._owned(self._check_keys(keys), method, _WRITE_ADVICE)
        # A key new to a full table evicts another: its slots go with it.
        return dynamic_ops.scatter(self._handle, keys, rows, method[len("scatter_"):])

    def scatter_add(self, keys, rows=None, use_locking=False, name=None):
        return self._scatter("scatter_add", keys, rows)

    def scatter_sub(self, keys, rows=None, use_locking=False, name=None):
        return self._scatter("scatter_sub", keys, rows)

    def scatter_update(self, keys, rows=None, use_locking=False, name=None):
        return self._scatter("scatter_update", keys, rows)

    def remove(self, keys):
        """Removes `keys` (those present) and returns how many were removed
        (an int64 scalar). Its shadow tables (the optimizer's slots) drop
        them too, in the same op, as after an eviction: a key that comes
        back starts afresh in all of them, not with the removed key's slot
        state."""
        return dynamic_ops.remove(self._handle, self._check_keys(keys))

    @property
    def size(self):
        """[number of keys, dimension] as an int64 tensor, as SOK's
        ``v.size``: ``v.size[0]`` is the number of rows the table holds."""
        return self._size_tensor()

    def _size_tensor(self):
        count = dynamic_ops.stats(self._handle)[0]
        return tf.stack([tf.cast(count, tf.int64), tf.constant(self._dimension, tf.int64)])

    def _num_keys(self):
        return dynamic_ops.stats(self._handle)[0]

    def stats(self):
        """dict of size, row_limit, evicted_total, memory_bytes (tensors)."""
        return dict(zip(("size", "row_limit", "evicted_total", "memory_bytes"),
                        dynamic_ops.stats(self._handle)))

    def export(self, chunk_size=1 << 20, updated_after=None):
        """(keys, rows) of every row (or of rows updated after `updated_after`,
        UTC microseconds), read in chunks of chunk_size rows. Eager only."""
        keys, rows = [], []
        for k, r, _, _ in self.export_chunks(chunk_size, updated_after):
            keys.append(k)
            rows.append(r)
        if not keys:
            return (tf.zeros([0], self._key_type), tf.zeros([0, self._dimension]))
        return tf.concat(keys, 0), tf.concat(rows, 0)

    def export_chunks(self, chunk_size=1 << 20, updated_after=None):
        """Yields (keys, rows, timestamps, frequencies) chunks; memory stays
        bounded by chunk_size rows. Eager only."""
        if not tf.executing_eagerly():
            raise RuntimeError("DynamicVariable.export_chunks runs eagerly; in graph mode use "
                               "sok_graph.ops.dynamic.export with explicit offsets")
        # 1.5 was taken (and 0 refused as the op's "limit"): named here.
        if isinstance(chunk_size, (bool, np.bool_)) or not isinstance(
                chunk_size, (int, np.integer)) or chunk_size < 1:
            raise ValueError(f"DynamicVariable.export_chunks: chunk_size must be a positive "
                             f"integer (rows per chunk); got {chunk_size!r}")
        after = dynamic_ops.INT64_MIN if updated_after is None else dynamic_ops.utc_micros(
            updated_after, "updated_after")
        offset = 0
        while True:
            k, r, t, f, nxt = dynamic_ops.export(self._handle, self._key_type, self._dimension,
                                                 offset, chunk_size, after)
            if k.shape[0]:
                yield k, r, t, f
            offset = int(nxt)
            if offset >= int(self._num_keys()):
                return

    def import_rows(self, keys, rows, timestamps=None, frequencies=None):
        """Writes `rows` (and, where given, their write times and use counts)
        for `keys`, inserting those the table lacks; every other key stays.
        A key given twice holds its last row, as scatter_update's does."""
        keys, rows, timestamps, frequencies = self._checked_import(
            "import_rows", keys, rows, timestamps, frequencies, distinct=False)
        return dynamic_ops.import_rows(self._handle, keys, rows, timestamps, frequencies)

    def replace_rows(self, keys, rows, timestamps=None, frequencies=None):
        """The table holds exactly `keys` with `rows` afterwards: imported
        into a new table and swapped in, so a lookup running meanwhile sees
        the old rows or the new ones, never an empty table, and a failed
        import (on the CPU) leaves the table as it was."""
        keys, rows, timestamps, frequencies = self._checked_import(
            "replace_rows", keys, rows, timestamps, frequencies, distinct=True)
        return self._shadows_follow(dynamic_ops.import_rows(
            self._handle, keys, rows, timestamps, frequencies, replace=True))

    def _shadows_follow(self, restore):
        """`restore` (a replacing import's count of evicted rows), after
        which each shadow table (an optimizer's slot) drops the keys the
        table no longer holds, as remove() makes it: restoring a dump taken
        before a key existed left that key's slot rows (Adam's moments), so
        the key came back with them instead of afresh. Keys the table holds
        keep their slot rows, whether a load restores the slots before the
        table or after it. (Every other write's evictions reach the shadows
        in the op itself: add_shadow.)"""
        if not self._shadows:
            return restore
        if tf.executing_eagerly():
            for shadow in self._shadows:
                gone = [tf.boolean_mask(k, tf.logical_not(self._holds(k)))
                        for k, _, _, _ in shadow.export_chunks()]
                if gone:  # removed once read: a removal would move the chunks' offsets
                    dynamic_ops.remove(shadow.handle, tf.concat(gone, 0))
            return restore
        dropped = []
        with tf.control_dependencies([restore]):
            for shadow in self._shadows:
                count = dynamic_ops.stats(shadow.handle)[0]
                keys = dynamic_ops.export(shadow.handle, shadow.key_type, shadow.dimension, 0,
                                          tf.maximum(count, 1))[0]
                dropped.append(dynamic_ops.remove(
                    shadow.handle, tf.boolean_mask(keys, tf.logical_not(self._holds(keys)))))
        with tf.control_dependencies(dropped):
            return tf.identity(restore)

    def _holds(self, keys):
        """Whether the table holds each of `keys` (inserts nothing)."""
        return dynamic_ops.find(self._handle, keys, self._dimension)[1]

    def _checked_import(self, method, keys, rows, timestamps, frequencies, distinct):
        """(keys, rows, timestamps, frequencies) for an import, after checks
        that name the table, the argument and what it got: keys of the
        key_type; with distinct (replace_rows: the table holds exactly these
        keys afterwards), none twice: the import kept the last row of a
        repeated key without a word, so a dump holding a key twice loaded as
        one of its rows; rows [len(keys), dimension] of floats (integer rows
        were cast); timestamps and frequencies of integers (floats were
        truncated). Keys known only when the graph runs are checked for
        repeats by an assertion then."""
        keys = self._check_keys(keys)
        if keys.shape.rank is not None and keys.shape.rank != 1:
            raise ValueError(f"DynamicVariable '{self._name}': {method} takes keys as a "
                             f"vector; got keys of shape {keys.shape}")
        keys = self._owned(keys, method, _WRITE_ADVICE)
        rows = rows_of_dtype(rows, self._dtype, f"DynamicVariable '{self._name}'", method,
                             self._dtype.name)
        count = tf.compat.dimension_value(keys.shape[0])
        if rows.shape.rank is not None and (
                rows.shape.rank != 2 or
                tf.compat.dimension_value(rows.shape[1]) not in (None, self._dimension) or
                (count is not None and tf.compat.dimension_value(rows.shape[0]) not in
                 (None, count))):
            # "rows must be": the words of the op's own check.
            raise ValueError(f"DynamicVariable '{self._name}': {method}'s rows must be "
                             f"[{'len(keys)' if count is None else count}, {self._dimension}] "
                             f"(one row of the table's dimension per key); got rows of shape "
                             f"{rows.shape}")
        metadata = []
        for what, entries in (("timestamps", timestamps), ("frequencies", frequencies)):
            if entries is not None:
                dtype = entries.dtype if tf.is_tensor(entries) else np.asarray(entries).dtype
                if not tf.as_dtype(dtype).is_integer:
                    raise TypeError(f"DynamicVariable '{self._name}': {method} takes {what} of "
                                    f"integers; got {what} of dtype {tf.as_dtype(dtype).name}")
            metadata.append(entries)
        if distinct:
            keys = self._within_capacity(self._distinct_keys(keys, method), method)
        return (keys, rows) + tuple(metadata)

    def _within_capacity(self, keys, method):
        """Distinct keys that replace the table's, after a check that they fit
        its max_capacity: the op's own refusal ("the batch has 3 distinct
        keys but the table holds at most 2 rows") named neither the table
        nor max_capacity, through a Saver's or tf.train.Checkpoint's
        restore. A ValueError where the count is known, else an assertion
        when the graph runs."""
        bound = self._config["max_capacity"]
        if not bound:
            return keys
        message = (f"DynamicVariable '{self._name}': {method} of more keys than its "
                   f"max_capacity={bound} holds")
        count = tf.compat.dimension_value(keys.shape[0])
        if count is not None:
            if count > bound:
                raise ValueError(f"{message}: got {count} keys")
            return keys
        check = tf.debugging.assert_less_equal(
            tf.size(keys, out_type=tf.int64), tf.constant(bound, tf.int64),
            message=message + "; the number of keys is")
        with tf.control_dependencies([check]):
            return tf.identity(keys)

    def _distinct_keys(self, keys, method):
        """keys, after a check that none comes twice: a ValueError now where
        they are known, else an assertion when the graph runs."""
        checks = repeated_key_checks(keys, f"DynamicVariable '{self._name}'", method)
        if not checks:
            return keys
        with tf.control_dependencies(checks):
            return tf.identity(keys)

    def clear(self):
        """Empties the table, its shadow tables (the optimizer's slots) and
        its admission filter's counts: a key that comes back starts afresh
        in all of them (it came back with its old Adam moments). The op
        empties the shadows linked when it runs, also those an optimizer
        made after this op was built into a graph."""
        ops = [dynamic_ops.clear(self._handle)]
        if self._admission is not None:
            ops.append(self._admission.clear())
        return tf.group(ops)

    # ------------------------------------------------------- tf.train.Checkpoint
    # Saved as four tensors (keys, rows, last-use times, use counts), read
    # with one export; restoring replaces the table's contents.
    # A checkpoint of TF 1.15 or 2.6-2.10 restores under 2.11 on too.
    _LEGACY_SAVEABLE_NAME = compat.legacy_saveable_name_on_restore()

    def _gather_saveables_for_checkpoint(self):
        # tf.compat.v1.train.Saver's way in (TF 1.x's tf.train.Checkpoint's
        # too); TF 2.x's checkpoints use _serialize_to_tensors directly. The
        # plain names (no checkpoint_tag), as a static table's variable has
        # them here: a Saver's checkpoints are one per worker.
        if held_by(self, "_replica_holder"):
            return {}  # a replica's shard: its ReplicaShards saves the table
        return compat.tensors_saveable_factories(self, self._saveable_name,
                                                 tensors=self._table_tensors,
                                                 tensor_dtypes=self._checkpoint_dtypes)

    def _checkpoint_dtypes(self):
        """{name: dtype} of _serialize_to_tensors, without exporting."""
        tag = checkpoint_tag(self)
        return {tag + "-keys": self._key_type, tag + "-values": tf.float32,
                tag + "-timestamps": tf.int64, tag + "-frequencies": tf.int64}

    def _saveable_name(self):
        """The name a Saver saves the table under: in graph mode the
        table's graph name (unique, with its name scope, as a tf.Variable's
        op name), eagerly the name given (the graph name there is a unique
        anonymous one, which another process could not find)."""
        return self._table_shared_name if self._in_graph_mode else self._name

    @property
    def _distribute_strategy(self):
        """Asked of a variable by tf.distribute when an optimizer makes its
        slot variables (Keras 2's OptimizerV2, the legacy optimizers that
        sok.init selects, asks it first): a table has none, and the
        question came as "'DynamicVariable' object has no attribute
        '_distribute_strategy'". Inside sok.OptimizerScope no optimizer
        makes slots for a table."""
        _refuse_dense(self, "making an optimizer's slot variables for it "
                            "(apply_gradients outside sok.OptimizerScope)")

    @property
    def path(self):
        """Keras 3 variables have a path; a table has none. A Keras 3
        optimizer asks for it first when it makes a variable's slots
        (apply_gradients outside sok.OptimizerScope), and then failed with
        "Shapes used to initialize variables must be fully-defined"."""
        _refuse_dense(self, "making a Keras optimizer's slot variables for it "
                            "(apply_gradients outside sok.OptimizerScope, or optimizer.build "
                            "given it, as keras.models.load_model and BackupAndRestore do: "
                            "call those inside sok.OptimizerScope), or naming it by a Keras "
                            "path (a legacy .h5 file, Keras' warning of a missing gradient),")

    def _export_to_saved_model_graph(self, *args, **kwargs):
        # tf.saved_model.save (and Keras model.save to a SavedModel) asks
        # every object it saves for its copy in the export's graph; a table
        # has none, and the save failed later with TensorFlow's "Attempting
        # to capture an EagerTensor" or "untracked resource", naming no table.
        raise ValueError(
            f"DynamicVariable '{self._name}' cannot be saved in a SavedModel "
            f"(tf.saved_model.save, or a Keras model.save to a SavedModel): TensorFlow's "
            f"SavedModel holds no sok hash table. Save training state with "
            f"tf.train.Checkpoint or sok.dump, and export a model to serve with "
            f"sok.export_for_serving (docs/serving.md), which gives it tables of stock "
            f"TensorFlow ops")

    # Its name before TF 2.9 (asked the same way).
    _map_resources = _export_to_saved_model_graph

    def _serialize_to_tensors(self):
        if held_by(self, "_replica_holder"):
            return {}  # a replica's shard: its ReplicaShards saves the table
        # "-shard<r>of<w>-keys" for a worker process's shard (checkpoint_tag).
        tag = checkpoint_tag(self)
        return {tag + name: t for name, t in self._table_tensors().items()}

    def _table_tensors(self):
        """What a checkpoint holds of this table (its ReplicaShards gathers
        every shard's)."""
        keys, rows, times, counts, _ = dynamic_ops.export(
            self._handle, self._key_type, self._dimension, offset=0, limit=(1 << 62))
        return {"-keys": keys, "-values": rows, "-timestamps": times, "-frequencies": counts}

    def _restore_from_tensors(self, restored_tensors):
        # Also a replica's shard's, with its part of the whole table's
        # tensors (ReplicaShards._restore_from_tensors).
        restored_tensors = untagged(restored_tensors, self)
        with tf.name_scope(scope_name(f"{self._name}_restore")):
            # A Saver may restore before any initializer ran: the table, its
            # links to its shadows and its filter's state are made here too.
            created = self._create_op()
            deps = []
            if created is not None and not tf.executing_eagerly():
                deps = [created] + self._links()
                if self._admission is not None:
                    deps += self._admission.restore_ops()
            values = restored_tensors["-values"]
            if values.shape.rank == 2 and values.shape[1] is not None \
                    and values.shape[1] != self._dimension:
                raise ValueError(
                    f"checkpoint rows of DynamicVariable '{self._name}' have dimension "
                    f"{values.shape[1]}; the variable has {self._dimension}")
            keys = self._within_capacity(tf.cast(restored_tensors["-keys"], self._key_type),
                                         "a checkpoint's restore")
            with tf.control_dependencies(deps):
                return self._shadows_follow(dynamic_ops.import_rows(
                    self._handle, keys, values,
                    restored_tensors.get("-timestamps"), restored_tensors.get("-frequencies"),
                    replace=True))


def scope_name(name):
    """`name` as a name scope that graph mode takes: TensorFlow refuses a
    scope of other characters than letters, digits and "_.-/" (newer
    versions also take "\\" and ">"), or one starting with "_", "-" or "/"
    at the root, so a table named "表" or "a b", which works eagerly, failed
    in a Session's graph with "not a valid root scope name", naming no
    argument. Those characters become "_" here (the table keeps its name:
    its ops are only grouped under this scope), and a scope that would
    start with "_", "-" or "/" gets the prefix "t"."""
    scope = re.sub(r"[^A-Za-z0-9_./-]", "_", name)
    return scope if re.match(r"[A-Za-z0-9.]", scope) else "t" + scope


def _refuse_conversion(value, dtype=None, name=None, as_ref=False):
    # Registered so that tf.convert_to_tensor (and every op given the table
    # where it wants a tensor) names the table and what to use instead;
    # without it TensorFlow tries the table as a sequence of numbers.
    if as_ref:
        # What tf.compat.v1.train.Saver asks of a tf.Variable given in a
        # {name: variable} dict; given in a list, the table saves itself.
        raise NoDenseValueError(
            f"DynamicVariable '{value._name}' has no dense value to take a reference to; "
            f"tf.compat.v1.train.Saver saves it given in a var_list list (or with no "
            f"var_list), under its graph name, not in a {{name: variable}} dict")
    _refuse_dense(value, "conversion to a tensor")


tf.compat.v1.register_tensor_conversion_function(DynamicVariable, _refuse_conversion)
