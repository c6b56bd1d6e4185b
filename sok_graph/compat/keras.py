"""Which Keras this TensorFlow runs, and how to recognise optimizers of each
kind: Keras 2 (``tf.keras.optimizers`` up to TF 2.15, plus its ``legacy``
optimizers), Keras 3 (TF 2.16+), and ``tf.compat.v1.train`` optimizers."""

import sys
import weakref

import tensorflow as tf


def _keras_version():
    """The major version of the Keras that tf.keras is: the version of the
    package tf.keras lives in. With TF_USE_LEGACY_KERAS=1 on TF >= 2.16,
    tf.keras is tf_keras (Keras 2), which, like Keras 3, hides the version
    on tf.keras; the `keras` package installed beside it is Keras 3, so
    asking that one took tf_keras for Keras 3."""
    try:
        keras = tf.keras
        version = getattr(keras, "__version__", None)
        if version is None:
            package = sys.modules.get(str(getattr(keras, "__name__", "")).split(".")[0])
            version = getattr(package, "__version__", None)
        if version is None:
            import keras as keras_pkg  # Keras 3 hides the version on tf.keras

            version = keras_pkg.__version__
        return int(str(version).split(".")[0])
    except Exception:  # pragma: no cover - TF 1.x has its own tf.keras
        return 2


KERAS_MAJOR_VERSION = _keras_version()


def in_keras3_symbolic_build():
    """Whether Keras 3 is calling a model only for the shapes of its outputs:
    the symbolic build before fit, evaluate or train_on_batch (and
    compute_output_spec), which traces the call into a scratch graph that
    never runs, outside any strategy.run."""
    if KERAS_MAJOR_VERSION < 3:
        return False
    try:
        from keras.src.backend.common.symbolic_scope import in_symbolic_scope
    except ImportError:  # pragma: no cover - a Keras 3 without it
        return False
    return bool(in_symbolic_scope())


def in_keras_inference_call():
    """Whether a read is being built inside a Keras model's test_step or
    predict_step (its own or one it overrides): what model.evaluate, fit's
    validation pass and model.predict run, eagerly or traced into their
    tf.function, on Keras 3 and Keras 2. Keras' `training` values are not
    read: Keras 3 leaves a sub-layer's training=False (a frozen
    BatchNorm, a Dropout's default) in the shared call context for the
    layers after it, and fine-tuning calls model(x, training=False) under
    a GradientTape: both train."""
    classes = tuple(getattr(sys.modules.get(name), "Model", None) for name in _MODEL_MODULES)
    classes = tuple(c for c in classes if isinstance(c, type))
    if not classes:
        return False
    frame = sys._getframe(1)
    for _ in range(500):  # a Keras call is far less deep; the bound keeps the walk cheap
        if frame is None:
            return False
        if frame.f_code.co_name in _INFERENCE_STEPS and \
                isinstance(frame.f_locals.get("self"), classes):
            return True
        frame = frame.f_back
    return False


_INFERENCE_STEPS = ("test_step", "predict_step")
# Where each Keras keeps its Model class: Keras 3, the keras package 2.x
# (keras.src.engine since 2.13, keras.engine before), tf_keras.
_MODEL_MODULES = ("keras.src.models.model", "keras.src.engine.training", "keras.engine.training",
                  "tf_keras.src.engine.training")


def keras_saveable_class():
    """The base of what Keras 3's weights files save (model.save_weights,
    model.save, ModelCheckpoint): an object a layer holds as an attribute
    is saved only when it is one (tables/keras_weights.py). `object` where
    this Keras has none: Keras 2 and TF 1.x, whose files save tf.Variables
    on their own, and Keras 3 releases before 3.4."""
    if KERAS_MAJOR_VERSION < 3:
        return object
    try:
        from keras.src.saving.keras_saveable import KerasSaveable
    except ImportError:  # pragma: no cover - Keras 3.0 to 3.3
        return object
    return KerasSaveable


