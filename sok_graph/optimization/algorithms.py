"""The sparse optimizer algorithms: one table, one entry per algorithm.

An entry says which optimizer classes it serves (by class name, so that
tf.compat.v1.train, Keras 2, Keras 3 and sok_graph's own rules all find it),
which slots it keeps per row (name and initial value), which name the fused
update ops know each of its slot layouts by (`kernels`: RMSprop keeps one to
three slots, as it has momentum and is centered) and how it updates rows in
TensorFlow ops: update(hp, w, g, slots, lr, step) -> (new rows, {slot: new
rows}), where w, g and the slot rows are the rows the gradient touches.

Float32 tables are updated by the fused ops (optimization/fused_apply.py),
whose formulas are tf_ops/optimizer/core/sparse_apply.h; the formulas here
update the tables of other dtypes, and every row of a table where the
wrapper is asked to (`update_all_rows`), the same way. Adding an algorithm
is adding an entry here and its formula and slots there.

Each formula follows the optimizer family it wraps (e.g. Keras' Adagrad
divides by sqrt(accum + epsilon), Keras 2's OptimizerV2 Adagrad by
sqrt(accum) + epsilon, TF1's by sqrt(accum); TF1's RMSProp starts its mean
square at 1, Keras' at 0), so sparse updates equal what TensorFlow's own
sparse kernels compute for the rows they touch. `hp.tf1` selects the
tf.compat.v1.train variant, `hp.keras_v2` Keras 2's OptimizerV2 (its legacy
optimizers), whose Adagrad and momentum-free RMSprop add epsilon after the
root.
"""

import collections
import math
import types
import weakref

import numpy as np
import tensorflow as tf

from sok_graph import compat

Algorithm = collections.namedtuple("Algorithm",
                                   ["name", "optimizer_classes", "slots", "update", "kernels"])
# kernels: ((the fused ops' name for a slot layout, {Hyperparameters
# attribute: value} that selects it), ...); by default the algorithm's own
# name for every setting.


def _one_kernel(name):
    return ((name, {}),)


def value(x):
    """A float or tensor hyperparameter, called if callable (TF1 style)."""
    return x() if callable(x) and not hasattr(x, "get_config") else x


def _f(x, like):
    return tf.cast(value(x), like.dtype)


def _one_minus(hp, x, like):
    """1 - x (a decay rate: Adam's betas, RMSprop's and Adadelta's rho) in
    the dtype of `like`, rounded as the optimizer family rounds it:
    tf.compat.v1 and Keras 2's OptimizerV2 subtract the rate after casting
    it to the variable's dtype, Keras 3 (and Keras 2's newer optimizers)
    subtract the Python number, then cast. In a float16 table 1 -
    float16(0.999) is 0.00097656 where Keras' 1 - 0.999 is 0.0010004: Adam's
    second moment grew 2.4% slower than Keras' own on a tf.Variable of the
    same rows. Float32 rows keep the fused ops' rounding (sparse_apply.h
    subtracts after the cast; these formulas must equal them there, and
    float32 rounds 1 - 0.999 within 5e-5 of Keras)."""
    if hp.tf1 or hp.keras_v2 or like.dtype == tf.float32:
        return 1.0 - _f(x, like)
    return tf.cast(1.0 - value(x), like.dtype)


# --------------------------------------------------------------- formulas

def _sgd(hp, w, g, s, lr, step):
    return w - lr * g, {}


def _momentum(hp, w, g, s, lr, step):
    m = _f(hp.momentum, w)
    if hp.tf1:
        acc = m * s["momentum"] + g
        step_ = lr * g + lr * m * acc if hp.nesterov else lr * acc
        return w - step_, {"momentum": acc}
    vel = m * s["momentum"] - lr * g
    return (w + m * vel - lr * g if hp.nesterov else w + vel), {"momentum": vel}


def _adagrad(hp, w, g, s, lr, step):
    acc = s["accumulator"] + g * g
    if hp.tf1:
        denom = tf.sqrt(acc)
    elif hp.keras_v2:
        denom = tf.sqrt(acc) + _f(hp.epsilon, w)
    else:
        denom = tf.sqrt(acc + _f(hp.epsilon, w))
    return w - lr * g / denom, {"accumulator": acc}


