"""The CollectiveStrategy class: engine, rank and world size, the two scopes,
estimator() and export_saved_model() (the tables' shards gathered whole).
"""

import contextlib
import inspect
import os
import tempfile

import tensorflow as tf

from sok_graph import compat, context, placement
from sok_graph.dump_load import checked_path, var_name
from sok_graph.tables.static import is_sok_variable
from sok_graph.tables import is_dynamic
from sok_graph.serving import sources

from .data_parallel import BroadcastHook, _model_parallel_variables, _scope_patches, _worker_dir
from .engine import _engine_from_env, _start_horovod
from .export import _write_saved_model
from .lookups import _lookup_patches
from .model_parallel import _embedding_patches
from .patching import _PATCHES, _originals


def _checked_export_args(savedmodel_dir, session, assets_extra, flags):
    """export_saved_model's arguments, checked before anything is read or
    written: savedmodel_dir as a str (bytes made a directory named "b'..."
    in the current directory before failing with "can't concat str to
    bytes"; None failed in os.stat), a session that is one (a str failed
    with "'str' object has no attribute 'graph'"), the flags bools (as_text
    "no" wrote text), assets_extra a {relative name: existing file} map
    whose names stay inside the export's assets.extra."""
    savedmodel_dir = checked_path(savedmodel_dir, "savedmodel_dir")
    if session is not None and not (hasattr(session, "run") and (
            hasattr(session, "graph") or hasattr(session, "_tf_sess"))):
        raise TypeError(f"session must be a tf.compat.v1.Session or MonitoredSession of the "
                        f"training graph; got {type(session).__name__} {session!r}")
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be True or False; got {value!r}")
    if assets_extra is None:
        return savedmodel_dir, None
    if not isinstance(assets_extra, dict):
        raise TypeError(f"assets_extra must be a dict {{name in assets.extra: source file}}; "
                        f"got {type(assets_extra).__name__}")
    for dst, src in assets_extra.items():
        parts = str(dst).replace("\\", "/").split("/")
        if not isinstance(dst, str) or not dst or os.path.isabs(dst) or ".." in parts:
            raise ValueError(f"assets_extra: {dst!r} must be a relative file name inside the "
                             f"export's assets.extra (no '..', not absolute)")
        if not isinstance(src, (str, os.PathLike)) or not tf.io.gfile.exists(os.fspath(src)):
            raise ValueError(f"assets_extra[{dst!r}]: the source file {src!r} does not exist")
    return savedmodel_dir, assets_extra


class _CallableInt(int):
    """An int that also answers a call with itself: DeepRec's examples use
    both `strategy.world_size()` and `strategy.world_size` (handed straight to
    tf.fixed_size_partitioner)."""

    def __call__(self):
        return int(self)


