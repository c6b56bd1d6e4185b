"""The patches the strategy's scopes install: a registry that installs and
removes them, TensorFlow's own functions they replace, and binding a call to them.
"""

import inspect
import threading

# Patching: every patch is (owner, attribute, replacement); the original is
# put back when the last scope using it closes.



class _Patches:
    def __init__(self):
        self._lock = threading.RLock()
        self._depth = {}     # group -> open scopes
        self._saved = {}     # group -> [(owner, attr, original)]

    def enter(self, group, patches):
        with self._lock:
            depth = self._depth.get(group, 0)
            if depth == 0:
                saved = []
                for owner, attr, new in patches:
                    saved.append((owner, attr, getattr(owner, attr)))
                    setattr(owner, attr, new)
                self._saved[group] = saved
            self._depth[group] = depth + 1

    def exit(self, group):
        with self._lock:
            depth = self._depth.get(group, 0) - 1
            self._depth[group] = max(depth, 0)
            if depth == 0:
                for owner, attr, old in reversed(self._saved.pop(group, [])):
                    setattr(owner, attr, old)

    def active(self, group):
        return self._depth.get(group, 0) > 0


_PATCHES = _Patches()


def _tf_modules():
    from tensorflow.python.ops import embedding_ops, variable_scope
    from tensorflow.python.training import monitored_session, optimizer, training

    return embedding_ops, variable_scope, monitored_session, optimizer, training


def _norm_modules():
    """(clip_ops, the v1 loss scales' module or None): where the gradients'
    norms and finite checks that scope() makes span the workers live."""
    from tensorflow.python.ops import clip_ops
    try:
        from tensorflow.python.training.experimental import loss_scale
    except ImportError:
        loss_scale = None
    if not hasattr(loss_scale, "_is_all_finite"):
        loss_scale = None
    return clip_ops, loss_scale


def _originals():
    """TensorFlow's own functions (captured once, before any patch)."""
    global _ORIG
    if _ORIG is None:
        embedding_ops, variable_scope, monitored_session, optimizer, _ = _tf_modules()
        _ORIG = {
            "embedding_lookup": embedding_ops.embedding_lookup,
            "embedding_lookup_v2": embedding_ops.embedding_lookup_v2,
            "embedding_lookup_sparse": embedding_ops.embedding_lookup_sparse,
            "embedding_lookup_sparse_v2": embedding_ops.embedding_lookup_sparse_v2,
            "safe_embedding_lookup_sparse": embedding_ops.safe_embedding_lookup_sparse,
            "safe_embedding_lookup_sparse_v2": embedding_ops.safe_embedding_lookup_sparse_v2,
            "store_get_variable": variable_scope._VariableStore.get_variable,
            "compute_gradients": optimizer.Optimizer.compute_gradients,
            "MonitoredTrainingSession": monitored_session.MonitoredTrainingSession,
        }
        clip_ops, loss_scale = _norm_modules()
        _ORIG["global_norm"] = clip_ops.global_norm
        _ORIG["clip_by_norm"] = clip_ops.clip_by_norm
        if loss_scale is not None:
            _ORIG["is_all_finite"] = loss_scale._is_all_finite
    return _ORIG


_ORIG = None


def _bound(fn, args, kwargs):
    sig = inspect.signature(fn)
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    return bound.arguments
