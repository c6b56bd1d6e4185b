"""sok.export_for_serving: a SavedModel that stock TensorFlow serves.

One mechanism for both front ends. Serving mode (serving/mode.py) is
turned on and the model is built or traced: every sok lookup then reads a
serving table (serving/tables.py, plain variables) instead of the sok
table, through gather / segment ops. The serving tables are filled from the
sok tables in chunks (serving/sources.py: every worker's shard, gathered on
rank 0) and saved with the model.

TF2: `export_for_serving(model, export_dir, input_signature=[...])` traces
  model(*inputs) into a tf.function and saves a tf.Module holding it (as the
  "serving_default" signature when every input is a dense tensor, and as
  the attribute `serve`), the variables it reads and the serving tables
  (`sok_tables`, by table name, each with `lookup` and `apply_delta`).
TF1: `export_for_serving(build_fn, export_dir, session=sess)` calls
  build_fn() in a new graph, where sok.Variable holds the whole table and
  sok.DynamicVariable makes a serving table; build_fn returns (inputs,
  outputs), two dicts of tensors, or a {key: SignatureDef} map. Variable
  values come from `session` (matched by name; dynamic tables by their
  name); tf.compat.v1.saved_model.Builder writes the model.

`assets.extra/sok_serving.json` lists the serving tables and where their
variables are in the checkpoint (for sok.apply_serving_delta).
"""

import contextlib
import inspect
import json
import os
import shutil

import numpy as np
import tensorflow as tf

from sok_graph import communication, context, dump_load
from sok_graph.communication import agreement
from sok_graph.dump_load import (no_room_error, remove_dead_writers_tmp, staging_dir,
                                 swap_into_place, writers_take_turns)
from sok_graph.tables import admission, dimension_of, is_dynamic, replica_shards
from sok_graph.tables.static import is_sok_variable
from sok_graph.tables.dynamic import DynamicVariable
from sok_graph.serving import collective, mode, sources
from sok_graph.serving.tables import DynamicTable, StaticTable

MANIFEST = "sok_serving.json"
# In an export's assets.extra: the deltas apply_serving_delta applied to it
# (sok_graph/serving/delta.py).
APPLIED = "sok_deltas.json"
MANIFEST_FORMAT = 1


def table_name(table):
    """A sok table's name without the output suffix (":0")."""
    name = getattr(table, "name", None) or "table"
    return name[:-2] if name.endswith(":0") else name


# ------------------------------------------------------------ filling tables

def _fill_from(serving_table, source, source_runner, runner, chunk_rows, writer=True):
    """Copies sok table `source` (every worker's rows) into serving_table's
    variables, a chunk at a time: the rows are scattered into place as they
    come. A dynamic table is read twice: its keys first (sorted, they give
    every row its place: row 1 + i for the i-th key), then its rows, so the
    export does not depend on how the keys were spread over workers.
    writer: whether this worker fills the variables (rank 0); the others
    only take part in the gathers, which give them no rows."""
    dim = serving_table.dimension
    dtype = serving_table.dtype
    rows_var = serving_table.rows
    dynamic = isinstance(serving_table, DynamicTable)
    base = 1 if dynamic else 0

    def allocate(n):
        # Built in one graph, so the new buffer goes to the variable without
        # a copy (an eager tensor would be copied).
        head = tf.convert_to_tensor(rows_var)[:base]
        return _assigned(rows_var.assign(
            tf.concat([head, tf.zeros(tf.stack([n, dim]), dtype)], 0)))

    def scatter(positions, rows):
        return _assigned(rows_var.scatter_update(tf.IndexedSlices(rows, positions)))

    alloc = runner.make(allocate, [tf.TensorSpec([], tf.int64)])
    put = runner.make(scatter, [tf.TensorSpec([None], tf.int64),
                                tf.TensorSpec([None, dim], dtype)])
    sorted_keys = None
    if dynamic:
        count, chunks = sources.whole_table(source, source_runner, chunk_rows, keys_only=True)
        keys_all = np.empty([count], np.int64)
        filled = 0
        for keys, _ in chunks:
            if filled + len(keys) > count:
                raise RuntimeError(f"table {serving_table.table_name!r} changed while it was "
                                   "exported (more rows than counted)")
            keys_all[filled:filled + len(keys)] = keys
            filled += len(keys)
        keys_all = keys_all[:filled]
        keys_all.sort()
        sorted_keys = keys_all
    count, chunks = sources.whole_table(source, source_runner, chunk_rows)
    if not writer:
        for _ in chunks:
            pass
        return
    alloc(np.int64(count if sorted_keys is None else len(sorted_keys)))
    for keys, rows in chunks:
        if dynamic:
            at = np.searchsorted(sorted_keys, keys)
            if len(keys) and (at.max() >= len(sorted_keys)
                              or (sorted_keys[np.minimum(at, len(sorted_keys) - 1)]
                                  != keys).any()):
                raise RuntimeError(f"table {serving_table.table_name!r} changed while it was "
                                   "exported (a key appeared)")
            put(at.astype(np.int64) + base, rows)
        else:
            put(np.asarray(keys, np.int64), rows)
    if not dynamic:
        return
    key_spec = tf.TensorSpec([None], serving_table.key_dtype)
    set_keys = runner.make(lambda k: _assigned(serving_table.keys.assign(k)), [key_spec])
    set_index = runner.make(lambda i: _assigned(serving_table.index.assign(i)),
                            [tf.TensorSpec([None], tf.int64)])
    set_keys(sorted_keys.astype(serving_table.key_dtype.as_numpy_dtype))
    set_index(np.arange(1, len(sorted_keys) + 1, dtype=np.int64))