def _power(x, p):
    """x ** p, a square root where p is 0.5 (the usual learning_rate_power of
    -0.5): exactly rounded like TensorFlow's own FTRL kernels and the fused
    update (sparse_apply.h PowerOf), where pow may differ by an ulp, which
    FTRL's difference of two powers magnifies."""
    return tf.where(tf.equal(p, 0.5), tf.sqrt(x), tf.pow(x, p))


def _ftrl(hp, w, g, s, lr, step):
    p = -_f(hp.lr_power, w)
    acc, lin = s["accumulator"], s["linear"]
    new_acc = acc + g * g
    g_shrunk = g + 2.0 * _f(hp.l2_shrinkage, w) * w
    pow_new = _power(new_acc, p)
    lin = lin + g_shrunk - (pow_new - _power(acc, p)) / lr * w
    quad = pow_new / lr + 2.0 * (_f(hp.l2, w) + _f(hp.beta, w) / (2.0 * lr))
    l1 = _f(hp.l1, w)
    new_w = (tf.clip_by_value(lin, -l1, l1) - lin) / quad
    return new_w, {"accumulator": new_acc, "linear": lin}


def _rmsprop_slots(hp):
    slots = [("rms", 1.0 if hp.tf1 else 0.0)]
    if hp.uses_momentum:
        slots.append(("momentum", 0.0))
    if hp.centered:
        slots.append(("mg", 0.0))
    return slots


def _rmsprop(hp, w, g, s, lr, step):
    rho = _f(hp.rho, w)
    ms = rho * s["rms"] + _one_minus(hp, hp.rho, w) * g * g
    new = {"rms": ms}
    # Keras 2's OptimizerV2 without momentum: epsilon after the root.
    epsilon_after_root = hp.keras_v2 and "momentum" not in s
    denom = ms if epsilon_after_root else ms + _f(hp.epsilon, w)
    if hp.centered:
        mg = rho * s["mg"] + _one_minus(hp, hp.rho, w) * g
        new["mg"] = mg
        denom = denom - mg * mg
    if epsilon_after_root:
        inc = lr * g / (tf.sqrt(denom) + _f(hp.epsilon, w))
    else:
        inc = lr * g * tf.math.rsqrt(denom)
    if "momentum" in s:
        mom = _f(hp.momentum, w) * s["momentum"] + inc
        new["momentum"] = mom
        return w - mom, new
    return w - inc, new


def _adadelta(hp, w, g, s, lr, step):
    rho, eps = _f(hp.rho, w), _f(hp.epsilon, w)
    acc = rho * s["accum"] + _one_minus(hp, hp.rho, w) * g * g
    upd = tf.sqrt(s["accum_update"] + eps) * tf.math.rsqrt(acc + eps) * g
    acc_upd = rho * s["accum_update"] + _one_minus(hp, hp.rho, w) * upd * upd
    return w - lr * upd, {"accum": acc, "accum_update": acc_upd}


def _adam(hp, w, g, s, lr, step):
    """Lazy Adam: untouched rows keep their moments; the bias correction uses
    the wrapper's step count."""
    b1, b2, eps = _f(hp.beta_1, w), _f(hp.beta_2, w), _f(hp.epsilon, w)
    t = tf.cast(step, w.dtype)
    m = b1 * s["m"] + _one_minus(hp, hp.beta_1, w) * g
    v = b2 * s["v"] + _one_minus(hp, hp.beta_2, w) * g * g
    alpha = lr * tf.sqrt(1.0 - tf.pow(b2, t)) / (1.0 - tf.pow(b1, t))
    return w - alpha * m / (tf.sqrt(v) + eps), {"m": m, "v": v}


def _adamax(hp, w, g, s, lr, step):
    b1, b2, eps = _f(hp.beta_1, w), _f(hp.beta_2, w), _f(hp.epsilon, w)
    t = tf.cast(step, w.dtype)
    m = b1 * s["m"] + _one_minus(hp, hp.beta_1, w) * g
    u = tf.maximum(b2 * s["v"], tf.abs(g))
    return w - lr / (1.0 - tf.pow(b1, t)) * m / (u + eps), {"m": m, "v": u}