def keras_optimizer_classes():
    """Base classes of every Keras optimizer this TensorFlow can create."""
    classes = []
    try:
        classes.append(tf.keras.optimizers.Optimizer)
    except AttributeError:  # pragma: no cover
        pass
    legacy = getattr(tf.keras.optimizers, "legacy", None)
    # Keras 3 keeps a `legacy` module whose names only warn; only a real
    # optimizer class counts. Keras 2's new Optimizer stays in `experimental`
    # after sok.init made tf.keras.optimizers the legacy ones (its Lion and
    # Adafactor, which have no legacy kind, were left unrouted).
    experimental = getattr(tf.keras.optimizers, "experimental", None)
    for base in (getattr(legacy, "Optimizer", None), getattr(experimental, "Optimizer", None)):
        if isinstance(base, type) and hasattr(base, "apply_gradients") and base not in classes:
            classes.append(base)
    for cls in package_keras_optimizer_classes():
        if cls not in classes:
            classes.append(cls)
    return tuple(classes)


def package_keras_optimizer_classes():
    """The optimizer base classes of tf_keras (Keras 2 as a package: its new
    Optimizer and its legacy OptimizerV2) when a script has imported it;
    sok_graph never imports it itself."""
    module = sys.modules.get("tf_keras")
    optimizers = getattr(module, "optimizers", None)
    classes = []
    for holder in (optimizers, getattr(optimizers, "legacy", None)):
        base = getattr(holder, "Optimizer", None)
        if isinstance(base, type) and hasattr(base, "apply_gradients"):
            classes.append(base)
    return classes


def loss_scale_classes_building_every_variable():
    """Keras 2's LossScaleOptimizerV3 (the LossScaleOptimizer of its new
    optimizers, in tf.keras and in tf_keras where imported): its
    apply_gradients first builds the inner optimizer for every variable it
    is given, sok tables included, before the inner optimizer's
    apply_gradients (which sok.OptimizerScope routes) sees them. Keras 3's
    and the legacy LossScaleOptimizer build nothing there."""
    classes = []
    for mixed in (getattr(tf.keras, "mixed_precision", None),
                  getattr(sys.modules.get("tf_keras"), "mixed_precision", None)):
        outer = getattr(mixed, "LossScaleOptimizer", None)
        module = sys.modules.get(getattr(outer, "__module__", ""), None)
        cls = getattr(module, "LossScaleOptimizerV3", None)
        if isinstance(cls, type) and "build" in cls.__dict__ and cls not in classes:
            classes.append(cls)
    return classes


def keras2_loss_scale_classes():
    """Keras 2's LossScaleOptimizer classes (tf.keras' under Keras 2, and
    tf_keras' where imported) that define apply_gradients: the one over
    OptimizerV2 and LossScaleOptimizerV3."""
    classes = []
    packages = [sys.modules.get("tf_keras")]
    if KERAS_MAJOR_VERSION < 3:
        packages.insert(0, tf.keras)
    for package in packages:
        outer = getattr(getattr(package, "mixed_precision", None), "LossScaleOptimizer", None)
        module = sys.modules.get(getattr(outer, "__module__", ""), None)
        for cls in (outer, getattr(module, "LossScaleOptimizer", None),
                    getattr(module, "LossScaleOptimizerV3", None)):
            if isinstance(cls, type) and "apply_gradients" in cls.__dict__ \
                    and cls not in classes:
                classes.append(cls)
    return classes


def is_tf1_optimizer(opt):
    """A ``tf.compat.v1.train.Optimizer`` (GradientDescentOptimizer, ...)."""
    return isinstance(opt, tf.compat.v1.train.Optimizer)


def is_keras_optimizer_v2(opt):
    """A Keras 2 OptimizerV2: its legacy optimizers (``tf.keras.optimizers.legacy``,
    ``tf_keras.optimizers.legacy``, every tf.keras optimizer before TF 2.11
    and on TF 1.x), known by its base class's name in any package. Its
    Adagrad and RMSprop add epsilon after the root (algorithms.py)."""
    return "OptimizerV2" in [cls.__name__ for cls in type(opt).__mro__]