def _assigned(update):
    """A tensor that is ready once `update` (an assign's result) ran."""
    op = update.op if hasattr(update, "op") else update
    with tf.control_dependencies([op]):
        return tf.constant(0, tf.int64)


# ------------------------------------------------------------ resolvers

class _StandIns:
    """What both resolvers do when a sok.DynamicVariable is created while a
    servable model is built: a serving table stands for it."""

    def dynamic_stand_in(self, args, kwargs):
        """The serving table for sok.DynamicVariable(*args, **kwargs)."""
        bound = inspect.signature(DynamicVariable.__init__).bind(None, *args, **kwargs)
        a = dict(bound.arguments)
        settings = {k: v for k, v in a.get("table_config", {}).items() if k in admission.SETTINGS}
        filtered = admission.from_config(settings)
        return self.new_dynamic(a.get("name") or "DynamicVariable", a.get("key_type"),
                                int(a["dimension"]), a.get("dtype"),
                                None if filtered is None else filtered.default)


def _default_row_for(default_row, name, filter_default):
    """The row a dynamic serving table named `name` gives keys it does not
    hold: what default_row gives it, else the row its admission filter
    gives keys not admitted (filter_default: what training reads for them,
    and for keys never seen; served as zeros before), else zeros."""
    if isinstance(default_row, dict):
        return default_row[name] if name in default_row else filter_default
    return filter_default if default_row is None else default_row


class LiveResolver(_StandIns):
    """TF2: the serving table of a live sok table is made (and filled) the
    first time a lookup names it, outside the function being traced."""

    def __init__(self, default_row, chunk_rows):
        self.default_row = default_row
        self.chunk_rows = chunk_rows
        self.tables = {}
        self._by_id = {}
        self._runner = sources.Runner()
        # The graph of the export's own trace (set as it starts): lookups in
        # graphs of the model's own tf.functions below it are refused.
        self.trace_graph = None

    @tf.autograph.experimental.do_not_convert
    def table_for(self, param):
        if isinstance(param, (StaticTable, DynamicTable)):
            return param
        if not is_sok_variable(param):
            raise TypeError(f"serving mode: a lookup table must be a sok table; got "
                            f"{type(param).__name__}")
        key = id(param)
        if key in self._by_id:
            return self._by_id[key][1]
        name = base = table_name(param)
        k = 0
        while name in self.tables:
            k += 1
            name = f"{base}_{k}"
        if k:
            # A delta names tables by the names they were served under,
            # which a table no longer tells once another shares its name.
            tf.compat.v1.logging.warning(
                "export_for_serving: the model reads another table named %r before this one, "
                "which is served as %r (tables of one name are numbered in the order the "
                "model reads them): give export_serving_delta such tables as {serving name: "
                "table}, or name them apart", base, name)
        with tf.init_scope():
            first = replica_shards.shards_of(param)[0]
            if is_dynamic(first):
                filtered = first.admission
                serving_table = DynamicTable(
                    name, first.key_type, first.dimension, first.dtype,
                    _default_row_for(self.default_row, name,
                                     None if filtered is None else filtered.default))
            else:
                serving_table = StaticTable(name, shape=tf.TensorShape(
                    [None, int(first.shape[1])]), dtype=tf.as_dtype(first.dtype).base_dtype)
            _fill_from(serving_table, param, self._runner, self._runner, self.chunk_rows)
        self.tables[name] = serving_table
        self._by_id[key] = (param, serving_table)  # keeps param alive: ids stay unique
        return serving_table

    def new_dynamic(self, name, key_type, dimension, dtype, filter_default=None):
        raise RuntimeError("sok.DynamicVariable cannot be created while a model is traced "
                           "for serving; create it before sok.export_for_serving")