# ------------------------------------------------------------------ table

_RMSPROP_KERNELS = tuple(
    ("rmsprop" + ("_momentum" if momentum else "") + ("_centered" if centered else ""),
     {"uses_momentum": momentum, "centered": centered})
    for momentum in (False, True) for centered in (False, True))

ALGORITHMS = {a.name: a for a in (
    Algorithm("sgd", ("GradientDescentOptimizer", "SGD"), lambda hp: [], _sgd,
              _one_kernel("sgd")),
    Algorithm("momentum", ("MomentumOptimizer",), lambda hp: [("momentum", 0.0)], _momentum,
              _one_kernel("momentum")),
    Algorithm("adagrad", ("AdagradOptimizer", "Adagrad"),
              lambda hp: [("accumulator", float(hp.initial_accumulator))], _adagrad,
              _one_kernel("adagrad")),
    Algorithm("ftrl", ("FtrlOptimizer", "Ftrl"),
              lambda hp: [("accumulator", float(hp.initial_accumulator)), ("linear", 0.0)],
              _ftrl, _one_kernel("ftrl")),
    Algorithm("rmsprop", ("RMSPropOptimizer", "RMSprop"), _rmsprop_slots, _rmsprop,
              _RMSPROP_KERNELS),
    Algorithm("adadelta", ("AdadeltaOptimizer", "Adadelta"),
              lambda hp: [("accum", 0.0), ("accum_update", 0.0)], _adadelta,
              _one_kernel("adadelta")),
    Algorithm("adam", ("AdamOptimizer", "Adam", "LazyAdam", "LazyAdamOptimizer"),
              lambda hp: [("m", 0.0), ("v", 0.0)], _adam, _one_kernel("adam")),
    Algorithm("adamax", ("Adamax",), lambda hp: [("m", 0.0), ("v", 0.0)], _adamax,
              _one_kernel("adamax")),
)}


def kernel_slot_names():
    """{the fused ops' algorithm name: the slot names this table keeps for
    it}, every slot layout of every algorithm (what the ops' registration
    must say too; optimization/fused_apply.py checks)."""
    out = {}
    for algorithm in ALGORITHMS.values():
        for kernel, settings in algorithm.kernels:
            # Slot names only: their initial values come from the optimizer.
            hp = types.SimpleNamespace(initial_accumulator=0.0, tf1=False, **settings)
            out[kernel] = tuple(name for name, _ in algorithm.slots(hp))
    return out

_BY_CLASS_NAME = {cls: a.name for a in ALGORITHMS.values() for cls in a.optimizer_classes}


# The methods in which TensorFlow's and Keras' optimizers compute their
# updates and make their state (tf.compat.v1.train, Keras 2's OptimizerV2
# and newer optimizer, Keras 3).
_UPDATE_METHODS = ("_apply_dense", "_apply_sparse", "_apply_sparse_shared",
                   "_resource_apply_dense", "_resource_apply_sparse",
                   "_resource_apply_sparse_duplicate_indices", "_prepare", "_prepare_local",
                   "_finish", "_create_slots", "update_step", "_update_step",
                   "_update_step_xla", "build",
                   # What Keras does to the gradients before its update
                   # (Keras 3's apply and _clip_gradients, Keras 2's
                   # transforms and aggregation): the rows of sok tables
                   # took the gradients untouched, where a tf.Variable
                   # took them halved, clipped or scaled.
                   "apply", "_clip_gradients", "_transform_gradients",
                   "_transform_unaggregated_gradients", "_aggregate_gradients",
                   "_apply_weight_decay", "_backend_apply_gradients")

# Adam's amsgrad keeps a slot and a rule the row updates do not have.
_AMSGRAD_REFUSAL = "sok.OptimizerWrapper does not support Adam(amsgrad=True)"