# Packages whose optimizers are Keras optimizers even when tf.keras is
# another Keras: tf_keras (Keras 2 as a package, which SOK scripts on
# TF >= 2.17 import for its legacy optimizers) and keras itself.
_KERAS_PACKAGES = ("tf_keras", "keras")
# Base classes of those packages' optimizers, by name: Keras 2's legacy
# OptimizerV2 (tf_keras.optimizers.legacy.*), Keras 2's new Optimizer and
# Keras 3's (Base)Optimizer.
_KERAS_BASE_NAMES = ("OptimizerV2", "Optimizer", "BaseOptimizer", "TFOptimizer")


def is_optimizer_base_class(cls):
    """A base class of the keras or tf_keras packages' optimizers (by its
    package and name, as is_package_keras_optimizer knows them)."""
    package = (getattr(cls, "__module__", "") or "").split(".")[0]
    return package in _KERAS_PACKAGES and cls.__name__ in _KERAS_BASE_NAMES


def is_package_keras_optimizer(opt):
    """An optimizer of the tf_keras (or keras) package, recognised by the
    package and name of a base class, without importing the package: tf_keras
    need not be installed, and its classes are not tf.keras's on TF >= 2.16."""
    for cls in type(opt).__mro__:
        if is_optimizer_base_class(cls):
            return callable(getattr(opt, "apply_gradients", None))
    return False


def is_learning_rate_schedule(lr):
    """A Keras LearningRateSchedule: tf.keras' own, or one of the tf_keras or
    keras package beside it (recognised by package and class name, as
    is_package_keras_optimizer recognises optimizers): under Keras 3 a
    script may import tf_keras for its optimizers and schedules, whose
    classes are not tf.keras'."""
    schedules = getattr(getattr(tf.keras, "optimizers", None), "schedules", None)
    base = getattr(schedules, "LearningRateSchedule", None)
    if isinstance(base, type) and isinstance(lr, base):
        return True
    for cls in type(lr).__mro__:
        package = (getattr(cls, "__module__", "") or "").split(".")[0]
        if package in _KERAS_PACKAGES and cls.__name__ == "LearningRateSchedule":
            return True
    return False


def is_keras_optimizer(opt):
    return isinstance(opt, keras_optimizer_classes()) or is_package_keras_optimizer(opt)


def legacy_optimizers_module():
    """``tf.keras.optimizers.legacy`` where it holds Keras 2's OptimizerV2
    optimizers (TF 2.11 to 2.15, or TF_USE_LEGACY_KERAS=1 with tf_keras);
    None where it does not (Keras 3, whose ``legacy`` names only raise, and
    TensorFlow before 2.11, whose optimizers are all OptimizerV2 already)."""
    try:
        optimizers = getattr(tf.keras, "optimizers", None)
        module = getattr(optimizers, "legacy", None)
        legacy_base = getattr(module, "Optimizer", None)
    except ImportError:  # a lazily loaded Keras that is not installed
        return None
    if not isinstance(legacy_base, type):
        return None
    if "OptimizerV2" not in [cls.__name__ for cls in getattr(legacy_base, "__mro__", ())]:
        return None
    return module


def is_optimizer(opt):
    return is_tf1_optimizer(opt) or is_keras_optimizer(opt)


# The attribute of a Keras 3 layer that holds the sok tables it tracks
# (list_tables_among_keras3_layer_weights).
_LAYER_TABLES = "_sok_tables"