class GraphResolver(_StandIns):
    """TF1: the serving graph is built anew; sok.Variable (one process: the
    whole table) serves as it is, sok.DynamicVariable makes a serving table."""

    def __init__(self, default_row):
        self.default_row = default_row
        self.tables = {}
        self._by_id = {}
        # {name: the filter_default build_fn gave a dynamic table, or None}
        self.filter_defaults = {}

    def table_for(self, param):
        if isinstance(param, (StaticTable, DynamicTable)):
            return param
        if isinstance(param, replica_shards.ReplicaShards) or not is_sok_variable(param):
            raise TypeError(f"serving mode: a lookup table must be a sok table of the serving "
                            f"graph; got {param!r}")
        if id(param) in self._by_id:
            return self._by_id[id(param)]
        if is_dynamic(param):
            # One made in build_fn is a serving table already; this one is
            # the training graph's (it was taken for a static table's rows).
            raise TypeError(f"serving mode: sok.DynamicVariable {param.name!r} is not of the "
                            f"serving graph; create the dynamic tables inside build_fn (a "
                            f"serving table takes the trained table's rows by its name)")
        name = param.op.name
        if name in self.tables:
            raise ValueError(f"two serving tables named {name!r}")
        serving_table = StaticTable(name, variable=param)
        self.tables[name] = serving_table
        self._by_id[id(param)] = serving_table
        return serving_table

    def new_dynamic(self, name, key_type, dimension, dtype, filter_default=None):
        if name in self.tables:
            raise ValueError(f"two sok.DynamicVariable named {name!r} in the serving graph; "
                             "give each its own name= (tables are matched by name)")
        table = DynamicTable(name, key_type or tf.int64, dimension, dtype or tf.float32,
                             _default_row_for(self.default_row, name, filter_default))
        self.tables[name] = table
        self.filter_defaults[name] = filter_default
        return table


# ------------------------------------------------------------ checks

# A SavedModel's file: binary, or text where a TF1 export was asked for it
# (CollectiveStrategy.export_saved_model(as_text=True), as tf.estimator's).
SAVED_MODEL_FILES = ("saved_model.pb", "saved_model.pbtxt")


def saved_model_file(export_dir):
    """The path of export_dir's SavedModel file, or None where it has none."""
    for name in SAVED_MODEL_FILES:
        path = os.path.join(export_dir, name)
        if tf.io.gfile.exists(path):
            return path
    return None


def saved_op_types(export_dir):
    """Every op type of a SavedModel's graphs and function libraries."""
    from google.protobuf import text_format
    from tensorflow.core.protobuf import saved_model_pb2

    model = saved_model_pb2.SavedModel()
    path = saved_model_file(export_dir)
    if path is None:
        raise FileNotFoundError(f"{export_dir} holds no SavedModel (none of "
                                f"{', '.join(SAVED_MODEL_FILES)})")
    with tf.io.gfile.GFile(path, "rb") as f:
        data = f.read()
    if path.endswith(".pbtxt"):
        text_format.Merge(data.decode("utf-8"), model)
    else:
        model.ParseFromString(data)
    types = set()
    for meta in model.meta_graphs:
        types.update(node.op for node in meta.graph_def.node)
        for fn in meta.graph_def.library.function:
            types.update(node.op for node in fn.node_def)
    return types


def _check_stock(export_dir):
    sok_ops = sorted(t for t in saved_op_types(export_dir) if t.startswith("Sok"))
    if sok_ops:
        raise RuntimeError(
            f"the servable model at {export_dir} still holds sok_graph ops {sok_ops}: the "
            "model reads a sok table other than through sok.lookup_sparse / "
            "all2all_dense_embedding / DynamicVariable.sparse_read")


def _write_manifest(export_dir, tables, keys_of, created):
    """Writes sok_serving.json. created: when the export began to read the
    tables (UTC microseconds; the earliest of the workers' clocks, read
    before any table): apply_serving_delta refuses deltas exported before
    it, whose rows are older than the export's."""
    entries = []
    for name, t in tables.items():
        entries.append(dict(name=name, kind=t.kind, key_dtype=t.key_dtype.name,
                            dtype=t.dtype.name, dimension=t.dimension,
                            checkpoint_keys=keys_of(name, t)))
    extra = os.path.join(export_dir, "assets.extra")
    tf.io.gfile.makedirs(extra)
    with tf.io.gfile.GFile(os.path.join(extra, MANIFEST), "w") as f:
        f.write(json.dumps(dict(format=MANIFEST_FORMAT, created=created, tables=entries),
                           indent=1))


def _object_graph_keys(export_dir):
    """{path of child names from the root: checkpoint key} of the variables
    of a TF2 SavedModel."""
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    reader = tf.train.load_checkpoint(os.path.join(export_dir, "variables", "variables"))
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor("_CHECKPOINTABLE_OBJECT_GRAPH"))
    out, stack, seen = {}, [((), 0)], set()
    while stack:
        path, node_id = stack.pop()
        if node_id in seen:
            continue
        seen.add(node_id)
        node = graph.nodes[node_id]
        for attribute in node.attributes:
            if attribute.name == "VARIABLE_VALUE":
                out[path] = attribute.checkpoint_key
        for child in node.children:
            stack.append((path + (child.local_name,), child.node_id))
    return out