def _refuse_a_changed_update(optimizer, known, subclasses):
    """TypeError where a class between `optimizer`'s own and `known` (the
    algorithm table's class it derives from) computes updates its own way:
    the row updates would be `known`'s, and what the subclass adds would be
    ignored (tf.contrib.opt's AdamWOptimizer trained as Adam without its
    weight decay, NadamOptimizer and AdaMaxOptimizer as Adam, without an
    error)."""
    for cls in subclasses:
        changed = [m for m in _UPDATE_METHODS if m in vars(cls)]
        if changed:
            raise TypeError(
                f"sok.OptimizerWrapper (and sok.OptimizerScope) update sok rows by "
                f"{known.__name__}'s rule; {type(optimizer).__name__} derives from it but "
                f"computes its updates its own way ({cls.__name__} defines {changed[0]}), "
                f"which the row updates would ignore: give sok tables a supported optimizer "
                f"(SGD, Momentum, Adagrad, Ftrl, RMSprop, Adadelta, Adam, Adamax)")


def refuse_an_own_apply_gradients(optimizer):
    """TypeError where a class between `optimizer`'s own and the algorithm
    table's class it derives from defines apply_gradients (a subclass that
    scales or clips the gradients there): sok.OptimizerWrapper updates the
    rows of sok tables without calling it, so they took the gradients
    untouched. (sok.OptimizerScope calls it: its tables' gradients are
    taken from inside the optimizer's own apply_gradients.)"""
    mro = type(optimizer).__mro__
    for at, cls in enumerate(mro):
        if cls.__name__ in _BY_CLASS_NAME:
            for sub in mro[:at]:
                if "apply_gradients" in vars(sub):
                    raise TypeError(
                        f"sok.OptimizerWrapper updates sok rows without calling "
                        f"{type(optimizer).__name__}.apply_gradients ({sub.__name__} defines "
                        f"its own), so what it does to the gradients would not reach them: "
                        f"use sok.OptimizerScope([tables]) with the optimizer itself, which "
                        f"calls it, or change the gradients before apply_gradients")
            return


def _algorithm_name(optimizer):
    """The table's name for `optimizer`: its class's `sok_algorithm` (sok_graph's
    own rules say it), else by the name of the first class in its MRO that
    the table lists."""
    own = getattr(type(optimizer), "sok_algorithm", None)
    if own is not None:
        return own
    mro = type(optimizer).__mro__
    for at, cls in enumerate(mro):
        if cls.__name__ in _BY_CLASS_NAME:
            _refuse_a_changed_update(optimizer, cls, mro[:at])
            return _BY_CLASS_NAME[cls.__name__]
    if any(cls.__name__ == "MixedPrecisionLossScaleOptimizer" for cls in type(optimizer).__mro__):
        # tf.compat.v1's (tf.compat.v1.train.experimental): it keeps the
        # optimizer it wraps as _optimizer, and sok.OptimizerScope routes
        # the tables' gradients to that one under its own finite check.
        # It used to be refused as an unsupported optimizer, with no word
        # of mixed precision or of the way out.
        raise TypeError(
            f"sok.OptimizerWrapper takes the optimizer itself, not tf.compat.v1's mixed "
            f"precision {type(optimizer).__name__} (its gradients are scaled): call its "
            f"minimize / apply_gradients inside sok.OptimizerScope(tables), which updates the "
            f"sok tables by the optimizer it wraps only on steps whose gradients are all "
            f"finite, or divide the tables' gradients by its loss scale and apply them with "
            f"sok.OptimizerWrapper of the optimizer it wraps only where they are all finite")
    if any(cls.__name__.startswith("LossScaleOptimizer") for cls in type(optimizer).__mro__):
        # Mixed precision's wrapper (keras.mixed_precision.set_global_policy
        # makes compile() wrap the optimizer): its gradients are scaled.
        raise TypeError(
            f"sok.OptimizerWrapper (and sok.OptimizerScope) take the optimizer itself, not "
            f"mixed precision's {type(optimizer).__name__} (compile() wraps the optimizer in "
            f"it under a mixed_float16 policy): keep the sok tables' gradients out of it, "
            f"divide them by its loss scale, and apply them with "
            f"sok.OptimizerWrapper(optimizer.inner_optimizer) only where they are all finite "
            f"(on a step whose scaled gradients overflowed it skips the other weights' update "
            f"and lowers the scale; applied there, they write inf or NaN into the rows)")
    raise TypeError(
        f"sok.OptimizerWrapper supports SGD, Momentum, Adagrad, Ftrl, RMSprop, Adadelta, Adam "
        f"and Adamax optimizers; got {type(optimizer).__name__}")