def list_tables_among_keras3_layer_weights(is_table):
    """Makes a Keras 3 layer (a Model included) list the sok tables it holds
    as attributes among its weights, as a Keras 2 layer lists the
    tf.Variables it holds: `weights`, `variables` and the `trainable_*` /
    `non_trainable_*` lists built from them, so that `fit` trains them and
    SOK's `filter_variables(model.trainable_variables)` finds them. Keras 3
    tracks only its own variable class; a table (a tf.Variable) was left
    out of them, and both trained the dense layers only, without an error.

    `is_table(obj)` says what a sok table is (the tables' own predicate:
    this layer imports no table module). The tables go to a list of the
    layer's own, through the tracker Keras 3 uses for its variables (so
    lists and dicts of tables count, `del` forgets one, and a table added
    after the layer was built is refused as a Keras variable is), and not
    to Keras' variable lists: Keras saves those by position in its weights
    files, where a table saves itself (tables/keras_weights.py). A layer
    holding a table also says `supports_jit = False`: sok's ops have no XLA
    kernels, and `compile()`'s default jit_compile="auto" asks the layers.
    A table held by a frozen layer (`trainable = False`, a sub-layer's
    included) is among the non-trainable lists, as that layer's Keras
    variables are (Keras 3 clears their `trainable`, which a table has no
    setter for); a table shared with a trainable layer is frozen too.
    The summary counts a dynamic table's unknown number of rows as none, as
    Keras 2's does (its `math.prod` of a shape with None was a TypeError).
    Nothing is changed on Keras 2 and TF 1.x, or on a Keras 3 that has
    moved these internals (tables are then left out as before)."""
    if KERAS_MAJOR_VERSION < 3:
        return
    try:
        from keras.src.layers.layer import Layer
        from keras.src.utils import summary_utils
    except ImportError:  # pragma: no cover - a Keras 3 with another layout
        return
    if getattr(Layer, "_sok_lists_tables", False):
        return
    start_tracker = Layer._initialize_tracker

    def _initialize_tracker(layer):
        fresh = not hasattr(layer, "_tracker")
        start_tracker(layer)
        tracker = getattr(layer, "_tracker", None)
        if not fresh or not hasattr(tracker, "stored_ids") or _LAYER_TABLES in tracker.config:
            return
        held = []
        owner = weakref.ref(layer)

        def holds_table(value):
            if not is_table(value):
                return False
            if owner() is not None:
                object.__setattr__(owner(), "supports_jit", False)
            return True

        # After Keras' own kinds: a value one of them takes is theirs.
        tracker.config[_LAYER_TABLES] = (holds_table, held)
        tracker.stored_ids[_LAYER_TABLES] = set()
        object.__setattr__(layer, _LAYER_TABLES, held)

    def with_tables(listed):
        def weights(layer):
            found = listed.fget(layer)
            seen = {id(v) for v in found}
            for table in getattr(layer, _LAYER_TABLES, ()):
                if id(table) not in seen:
                    found.append(table)
                    seen.add(id(table))
            return found

        return property(weights, doc=listed.__doc__)

    def frozen_tables(layer):
        """ids of the tables held by a frozen layer within `layer` (itself
        included): Keras 3 freezes a layer by clearing its own variables'
        `trainable`, which a table (a tf.Variable) cannot take, and a
        model's trainable lists keep what says it is trainable."""
        frozen = set()
        for sub in layer._flatten_layers(include_self=True, recursive=True):
            if not sub.trainable:
                frozen.update(id(t) for t in getattr(sub, _LAYER_TABLES, ()))
        return frozen

    def without_frozen(listed):
        def trainable(layer):
            found = listed.fget(layer)
            frozen = frozen_tables(layer) if found else ()
            return [v for v in found if id(v) not in frozen]

        return property(trainable, doc=listed.__doc__)

    def with_frozen(listed, everything):
        def non_trainable(layer):
            found = listed.fget(layer)
            frozen = frozen_tables(layer) if layer.trainable else ()
            seen = {id(v) for v in found}
            return found + [v for v in everything.fget(layer)
                            if id(v) in frozen and id(v) not in seen]

        return property(non_trainable, doc=listed.__doc__)

    def sized(count):
        def count_known(weights):
            return count([w for w in weights if None not in tuple(w.shape)])

        return count_known

    Layer._initialize_tracker = _initialize_tracker
    Layer.weights = with_tables(Layer.weights)
    Layer.variables = with_tables(Layer.variables)
    # A table held by a frozen layer (`layer.trainable = False`, on a
    # sub-layer of the model fit trains) is not trainable: fit trained it.
    Layer.trainable_weights = without_frozen(Layer.trainable_weights)
    Layer.trainable_variables = without_frozen(Layer.trainable_variables)
    Layer.non_trainable_weights = with_frozen(Layer.non_trainable_weights, Layer.weights)
    Layer.non_trainable_variables = with_frozen(Layer.non_trainable_variables,
                                                Layer.variables)
    summary_utils.count_params = sized(summary_utils.count_params)
    summary_utils.weight_memory_size = sized(summary_utils.weight_memory_size)
    Layer._sok_lists_tables = True