# ------------------------------------------------------------ arguments

# chunk_rows goes to the table reads as an int64.
_MAX_CHUNK_ROWS = (1 << 63) - 1


def checked_chunk_rows(chunk_rows, caller):
    """chunk_rows as an int: a positive integer (numpy's too) that an int64
    holds, else a ValueError naming it (0 or less failed inside a TensorFlow
    op, a float was taken, 2**63 and up failed with an OverflowError once
    the tables were being read)."""
    if not isinstance(chunk_rows, (int, np.integer)) or isinstance(chunk_rows, (bool, np.bool_)) \
            or chunk_rows < 1:
        raise ValueError(f"{caller}: chunk_rows must be a positive integer (the rows read at a "
                         f"time); got {chunk_rows!r}")
    if int(chunk_rows) > _MAX_CHUNK_ROWS:
        raise ValueError(f"{caller}: chunk_rows must be a positive integer an int64 holds (at "
                         f"most 2**63 - 1; the rows read at a time); got {chunk_rows!r}")
    return int(chunk_rows)


def checked_dir(path, what, caller, replaced=True, remote=False):
    """`path` as a str (bytes, os.PathLike and eager string tensors are
    paths; None, other types and "" errors naming `what`). replaced: the
    directory is written by renames, so the current directory is refused
    (the process was left in a deleted directory). A URL ("scheme://") is
    refused unless `remote` (an export, which writes other file systems in
    place); a file:// URL always is. Deltas and their application are
    written beside their place and renamed into it, which only a local
    directory does all or nothing: a URL was taken as a relative path
    ("gs://b/x" wrote ./gs:/b/x and was returned as if written), and an
    export to file:// skipped the checks and the swap a local path gets."""
    path = dump_load.checked_path(path, what)
    if "://" in path:
        if path.lower().startswith("file://"):
            raise ValueError(f"{caller}: {what}={path!r} is a file:// URL; give it as a local "
                             f"directory path ({path[len('file://'):]!r}), which is written "
                             f"beside and swapped in whole")
        if not remote:
            raise ValueError(f"{caller}: {what}={path!r} is a URL; {what} must be a local "
                             f"directory path (it is written beside its place and renamed "
                             f"into it, all or nothing, which only a local file system does): "
                             f"copy it to or from the remote file system yourself")
        return path
    if replaced and os.path.islink(path.rstrip("/") or path):
        # Written by renames, the link was moved aside (and kept) and a
        # directory put in its place; its target was left as it was.
        raise FileExistsError(
            f"{caller}: {what}={path!r} is a symbolic link (to "
            f"{os.path.realpath(path)!r}), which writing it would replace by a directory, "
            f"leaving the link's target as it was: give the target itself")
    if replaced and os.path.abspath(path) == os.path.abspath(os.getcwd()):
        raise ValueError(f"{caller}: {what}={path!r} is the current directory, which it would "
                         f"replace (the process would be left in a deleted directory): give a "
                         f"subdirectory")
    return path


def file_above(path):
    """The nearest existing entry at or above `path`'s parent where it is
    not a directory (a file where a parent directory must be), else None."""
    place = os.path.dirname(os.path.abspath(path))
    while not os.path.lexists(place) and os.path.dirname(place) != place:
        place = os.path.dirname(place)
    return None if os.path.isdir(place) else place


# ------------------------------------------------------------ TF2

class _ServingModule(tf.Module):
    pass


def _refusal(export_dir, tf1):
    """The FileExistsError rank 0 raises for export_dir, or None: a TF1
    export (as TensorFlow's SavedModel Builder) writes only into a new or
    empty directory; a TF2 one replaces only a previous export or an empty
    directory. Rank 0 checks before any table is read, and every worker
    raises with it (_agreed)."""
    if "://" in str(export_dir):
        return None
    above = file_above(export_dir)
    if above is not None:
        # It failed as the SavedModel was written, after the tables were
        # read and the model traced.
        return FileExistsError(f"cannot write export_dir={str(export_dir)!r}: a file stands "
                               f"where its parent directories must be ({above!r} is not a "
                               f"directory)")
    if tf1 and os.path.isdir(export_dir) and os.listdir(export_dir):
        return FileExistsError(f"export_dir={export_dir!r} exists and is not empty; a TF1 "
                               f"export (as TensorFlow's SavedModel Builder) writes only a "
                               f"new directory: choose another export_dir")
    final = os.path.abspath(os.fspath(export_dir))
    if os.path.lexists(final):
        is_dir = os.path.isdir(final) and not os.path.islink(final)
        if not is_dir or (os.listdir(final) and saved_model_file(final) is None):
            return FileExistsError(
                f"export_dir={str(export_dir)!r} holds something other than a SavedModel: an "
                f"export replaces only a previous export or an empty directory; choose "
                f"another export_dir or remove it")
        added = _not_of_an_export(final)
        if added:
            return FileExistsError(
                f"export_dir={str(export_dir)!r} holds a previous export and files no export "
                f"writes, {added}, which replacing it would delete (TF Serving's "
                f"assets.extra/tf_serving_warmup_requests is one); move them, or choose another "
                f"export_dir")
    return None