def _uses_momentum(opt, momentum):
    """Whether `momentum` (the optimizer's hyperparameter) is > 0. Keras 2's
    OptimizerV2 SGD and RMSprop (the legacy optimizers, and all of Keras on
    TF 1.15) keep the answer as the flag _momentum: their momentum may be a
    variable by now, which has no float value while a graph is built."""
    flag = getattr(opt, "_momentum", None)
    if isinstance(flag, bool):
        return flag
    momentum = value(momentum)
    if momentum is None:
        return False
    if isinstance(momentum, (tf.Tensor, tf.Variable)) and not tf.executing_eagerly():
        known = tf.get_static_value(momentum) if isinstance(momentum, tf.Tensor) else None
        if known is None:
            # Its value comes when the graph runs (a placeholder, a
            # variable; bool() of it raised "using a tf.Tensor as a Python
            # bool"): the momentum update, which with momentum 0 is SGD's.
            return True
        momentum = known
    return float(momentum) > 0


def _attr(opt, *names, default=None):
    """The first of `names` that `opt` has and that is not None."""
    for name in names:
        found = getattr(opt, name, None)
        if found is not None:
            return found
    return default


# Keras optimizer options the sparse row updates do not apply: set, they
# would be silently ignored for the sok tables, so they are refused. Each is
# (the option's name, the attributes that hold it): Keras 2's OptimizerV2
# keeps its learning-rate `decay` as _initial_decay; Keras 3 divides the
# gradients by loss_scale_factor before applying them.
_UNAPPLIED_OPTIONS = (
    ("weight_decay", ("weight_decay",)), ("clipnorm", ("clipnorm",)),
    ("clipvalue", ("clipvalue",)), ("global_clipnorm", ("global_clipnorm",)),
    ("gradient_accumulation_steps", ("gradient_accumulation_steps",)),
    ("use_ema", ("use_ema",)), ("decay", ("_initial_decay",)),
    ("loss_scale_factor", ("loss_scale_factor",)),
    ("gradient_transformers", ("gradient_transformers",)))


def _unapplied_option(opt):
    """The message refusing the first option of `opt` that the row updates
    would ignore, or None."""
    for option, names in _UNAPPLIED_OPTIONS:
        setting = _attr(opt, *names)
        if setting is None or setting is False or (isinstance(setting, (list, tuple))
                                                   and not setting):
            continue
        try:
            if float(value(setting)) == 0:
                continue
        except (TypeError, ValueError):
            pass
        return (f"sok.OptimizerWrapper does not apply {type(opt).__name__}'s {option}="
                f"{value(setting)!r} to the rows of sok tables (it would be ignored there); "
                f"leave {option} unset for the optimizer that updates sok tables, and give the "
                f"dense variables an optimizer of their own if they need it")
    return None