class CollectiveStrategy:
    """DeepRec's synchronous-training interface on sok_graph (see the docstring
    of sok_graph.collective_strategy)."""

    def __init__(self):
        self._engine = _engine_from_env()
        _originals()  # TensorFlow's functions, before any scope patches them
        if self._engine == "none":
            self._comm = context.init(comm_tool="none")
        else:
            self._comm = _start_horovod()

    @property
    def engine(self):
        return self._engine

    @property
    def communicator(self):
        return self._comm

    @property
    def world_size(self):
        """Number of workers: `strategy.world_size()` or `strategy.world_size`."""
        return _CallableInt(self._comm.world_size)

    @property
    def rank(self):
        """This worker's rank: `strategy.rank()` or `strategy.rank`."""
        return _CallableInt(self._comm.rank)

    def _make_current(self):
        # sok variables and lookups use the process-wide communicator; make it
        # this strategy's again if something re-initialized sok_graph since.
        if context._communicator is not self._comm:
            context._communicator = self._comm

    @contextlib.contextmanager
    def scope(self, *args, **kwargs):
        """Data-parallel scope (see sok_graph.collective_strategy). Arguments are
        accepted for DeepRec compatibility and ignored."""
        del args, kwargs
        self._make_current()
        _PATCHES.enter("scope", _scope_patches())
        _PATCHES.enter("lookup", _lookup_patches())
        try:
            yield self
        finally:
            _PATCHES.exit("lookup")
            _PATCHES.exit("scope")

    @contextlib.contextmanager
    def embedding_scope(self, **kwargs):
        """Model-parallel scope: partitioned get_variable -> one sharded
        sok.Variable (see sok_graph.collective_strategy)."""
        del kwargs
        self._make_current()
        _PATCHES.enter("embedding", _embedding_patches())
        _PATCHES.enter("lookup", _lookup_patches())
        try:
            yield self
        finally:
            _PATCHES.exit("lookup")
            _PATCHES.exit("embedding")

    # ---------------------------------------------------------- estimator
    def estimator(self, model_fn, model_dir=None, config=None, params=None,
                  warm_start_from=None):
        """A tf.estimator.Estimator training `model_fn` under this strategy.

        model_fn runs inside scope(); its training hooks get the broadcast of
        dense variables. The launcher's TF_CONFIG (workers only, which
        RunConfig rejects) is hidden while the RunConfig is built: each worker
        is a local estimator and Horovod does the communication. Rank 0 uses
        `model_dir`; rank r > 0 uses <model_dir>/worker<r> (its checkpoints hold
        its shard of the sok tables) and writes no summaries.

        The estimator's own export_saved_model serves one process's tables:
        with several workers use strategy.export_saved_model (every worker
        calls it), which gathers the tables whole.
        """
        estimator_lib = compat.estimator_module()
        if estimator_lib is None or not hasattr(estimator_lib, "Estimator"):
            raise NotImplementedError(
                f"CollectiveStrategy.estimator needs tf.estimator, which TensorFlow "
                f"{tf.__version__} does not have (it was removed in 2.16); use "
                "MonitoredTrainingSession under strategy.scope() instead")
        rank = self._comm.rank
        saved = os.environ.pop("TF_CONFIG", None)
        try:
            if config is None:
                config = estimator_lib.RunConfig()
            if model_dir is not None and config.model_dir is not None and \
                    os.fspath(model_dir) != os.fspath(config.model_dir):
                # As tf.estimator.Estimator: model_dir silently won over the
                # RunConfig's, and checkpoints went where the config did not say.
                raise ValueError(
                    f"model_dir={model_dir!r} and config.model_dir={config.model_dir!r} "
                    f"differ; give one of them, or the same directory in both")
            if model_dir is None:
                model_dir = config.model_dir
            if model_dir is None and self._comm.world_size > 1:
                model_dir = tempfile.mkdtemp(prefix=f"collective_strategy_rank{rank}_")
            model_dir = _worker_dir(model_dir, rank)
            replace = {"model_dir": model_dir}
            if rank > 0:
                replace.update(save_summary_steps=None, log_step_count_steps=None)
            config = config.replace(**replace)
            strategy = self

            def wrapped_model_fn(features, labels, mode, params, config):
                kwargs = {}
                names = inspect.signature(model_fn).parameters
                if "params" in names:
                    kwargs["params"] = params
                if "config" in names:
                    kwargs["config"] = config
                if "mode" in names:
                    kwargs["mode"] = mode
                if "labels" in names:
                    kwargs["labels"] = labels
                with strategy.scope():
                    spec = model_fn(features, **kwargs)
                    if mode == estimator_lib.ModeKeys.TRAIN and strategy.world_size > 1:
                        hooks = list(spec.training_hooks or [])
                        if not any(isinstance(h, BroadcastHook) for h in hooks):
                            hooks.append(BroadcastHook(0))
                        spec = spec._replace(training_hooks=hooks)
                return spec

            return estimator_lib.Estimator(model_fn=wrapped_model_fn, config=config,
                                           params=params, warm_start_from=warm_start_from)
        finally:
            if saved is not None:
                os.environ["TF_CONFIG"] = saved

    # ---------------------------------------------------------- export
    def export_saved_model(self, savedmodel_dir, checkpoint_dir=None, signature_def_fn=None,
                           assets_extra=None, as_text=False, clear_devices=True,
                           strip_default_attrs=True, session=None):
        """Writes a SavedModel (tag "serve") that one process can serve, with
        every sok table whole. Every worker must call it (the tables' shards
        are gathered); rank 0 writes it and returns its directory, the others
        return None.

        signature_def_fn: called with no arguments in a new graph; rebuilds
          the model (the same variable names as in training) and returns a
          {key: SignatureDef} map, or (map, main_op). While it runs,
          partitioned get_variable under embedding_scope() makes ordinary
          variables of the whole table's shape and lookups are TensorFlow's
          own, so the SavedModel needs no sok_graph op.
        session: a session (tf.compat.v1.Session or MonitoredSession) of the
          training graph, whose variable values are exported; or
        checkpoint_dir: the training checkpoint directory (rank r > 0 reads
          its shard from <checkpoint_dir>/worker<r>), when no session is given.
        savedmodel_dir: the export directory (must not exist), as
          tf.compat.v1.saved_model.Builder takes it.
        """
        if signature_def_fn is None or not callable(signature_def_fn):
            raise ValueError("signature_def_fn must be a function building the serving graph "
                             f"and returning its SignatureDef map; got {signature_def_fn!r}")
        if session is None and checkpoint_dir is None:
            raise ValueError("export_saved_model needs session=<a session of the training "
                             "graph> or checkpoint_dir=<its checkpoint directory>")
        savedmodel_dir, assets_extra = _checked_export_args(
            savedmodel_dir, session, assets_extra,
            dict(as_text=as_text, clear_devices=clear_devices,
                 strip_default_attrs=strip_default_attrs))
        values, tables = (self._session_values(session) if session is not None
                          else self._checkpoint_values(checkpoint_dir))
        dynamic = {name: v for name, v, _, _ in tables if is_dynamic(v)}
        full = self._gather_tables([t for t in tables if t[0] not in dynamic])
        values.update(full)
        runner = None
        if dynamic:
            raw = session._tf_sess() if hasattr(session, "_tf_sess") else session
            runner = sources.Runner(raw)
        # Every worker builds the serving graph (dynamic tables are gathered
        # while it is filled); rank 0 writes.
        return _write_saved_model(savedmodel_dir, values, signature_def_fn, assets_extra,
                                  as_text, clear_devices, strip_default_attrs, self._comm,
                                  table_sources=dynamic, source_runner=runner)

    def _session_values(self, session):
        raw = session._tf_sess() if hasattr(session, "_tf_sess") else session
        graph = raw.graph
        variables = graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
        dynamic = [v for v in variables if is_dynamic(v)]
        variables = [v for v in variables if not is_dynamic(v)]
        got = raw.run(list(variables)) if variables else []
        # dynamic tables are read in chunks while the serving graph is filled
        values, tables = {}, [(v.name, v, None, None) for v in dynamic]
        skip, prefixes = _model_parallel_variables(graph)
        for v, x in zip(variables, got):
            name = v.op.name
            if is_sok_variable(v):
                tables.append((name, x, v.placement, tuple(v.global_shape.as_list())))
            elif id(v) in skip or name.startswith(prefixes):
                continue  # optimizer slots of sharded tables are not served
            else:
                values[name] = x
        return values, tables

    def _checkpoint_values(self, checkpoint_dir):
        dynamic = sorted(var_name(v) for v in tf.compat.v1.get_default_graph().get_collection(
            tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) if is_dynamic(v))
        if dynamic:
            # A dynamic table is exported from the session that trained it
            # (its rows read in chunks); this read only the static ones and
            # failed with "'DynamicVariable' object has no attribute
            # 'global_shape'".
            raise ValueError(
                f"checkpoint_dir={checkpoint_dir!r}: export_saved_model reads sok."
                f"DynamicVariable tables {dynamic} from the session that trained them, not "
                f"from a checkpoint: pass session=<that session> instead of checkpoint_dir")
        own = _worker_dir(checkpoint_dir, self._comm.rank)
        path = tf.train.latest_checkpoint(own)
        if path is None:
            raise ValueError(f"checkpoint_dir={checkpoint_dir!r}: no checkpoint in {own!r} for "
                             f"rank {self._comm.rank}")
        reader = tf.train.load_checkpoint(path)
        shapes = reader.get_variable_to_shape_map()
        values, tables = {}, []
        table_names = self._known_tables()
        for name in sorted(shapes):
            if name in table_names:
                where, global_shape = table_names[name]
                tables.append((name, reader.get_tensor(name), where, global_shape))
            elif not name.startswith(tuple(t + "/" for t in table_names)):
                values[name] = reader.get_tensor(name)
        return values, tables

    def _known_tables(self):
        graph = tf.compat.v1.get_default_graph()
        return {v.op.name: (v.placement, tuple(v.global_shape.as_list()))
                for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                if is_sok_variable(v) and not is_dynamic(v)}

    def _gather_tables(self, tables):
        """{name: whole table} on rank 0 from every worker's shards."""
        out = {}
        if self._comm.world_size == 1:
            return {name: shard for name, shard, _, _ in tables}
        # A graph of its own, built the same way on every worker, so Horovod
        # matches the gathers whatever the training graph's state.
        with tf.Graph().as_default() as g:
            feeds, gathered = [], []
            for i, (name, shard, _, _) in enumerate(tables):
                ph = tf.compat.v1.placeholder(tf.as_dtype(shard.dtype), [None, shard.shape[1]])
                feeds.append(ph)
                gathered.append(self._comm.allgather(ph, name=f"collective_export_gather_{i}"))
            if not tables:
                return out
            with tf.compat.v1.Session(graph=g) as sess:
                results = sess.run(gathered, {ph: t[1] for ph, t in zip(feeds, tables)})
        for (name, _, where, global_shape), rows in zip(tables, results):
            out[name] = placement.assemble(rows, where, global_shape)
        return out