# What an export (TensorFlow's SavedModel and sok's files) writes at its top
# level and in assets.extra; anything else in a previous export was added.
_EXPORT_ENTRIES = set(SAVED_MODEL_FILES) | {"variables", "assets", "fingerprint.pb",
                                            "assets.extra"}
_EXPORT_EXTRAS = {MANIFEST, APPLIED}


def _not_of_an_export(export_dir):
    """The entries of a previous export that no export writes, sorted
    (paths relative to export_dir)."""
    added = [name for name in os.listdir(export_dir) if name not in _EXPORT_ENTRIES]
    extra = os.path.join(export_dir, "assets.extra")
    if os.path.isdir(extra):
        added += [os.path.join("assets.extra", name) for name in os.listdir(extra)
                  if name not in _EXPORT_EXTRAS]
    return sorted(added)


def _agreed(comm, eager, failed, reading=None, what="export_for_serving"):
    """Every worker at the same point: rank 0's error (`failed`, None on the
    others and where none) raised on every worker, rank 0 its own, the
    others one of its class naming rank 0 (they returned None while rank 0
    had refused export_dir or failed to write). Returns the earliest of the
    workers' clock `reading`s, where given."""
    created, failures = agreement.agree(comm, eager, reading=reading, error=failed)
    agreement.raise_shared(comm, failed, failures, what, collective.SHARED_FAILURES)
    return created