# The hyperparameters each algorithm reads, each with the range of the
# numbers it takes: (low, high, whether high itself is taken), None for no
# bound (every one must be finite). A number outside made every row the
# update touched NaN or infinite (Adam's beta_1=1 divides its bias
# correction by zero, beta_2 > 1 or rho > 1 takes the root of a negative
# number, a NaN spreads to every updated row) or moved rows up the
# gradient (a negative learning rate, refused as sok's own optimizers
# refuse it).
_ANY = (None, None, False)
_RATE = (0.0, None, False)
_FRACTION = (0.0, 1.0, True)
_BELOW_ONE = (0.0, 1.0, False)
_RANGES = {
    "sgd": {"lr": _RATE},
    "momentum": {"lr": _RATE, "momentum": _ANY},
    "adagrad": {"lr": _RATE, "initial_accumulator": _RATE, "epsilon": _RATE},
    "ftrl": {"lr": _RATE, "initial_accumulator": _RATE, "lr_power": _ANY, "l1": _ANY,
             "l2": _ANY, "l2_shrinkage": _ANY, "beta": _ANY},
    "rmsprop": {"lr": _RATE, "rho": _FRACTION, "epsilon": _RATE, "momentum": _ANY},
    "adadelta": {"lr": _RATE, "rho": _FRACTION, "epsilon": _RATE},
    "adam": {"lr": _RATE, "beta_1": _BELOW_ONE, "beta_2": _BELOW_ONE, "epsilon": _RATE},
    "adamax": {"lr": _RATE, "beta_1": _BELOW_ONE, "beta_2": _FRACTION, "epsilon": _RATE},
}
# How the optimizers spell them, where not as Hyperparameters does.
_KERAS_NAMES = {"lr": "learning_rate", "initial_accumulator": "initial_accumulator_value",
                "lr_power": "learning_rate_power", "l1": "l1_regularization_strength",
                "l2": "l2_regularization_strength",
                "l2_shrinkage": "l2_shrinkage_regularization_strength"}
_TF1_NAMES = dict(_KERAS_NAMES, beta_1="beta1", beta_2="beta2")


def known_number(x):
    """The float value of hyperparameter `x` where it is a number (Python,
    numpy, or an eager tensor or variable of one number: Keras 2 on TF 1.x
    keeps every hyperparameter as a variable, Keras 3 its learning rate, in
    a Keras variable that is no tf.Variable), else None (a graph tensor or
    variable, a callable or a schedule: known only when it runs)."""
    if isinstance(x, (bool, np.bool_)):
        return None
    if isinstance(x, (int, float, np.number)):
        return float(x)
    if tf.executing_eagerly() and hasattr(x, "numpy") and hasattr(x, "dtype") \
            and not callable(x):
        number = np.asarray(x.numpy())
        if number.shape == () and number.dtype.kind in "iuf":
            return float(number)
    return None


def _out_of_range(opt, hp, algorithm, numbers_only=False):
    """The message refusing the first hyperparameter of `opt` (as `hp`
    read it) outside the range `algorithm` takes (_RANGES), or None. With
    numbers_only, only Python and numpy numbers are checked (an eager
    tensor's value would be read back from its device)."""
    names = _TF1_NAMES if hp.tf1_names else _KERAS_NAMES
    for attr, (low, high, high_taken) in _RANGES[algorithm].items():
        setting = getattr(hp, attr)
        if numbers_only and not isinstance(setting, (int, float, np.number)):
            continue
        number = known_number(setting)
        if number is None:
            continue
        if attr == "rho" and hp.tf1_names and algorithm == "rmsprop":
            name = "decay"  # RMSPropOptimizer's name for it
        else:
            name = names.get(attr, attr)
        inside = math.isfinite(number) and (low is None or number >= low) and (
            high is None or number < high or high_taken and number == high)
        if inside:
            continue
        if low is None:
            wanted = "a finite number"
        elif high is None:
            wanted = f"a finite number >= {low:g}"
        else:
            wanted = f"in [{low:g}, {high:g}{']' if high_taken else ')'}"
        return (f"sok.OptimizerWrapper: {type(opt).__name__}'s {name} must be {wanted} for "
                f"the rows of sok tables ({algorithm}); got {number!r}")
    return None


