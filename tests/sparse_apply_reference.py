"""The fused sparse optimizer ops' reference: the algorithms' formulas in
float64 numpy, on whole rows (tests of SokSparseApply and
SokDynamicSparseApply)."""

import numpy as np


def hyper(lr=0.1, momentum=0.9, epsilon=1e-7, beta_1=0.8, beta_2=0.95, lr_power=-0.5, l1=0.01,
           l2=0.02, l2_shrinkage=0.03, beta=0.5, rho=0.85):
    return np.array([lr, momentum, epsilon, beta_1, beta_2, lr_power, l1, l2, l2_shrinkage, beta,
                     rho], np.float32)


# The formula families the ops take (their attributes tf1 and
# keras_optimizer_v2): Keras', tf.compat.v1.train's, Keras 2's OptimizerV2.
FORMULAS = ("keras", "tf1", "keras_v2")


def formula_attrs(formulas):
    """The ops' attributes selecting `formulas`."""
    return {"tf1": formulas == "tf1", "keras_optimizer_v2": formulas == "keras_v2"}


def numpy_step(algorithm, w, slots, g, h, step, formulas="keras", nesterov=False):
    """The algorithms' formulas in float64, on whole rows. Keras 2's
    OptimizerV2 (keras_v2) adds epsilon after the root of Adagrad and of
    RMSprop without momentum, as its sparse kernels do."""
    assert formulas in FORMULAS, formulas
    tf1, keras_v2 = formulas == "tf1", formulas == "keras_v2"
    lr, mom, eps, b1, b2, lr_power, l1, l2, shrink, beta, rho = [float(x) for x in h]
    if algorithm == "sgd":
        return w - lr * g, []
    if algorithm == "momentum":
        if tf1:
            acc = mom * slots[0] + g
            return w - (lr * g + lr * mom * acc if nesterov else lr * acc), [acc]
        vel = mom * slots[0] - lr * g
        return (w + mom * vel - lr * g if nesterov else w + vel), [vel]
    if algorithm == "adagrad":
        acc = slots[0] + g * g
        if keras_v2:
            return w - lr * g / (np.sqrt(acc) + eps), [acc]
        return w - lr * g / np.sqrt(acc if tf1 else acc + eps), [acc]
    if algorithm == "adam":
        m = b1 * slots[0] + (1 - b1) * g
        v = b2 * slots[1] + (1 - b2) * g * g
        alpha = lr * np.sqrt(1 - b2 ** step) / (1 - b1 ** step)
        return w - alpha * m / (np.sqrt(v) + eps), [m, v]
    if algorithm.startswith("rmsprop"):
        # slots: rms, then momentum (if the name says so), then the mean
        # gradient (centered)
        rest = list(slots[1:])
        mom_slot = rest.pop(0) if "momentum" in algorithm else None
        mg_slot = rest.pop(0) if "centered" in algorithm else None
        ms = rho * slots[0] + (1 - rho) * g * g
        after_root = keras_v2 and mom_slot is None
        new, denom = [ms], ms if after_root else ms + eps
        if mg_slot is not None:
            mg = rho * mg_slot + (1 - rho) * g
            denom = denom - mg * mg
        inc = lr * g / (np.sqrt(denom) + eps) if after_root else lr * g / np.sqrt(denom)
        if mom_slot is not None:
            inc = mom * mom_slot + inc
            new.append(inc)
        if mg_slot is not None:
            new.append(mg)
        return w - inc, new
    if algorithm == "adadelta":
        acc = rho * slots[0] + (1 - rho) * g * g
        upd = np.sqrt(slots[1] + eps) / np.sqrt(acc + eps) * g
        return w - lr * upd, [acc, rho * slots[1] + (1 - rho) * upd * upd]
    if algorithm == "adamax":
        m = b1 * slots[0] + (1 - b1) * g
        u = np.maximum(b2 * slots[1], np.abs(g))
        return w - lr / (1 - b1 ** step) * m / (u + eps), [m, u]
    p = -lr_power
    acc, lin = slots
    new_acc = acc + g * g
    lin = lin + g + 2 * shrink * w - (new_acc ** p - acc ** p) / lr * w
    quad = new_acc ** p / lr + 2 * (l2 + beta / (2 * lr))
    return (np.clip(lin, -l1, l1) - lin) / quad, [new_acc, lin]


def slot_count(algorithm):
    return {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2, "ftrl": 2, "rmsprop": 1,
            "rmsprop_momentum": 2, "rmsprop_centered": 2, "rmsprop_momentum_centered": 3,
            "adadelta": 2, "adamax": 2}[algorithm]