@contextlib.contextmanager
def _staged(export_dir):
    """A directory beside export_dir to write the export into, put in
    export_dir's place only once it is whole and checked: an export that
    fails or is refused (sok ops left in it) leaves what export_dir held.
    It replaces only a previous export (a directory with a SavedModel file) or
    an empty directory; anything else there is the user's, and stays.
    Paths of other file systems (gs://...) are written in place. The swap
    takes the lock apply_serving_delta holds from reading an export to
    swapping its update in: an export swapped in meanwhile was replaced by
    the older export plus the delta, and deleted."""
    if "://" in str(export_dir):
        yield str(export_dir)
        return
    refused = _refusal(export_dir, tf1=False)
    if refused is not None:
        raise refused
    final = os.path.abspath(os.fspath(export_dir))
    # Staging directories of exports killed mid-write (their process is
    # gone) were left beside the export for good, a model's size each.
    remove_dead_writers_tmp(final)
    tmp = staging_dir(final)
    try:
        yield tmp
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = no_room_error(e, final, "the serving export")
        if full is not None:
            raise full from e
        raise
    try:
        with writers_take_turns(os.path.dirname(final)):
            swap_into_place(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already once swapped in
        raise


def _traceable(model):
    """What the export traces for `model`: a tf.function's Python function
    (a model given as one, or a tf.Module whose __call__ is one: the usual
    way to a SavedModel). Traced through the tf.function, the serving trace
    stayed in its cache, keyed by the inputs alone: the training calls after
    the export read the served tables' snapshot, and a training trace made
    before it was taken for the serving one."""
    for candidate in (model, getattr(model, "__call__", None)):
        python_function = getattr(candidate, "python_function", None)
        if callable(python_function):
            return python_function
    return model


def _export_v2(model, export_dir, input_signature, default_row, chunk_rows):
    if input_signature is None:
        raise ValueError("export_for_serving(model, export_dir, input_signature=[...]): the "
                         "input signature (a list of tf.TensorSpec / RaggedTensorSpec / "
                         "SparseTensorSpec, or of dicts of them) is needed to trace the model")
    comm = context.active()
    rank = 0 if comm is None or comm.in_process else comm.rank
    # Before any table is read: the earliest of every worker's clock
    # (serving/collective.py), so a delta since it misses no key a worker
    # whose clock is behind rank 0's updates after the export; and rank 0's
    # refusal of export_dir, raised on every worker.
    created = _agreed(comm, True, _refusal(export_dir, tf1=False) if rank == 0 else None,
                      reading=collective.now_micros())
    resolver = LiveResolver(default_row, chunk_rows)

    traced = _traceable(model)

    def serve(*inputs):
        # The graph every sok lookup of the model must be traced into (see
        # mode.table_for): one in a tf.function of the model's own would be
        # kept in that function's cache.
        resolver.trace_graph = tf.compat.v1.get_default_graph()
        return traced(*inputs)

    failed = None
    with mode.serving(resolver):
        function = tf.function(serve, input_signature=list(input_signature))
        concrete = function.get_concrete_function()
        _refuse_default_rows_of_no_table(default_row, resolver.tables)
        if rank == 0:
            try:
                _write_v2(export_dir, resolver, function, concrete, input_signature, created)
            except Exception as e:  # told to every worker, then raised
                failed = e
    _agreed(comm, True, failed)
    return export_dir if rank == 0 else None


def _write_v2(export_dir, resolver, function, concrete, input_signature, created):
    """Rank 0's part of a TF2 export: the SavedModel, written whole."""
    root = _ServingModule()
    table_vars = {id(v) for t in resolver.tables.values()
                  for v in t.variables_by_role().values()}
    root.model_variables = [v for v in concrete.graph.variables
                            if id(v) not in table_vars]
    root.sok_tables = dict(resolver.tables)
    for t in resolver.tables.values():
        # apply_delta_fn applies a delta to the loaded model in memory; it
        # keeps no record of the deltas applied (serving/tables.py,
        # _NO_RECORD).
        t.lookup_fn, t.apply_delta_fn = t.serving_functions()
    root.serve = function
    flat = tf.nest.flatten(list(input_signature), expand_composites=False)
    signatures = None
    if all(isinstance(s, tf.TensorSpec) for s in flat):
        signatures = {tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY: concrete}
    with _staged(export_dir) as out:
        tf.saved_model.save(root, out, signatures=signatures)
        paths = _object_graph_keys(out)

        def keys_of(name, t):
            return {role: paths[("sok_tables", name, role)] for role in t.variables_by_role()}
        _write_manifest(out, resolver.tables, keys_of, created)
        _check_stock(out)


# ------------------------------------------------------------ TF1

def _is_signature_map(result):
    return isinstance(result, dict) and bool(result) and all(
        hasattr(v, "inputs") and hasattr(v, "method_name") for v in result.values())


def _signature_map(result):
    if _is_signature_map(result):
        return result
    if isinstance(result, (tuple, list)) and len(result) == 2 and all(
            isinstance(x, dict) for x in result):
        inputs, outputs = result
        return {tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY:
                tf.compat.v1.saved_model.predict_signature_def(inputs, outputs)}
    raise TypeError("the serving graph's build function must return (inputs, outputs), two "
                    "dicts of tensors, or a {key: SignatureDef} map")


def _session_values(session):
    """(values of the training graph's plain variables by name, its sok
    tables by name); sok tables are read later, in chunks."""
    raw = session._tf_sess() if hasattr(session, "_tf_sess") else session
    graph = raw.graph
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    plain = [v for v in variables if not is_sok_variable(v)]
    got = raw.run(plain) if plain else []
    values = {v.op.name: x for v, x in zip(plain, got)}
    tables = {}
    for v in variables:
        if not is_sok_variable(v):
            continue
        name = v.name if is_dynamic(v) else v.op.name
        if name in tables and not _shards_of_one_table(tables[name], v):
            # A serving table is filled from the trained table of its name:
            # one of the two was served in place of the other, without a word.
            raise ValueError(
                f"export_for_serving: the trained graph holds two sok tables named "
                f"'{name}', which the serving graph's tables cannot tell apart: give them "
                f"distinct names (name=...)")
        tables[name] = v
    return raw, values, tables


def _shards_of_one_table(a, b):
    """Whether `a` and `b` are shards of one table (its replicas' shards
    share its name), held by the same ReplicaShards."""
    holder_a, holder_b = (getattr(t, "_replica_holder", None) for t in (a, b))
    return holder_a is not None and holder_b is not None and \
        holder_a() is not None and holder_a() is holder_b()


def _refuse_tables_unlike_the_trained(tables, table_sources, default_row=None,
                                      filter_defaults=None):
    """A serving graph's table takes the trained table's rows whole, so it
    must be made like it. A static table must have its shape: the copy
    gives a resource variable the rows whatever its declared shape, and an
    export of a table built with other rows declared that shape while
    holding the trained rows (serving failed past them, or served rows past
    the declared ones); another dimension failed in a feed naming neither.
    A dynamic table must have its dimension (a feed's error naming neither,
    before) and its key type: int64 keys cast to a serving table's int32
    wrapped onto other keys and unsorted its key list, so keys were served
    other keys' rows, or zeros, without an error. Every worker sees the
    same tables."""
    for name, t in tables.items():
        source = table_sources.get(name)
        if source is None:
            continue
        if isinstance(t, StaticTable):
            trained = tf.TensorShape(getattr(source, "global_shape", None) or source.shape)
            if not t.rows.shape.is_compatible_with(trained):
                raise ValueError(
                    f"the serving graph's static table '{name}' has shape {t.rows.shape}; the "
                    f"trained table has {trained}: build_fn must make it with the trained "
                    f"table's rows and dimension")
            continue
        if not isinstance(t, DynamicTable):
            continue
        trained_dim = dimension_of(source)
        trained_keys = tf.as_dtype(getattr(source, "key_type", tf.int64))
        if t.dimension != trained_dim or t.key_dtype != trained_keys:
            raise ValueError(
                f"the serving graph's dynamic table '{name}' has dimension {t.dimension} and "
                f"{t.key_dtype.name} keys; the trained table has dimension {trained_dim} and "
                f"{trained_keys.name} keys: build_fn must make it with the trained table's "
                f"dimension and key_type")
        _refuse_a_filter_default_unlike_the_trained(name, source, default_row,
                                                    (filter_defaults or {}).get(name))


def _refuse_default_rows_of_no_table(default_row, tables):
    """default_row as {table name: row} must name dynamic tables the model
    serves: a name of no such table (a typo, "user" for a table served as
    "user_1") was passed over, and the table it meant served zeros. Every
    worker sees the same tables."""
    if not isinstance(default_row, dict):
        return
    served = sorted(name for name, t in tables.items() if isinstance(t, DynamicTable))
    unknown = sorted(str(name) for name in default_row if name not in served)
    if unknown:
        raise ValueError(f"default_row names {unknown}, which the model serves no dynamic "
                         f"table as; its dynamic tables are served as {served}")


def _refuse_a_filter_default_unlike_the_trained(name, source, default_row, built):
    """A dynamic table of build_fn's graph serves keys it lacks the default
    row of the admission filter build_fn gave it (`built`: its
    filter_default, None without a filter); training read the trained
    table's filter_default for keys not admitted and never seen. A build_fn
    that left the filter settings out (they look like training's alone)
    served zeros for those keys, without an error. Where default_row names
    the row, that row is served, as asked."""
    if default_row is not None and (not isinstance(default_row, dict) or name in default_row):
        return
    trained_filter = getattr(replica_shards.shards_of(source)[0], "admission", None)
    trained = 0.0 if trained_filter is None else float(trained_filter.default)
    given = 0.0 if built is None else float(built)
    if given != trained:
        raise ValueError(
            f"the serving graph's dynamic table '{name}' has filter_default {given!r}; the "
            f"trained table reads {trained!r} for keys it has not admitted: build_fn must make "
            f"it with the trained table's admission settings (filter_default=...), or give "
            f"export_for_serving the row to serve as default_row")


def write_graph_saved_model(export_dir, build_fn, values, table_sources, source_runner,
                            default_row=None, chunk_rows=1 << 20, assets_extra=None,
                            as_text=False, clear_devices=True, strip_default_attrs=True,
                            rank=0, what="export_for_serving"):
    """The TF1 writer (also CollectiveStrategy.export_saved_model's): builds
    the serving graph with build_fn in serving mode, loads `values` ({variable
    name: array}) and fills the serving tables from `table_sources` ({name:
    sok table of the training graph}, read through source_runner), then rank 0
    writes the SavedModel. Every worker calls it (tables are gathered).
    A variable or table of the serving graph that has no trained value is
    a ValueError on every worker, before any table is read: it was a
    warning, and the export served its initial value (Keras 3 numbers a
    layer's default name across graphs, so a serving graph that build_fn
    makes again names its tables anew, and served untrained tables). what:
    the caller's name, in the error the other workers raise where rank 0
    failed."""
    # Before any table is read, through the job's communicator (swapped
    # out below while the serving graph is built): the earliest of every
    # worker's clock (serving/collective.py), and rank 0's refusal of
    # export_dir, raised on every worker.
    comm, eager = context.active(), tf.executing_eagerly()
    created = _agreed(comm, eager, _refusal(export_dir, tf1=True) if rank == 0 else None,
                      reading=collective.now_micros(), what=what)
    saved_comm = context._communicator
    resolver = GraphResolver(default_row)
    context._communicator = communication.SingleProcess()
    try:
        with tf.Graph().as_default() as graph, mode.serving(resolver):
            result = build_fn()
            main_op = None
            if isinstance(result, (tuple, list)) and result and _is_signature_map(result[0]):
                result, main_op = result[0], (result[1] if len(result) > 1 else None)
            signature_map = _signature_map(result)
            # A sok.Variable that build_fn reads with stock ops
            # (tf.nn.embedding_lookup) instead of a sok lookup is a table
            # all the same: it kept its initial rows in the export.
            for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
                if is_sok_variable(v) and not is_dynamic(v) and v.op.name in table_sources:
                    resolver.table_for(v)
        table_vars = {id(v) for t in resolver.tables.values()
                      for v in t.variables_by_role().values()}
    finally:
        context._communicator = saved_comm
    _refuse_default_rows_of_no_table(default_row, resolver.tables)
    variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    with tf.compat.v1.Session(graph=graph) as sess:
        with graph.as_default():
            sess.run(tf.compat.v1.global_variables_initializer())
        missing = [v.op.name for v in variables
                   if v.op.name not in values and id(v) not in table_vars]
        missing += [name for name in resolver.tables
                    if table_sources.get(name) is None and name not in values]
        if missing:
            # Every worker sees the same names: all refuse, none waits in a gather.
            raise ValueError(
                f"the serving graph has variables the training left no value for: "
                f"{sorted(missing)[:10]}{'...' if len(missing) > 10 else ''}; they would be "
                f"exported with their initial values. The serving graph must use the "
                f"training graph's variable and table names (name Keras layers and sok "
                f"tables: Keras 3 numbers default layer names across graphs)")
        for v in variables:
            if v.op.name in values:
                v.load(values[v.op.name], sess)
        _refuse_tables_unlike_the_trained(resolver.tables, table_sources, default_row,
                                          resolver.filter_defaults)
        target = sources.Runner(sess)
        for name, t in resolver.tables.items():
            source = table_sources.get(name)
            if source is None:
                continue
            if isinstance(t, StaticTable) and name in values:
                continue
            _fill_from(t, source, source_runner, target, chunk_rows, writer=rank == 0)
        failed = None
        if rank == 0:
            try:
                _write_v1(export_dir, graph, sess, signature_map, main_op, assets_extra, as_text,
                          clear_devices, strip_default_attrs, resolver, created)
            except Exception as e:  # told to every worker, then raised
                failed = e
    _agreed(comm, eager, failed, what=what)
    return export_dir if rank == 0 else None


def _write_v1(export_dir, graph, sess, signature_map, main_op, assets_extra, as_text,
              clear_devices, strip_default_attrs, resolver, created):
    """Rank 0's part of a TF1 export: the SavedModel of the serving graph
    (its variables and tables filled in `sess`), written whole."""
    refused = _refusal(export_dir, tf1=True)  # as TensorFlow's Builder: never over an export
    if refused is not None:
        raise refused
    with _staged(export_dir) as out:
        with graph.as_default():
            builder = tf.compat.v1.saved_model.Builder(out)
            builder.add_meta_graph_and_variables(
                sess, [tf.saved_model.SERVING], signature_def_map=signature_map,
                assets_collection=graph.get_collection(
                    tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
                main_op=main_op, strip_default_attrs=strip_default_attrs,
                clear_devices=clear_devices)
            builder.save(as_text=as_text)
        if assets_extra:
            extra = os.path.join(out, "assets.extra")
            for dst, src in assets_extra.items():
                target_path = os.path.join(extra, dst)
                tf.io.gfile.makedirs(os.path.dirname(target_path))
                tf.io.gfile.copy(src, target_path, overwrite=True)

        def keys_of(name, t):
            return {role: v.op.name for role, v in t.variables_by_role().items()}
        _write_manifest(out, resolver.tables, keys_of, created)
        _check_stock(out)


def _export_v1(build_fn, export_dir, session, default_row, chunk_rows):
    raw, values, tables = _session_values(session)
    comm = context.active()
    rank = 0 if comm is None or comm.in_process else comm.rank
    return write_graph_saved_model(export_dir, build_fn, values, tables, sources.Runner(raw),
                                   default_row=default_row, chunk_rows=chunk_rows, rank=rank)


def export_for_serving(model, export_dir, input_signature=None, session=None,
                       default_row=None, chunk_rows=1 << 20):
    """Writes a SavedModel of `model` that stock TensorFlow (and TF Serving)
    loads: no sok_graph op, every sok table whole (gathered from all
    workers; every worker calls this, rank 0 writes). Returns export_dir on
    rank 0, None on the others. The export's `created` (sok_serving.json)
    is the earliest of the workers' clocks, each read before any table is:
    a delta with since=created misses no key updated after the export,
    whatever the offsets between the workers' clocks.

    model:           TF2: a Keras model, tf.Module or callable whose call uses sok
                     lookups; TF1 (with session): a function building the
                     serving graph, returning (inputs, outputs) dicts of
                     tensors or a {key: SignatureDef} map
    export_dir:      where the SavedModel goes
    input_signature: TF2: the list of specs the model is called with
    session:         TF1: the Session (or MonitoredSession) of the trained graph
    default_row:     the row of keys a dynamic table does not hold: None
                     (zeros), a number, a [dim] vector, or {table name: either}
    chunk_rows:      rows read at a time while tables are copied
    """
    export_dir = checked_dir(export_dir, "export_dir", "export_for_serving", remote=True)
    chunk_rows = checked_chunk_rows(chunk_rows, "export_for_serving")
    if session is not None:
        if not callable(model):
            raise TypeError("with session=, model must be a function building the serving "
                            "graph")
        return _export_v1(model, export_dir, session, default_row, chunk_rows)
    if not tf.executing_eagerly():
        raise RuntimeError("export_for_serving in graph mode needs session=<the trained "
                           "graph's Session> and a function building the serving graph")
    return _export_v2(model, export_dir, input_signature, default_row, chunk_rows)