# A Keras optimizer's numeric hyperparameters and its learning rate, read
# from it whenever an update is built (so `opt.beta_1 = 0.5` between
# steps takes effect as it does for Keras' own updates; a tf.function
# traced before keeps what it read, as Keras' own does): Hyperparameters'
# attribute -> (the optimizer's attributes, the first that is set wins;
# the default). Keras 2's OptimizerV2 keeps some private.
_KERAS_LIVE = {
    # Keras 3 keeps its rate (a variable, or a schedule or callable) as
    # _learning_rate, Keras 2's OptimizerV2 as the hyperparameter
    # learning_rate. Read live: `opt.learning_rate = schedule` replaces the
    # object (a number is assigned into the variable), and the rows of sok
    # tables kept the rate read when the wrapper was made.
    "lr": (("_learning_rate", "learning_rate"), None),
    "momentum": (("momentum",), 0.0),
    "epsilon": (("epsilon",), 1e-7),
    "beta_1": (("beta_1",), 0.9),
    "beta_2": (("beta_2",), 0.999),
    "rho": (("rho",), 0.9),
    "lr_power": (("learning_rate_power",), -0.5),
    "l1": (("l1_regularization_strength",), 0.0),
    "l2": (("l2_regularization_strength",), 0.0),
    # Keras 2's OptimizerV2 Ftrl keeps it private and reads only that: a
    # public attribute set later is not what its update uses.
    "l2_shrinkage": (("_l2_shrinkage_regularization_strength",
                      "l2_shrinkage_regularization_strength"), 0.0),
    "beta": (("beta",), 0.0),
}


class Hyperparameters:
    """One wrapped optimizer's algorithm (an entry of ALGORITHMS), formula
    flavor (`tf1`) and hyperparameters, read from its attributes: a Keras
    optimizer's numbers each time an update is built (_KERAS_LIVE), what
    decides the slots (momentum or not, centered, nesterov, the initial
    accumulator) and a tf.compat.v1 optimizer's numbers (fixed when it is
    made) once."""

    # The optimizer is held by weak references: a native optimizer holds
    # its own wrapper (wrapper.wrapper_for), and a reference back from here
    # kept a dropped optimizer alive until a full garbage collection.

    def __init__(self, opt, tf1_formulas=None):
        self._live_ref = None  # the Keras optimizer whose numbers are read live
        name = _algorithm_name(opt)
        tf1_names = compat.is_tf1_optimizer(opt)  # how its attributes are spelled
        # tf1_formulas: sok_graph's own rules choose the formula flavor.
        self.tf1 = tf1_names if tf1_formulas is None else bool(tf1_formulas)
        self.keras_v2 = not self.tf1 and compat.is_keras_optimizer_v2(opt)
        o = opt
        # An option the row updates would ignore (a message refusing it).
        self.unapplied = None
        if tf1_names:
            # TF1's Adam and Adadelta keep it as _lr; fixed when it is made.
            self.lr = _attr(o, "_learning_rate", "_lr", "learning_rate")
            self.momentum = _attr(o, "_momentum", default=0.0)
            self.nesterov = _attr(o, "_use_nesterov", default=False)
            self.epsilon = _attr(o, "_epsilon", default=1e-8)
            self.beta_1 = _attr(o, "_beta1", default=0.9)
            self.beta_2 = _attr(o, "_beta2", default=0.999)
            self.rho = _attr(o, "_decay", "_rho", default=0.95)
            self.centered = _attr(o, "_centered", default=False)
            self.initial_accumulator = _attr(o, "_initial_accumulator_value", default=0.1)
            self.lr_power = _attr(o, "_learning_rate_power", default=-0.5)
            self.l1 = _attr(o, "_l1_regularization_strength", default=0.0)
            self.l2 = _attr(o, "_l2_regularization_strength", default=0.0)
            self.l2_shrinkage = _attr(o, "_l2_shrinkage_regularization_strength", default=0.0)
            self.beta = _attr(o, "_beta", default=0.0)  # FtrlOptimizer's (TF >= 2.x)
            if name == "sgd":
                self.momentum = 0.0
        else:
            self._live_ref = weakref.ref(o)  # momentum, ...: _KERAS_LIVE, __getattr__
            self.nesterov = _attr(o, "nesterov", default=False)
            self.centered = _attr(o, "centered", default=False)
            # Keras 2's OptimizerV2 Adagrad keeps it private.
            self.initial_accumulator = _attr(o, "initial_accumulator_value",
                                             "_initial_accumulator_value", default=0.1)
            if name == "adam" and _attr(o, "amsgrad", default=False):
                raise ValueError(_AMSGRAD_REFUSAL)
            self.unapplied = _unapplied_option(o)
        self.uses_momentum = _uses_momentum(o, self.momentum)
        # Keras' SGD with momentum is the momentum algorithm.
        if name == "sgd" and self.uses_momentum:
            name = "momentum"
        self.algorithm = ALGORITHMS[name]
        self.tf1_names = tf1_names
        self._opt_ref = weakref.ref(o)
        # Every hyperparameter as it is now, eager tensors read too; the
        # numbers again before each update (out_of_range).
        self._first_refusal = _out_of_range(o, self, name)

    def __getattr__(self, name):
        # Only for attributes __init__ did not set: a Keras optimizer's
        # numbers, read now.
        live = self._live_optimizer()
        if live is not None and name in _KERAS_LIVE:
            names, default = _KERAS_LIVE[name]
            return _attr(live, *names, default=default)
        raise AttributeError(name)

    @property
    def out_of_range(self):
        """A message refusing a hyperparameter out of its algorithm's range
        (a number as the optimizer holds it now), or None."""
        return self._first_refusal or _out_of_range(self._opt_ref(), self, self.algorithm.name,
                                                    numbers_only=True)

    def _live_optimizer(self):
        """The Keras optimizer whose numbers are read live, or None (read
        through __dict__: __getattr__ asks it, also before __init__ set it)."""
        ref = self.__dict__.get("_live_ref")
        return None if ref is None else ref()

    @property
    def refusal(self):
        """Why this optimizer may not update sok rows (an option they would
        ignore, a hyperparameter out of range), or None; asked before each
        update, as the numbers may have changed since."""
        return self.unapplied_option or self.changed_setting or self.out_of_range

    @property
    def changed_setting(self):
        """A message refusing a Keras optimizer's nesterov, centered or
        amsgrad set after the wrapper was made, or momentum set above 0
        after it was made at 0 (the rows' rule and slots
        were chosen by them then: the new setting was ignored for sok rows,
        without an error), or None."""
        live = self._live_optimizer()
        if live is None:
            return None
        if self.algorithm.name == "adam" and _attr(live, "amsgrad", default=False):
            return _AMSGRAD_REFUSAL
        if not self.uses_momentum and _uses_momentum(live, _attr(live, "momentum")):
            # Keras 3 keeps momentum as a number: set above 0 later, the
            # rows went on with the rule and slots chosen without it
            # (plain SGD), where Keras' own update fails for want of its
            # momentum slots.
            return (f"{type(live).__name__}'s momentum is above 0 now and was 0 when "
                    f"sok.OptimizerWrapper was made, which chose the sok rows' update and "
                    f"slots by it: set momentum before making the wrapper (or before the "
                    f"first step inside sok.OptimizerScope)")
        for flag in ("nesterov", "centered"):
            now = bool(_attr(live, flag, default=False))
            if now != bool(getattr(self, flag)):
                return (f"{type(live).__name__}'s {flag} is {now} now and was "
                        f"{bool(getattr(self, flag))} when sok.OptimizerWrapper was made, "
                        f"which chose the sok rows' update and slots by it: set {flag} "
                        f"before making the wrapper (or before the first step inside "
                        f"sok.OptimizerScope)")
        return None

    @property
    def unapplied_option(self):
        """A message refusing an option the row updates would ignore
        (clipnorm, weight_decay, ...), as the optimizer holds it now: one
        set after the wrapper was made (opt.clipnorm = 1.0) was ignored
        for sok rows without an error, while the dense weights took it."""
        live = self._live_optimizer()
        if live is None:
            return self.unapplied
        return _unapplied_option(live)

    def slots(self):
        """(name, initial value) of each slot the algorithm keeps per row."""
        return self.algorithm.slots(self)

    @property
    def kernel(self):
        """The fused ops' name for this algorithm with these settings."""
        for kernel, settings in self.algorithm.kernels:
            if all(bool(getattr(self, k)) == v for k, v in settings.items()):
                return kernel
        raise AssertionError(f"no kernel of {self.algorithm.name} for these settings")

    def update(self, w, g, s, lr, step):
        """(new rows, new slot rows) from rows w, gradient rows g, slot rows s."""
        return self.algorithm.update(self, w, g, s, lr, step)
