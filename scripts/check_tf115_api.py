"""Static check that sok_graph's graph-mode Python stays valid on TensorFlow 1.15.

    python3 scripts/check_tf115_api.py            # check; exit 1 on any violation
    python3 scripts/check_tf115_api.py --list     # also list every TF symbol used and its status

TF 1.15 needs Python <= 3.7 and cannot run here, so nothing is imported: the
checker reads the source with `ast` and TF 1.15's API from the .py files of
its wheel (scripts/tf115_wheel.py fetches and unpacks them once). Checked, for
every .py file under sok_graph/ (sok_graph/compat/ included), examples_tf1/ and
sparse_operation_kit/ (or the paths given):

1. TensorFlow symbols. Every attribute chain rooted at a TensorFlow import
   (`tf.compat.v1.train.Saver`, `tf1.nn.embedding_lookup_sparse` after
   `import tensorflow.compat.v1 as tf1`, `from tensorflow.python.ops import
   resource_variable_ops` ...) is resolved the way Python would resolve it in
   TF 1.15: through the generated `_api/v1/**/__init__.py` modules of the
   public API (plus `tf.keras` from `python/keras/api/_v1` and `tf.estimator`
   from tensorflow_estimator 1.15.1, which TF 1.15 hooks in), down to the
   module, function or class that defines it. A name that is missing anywhere
   on the way is a violation. Attributes of classes are looked up in the class
   and its bases (only flagged when every base was found). When a call's target
   is a Python function or class of TF 1.15, its keyword arguments and the
   number of positional arguments are checked against that definition.
   `getattr(x, "name", default)` and `hasattr(x, "name")` are feature tests:
   the name is not required to exist.

2. Python 3.7 syntax. `ast.parse(..., feature_version=(3, 7))` plus what that
   flag does not catch: unparenthesized `*x` in return/yield tuples (3.8),
   `continue` in `finally` (3.8), decorators that are not a dotted name or a
   call of one (3.9), `*x` in subscripts (3.11), `X | Y` and builtin generics
   (`list[int]`) in annotations that 3.7 evaluates at runtime (parameters,
   returns, module and class level) unless `from __future__ import
   annotations`, and a list of standard-library names, keyword arguments and
   methods added after 3.7 (functools.cache, zip(strict=), str.removeprefix,
   ...; known additions, not every one).

3. Public definitions that depend on the TF version: a public module- or
   class-level function or class defined inside a version-switched branch
   must be defined with the same parameters in the other branch, or the API
   would differ on TF 1.15.

The version switch. A TF use that exists only in TF 2.x is allowed where TF
1.x never executes it, which the checker recognises in exactly these forms,
`IS_TF1` being the flag of sok_graph.compat (`compat.IS_TF1`,
`from .compat import IS_TF1`, or `IS_TF1` inside compat itself):

    if not compat.IS_TF1:      # body: TF 2.x only (also `if x and not IS_TF1`)
    if compat.IS_TF1: ... else: ...        # else branch: TF 2.x only
    a if compat.IS_TF1 else b              # b: TF 2.x only
    if compat.IS_TF1:                      # a branch that always ends in
        return/raise ...                   # return/raise/continue/break makes
    <rest of the block>                    # the rest of the block TF 2.x only

and, for anything else, a comment on the line of the use:

    x = tf.something_new()  # tf2-only: <why TF 1.x never reaches this line>

The reason is required. A marker on a line without a violation is itself a
violation (a stale marker), so the allowlist cannot outgrow the code.
"""

import argparse
import ast
import io
import os
import re
import sys
import tokenize

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tf115_wheel  # next to this script

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_PATHS = ("sok_graph", "examples_tf1", "sparse_operation_kit")
MARKER_RE = re.compile(r"#\s*tf2-only:(.*)$")
SWITCH_FLAG = "IS_TF1"
TF_ROOTS = ("tensorflow", "tensorflow_core", "tensorflow_estimator")


# ---------------------------------------------------------------------------
# TF 1.15's Python, as a tree of modules read from the unpacked wheel
# ---------------------------------------------------------------------------


class _Missing:
    def __init__(self, reason):
        self.reason = reason


UNKNOWN = object()  # exists, but what it holds is not modelled (values, C extensions, ...)
OBJECT = object()  # the builtin `object` base class


class Module:
    def __init__(self, dotted, path, is_package, tree):
        self.dotted = dotted
        self.path = path
        self.is_package = is_package
        self.bindings = {}  # name -> list of binding tuples
        self.star_imports = []
        self.has_getattr = False
        self.extends_path = False  # assigns __path__, as TF's API packages do
        self.patches = []  # (path of a submodule, name) this module sets on it
        if tree is not None:
            _scan_module(self, tree.body)


class Definition:
    """A `def` or `class` of TF 1.15, with the module it lives in."""

    def __init__(self, node, module, owner=None):
        self.node = node
        self.module = module
        self.owner = owner  # the Definition of the class a method belongs to

    @property
    def is_class(self):
        return isinstance(self.node, ast.ClassDef)


def _bind(module, name, binding):
    module.bindings.setdefault(name, []).append(binding)


def _abs_module(module, level, name):
    """The absolute module a `from <dots><name> import` in `module` means."""
    if not level:
        return name
    parts = module.dotted.split(".")
    if not module.is_package:
        parts = parts[:-1]
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts + ([name] if name else []))


def _scan_module(module, stmts):
    """Records the names a module's top level binds, through if/try/with/for
    blocks (TF guards many imports with try) but not into functions."""
    for st in stmts:
        if isinstance(st, ast.ImportFrom):
            src = _abs_module(module, st.level, st.module or "")
            for a in st.names:
                if a.name == "*":
                    module.star_imports.append(src)
                else:
                    _bind(module, a.asname or a.name, ("import", src, a.name))
        elif isinstance(st, ast.Import):
            for a in st.names:
                if a.asname:
                    _bind(module, a.asname, ("module", a.name))
                else:
                    top = a.name.split(".")[0]
                    _bind(module, top, ("module", top))
        elif isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            _bind(module, st.name, ("def", st))
            if st.name == "__getattr__":
                module.has_getattr = True
        elif isinstance(st, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = st.targets if isinstance(st, ast.Assign) else [st.target]
            value = st.value
            if any((isinstance(t, ast.Name) and t.id == "__path__")
                   or (isinstance(t, ast.Attribute) and t.attr == "__path__") for t in targets):
                module.extends_path = True
            for t in targets:
                # `_current_module.app.flags = flags`: TF's API modules set
                # attributes of their submodules this way.
                chain = _chain(t) if isinstance(t, ast.Attribute) else None
                if chain and chain[0] == "_current_module" and len(chain) > 2:
                    module.patches.append((tuple(chain[1:-1]), chain[-1]))
            for t in targets:
                for n in _target_names(t):
                    if isinstance(t, ast.Name) and isinstance(value, (ast.Name, ast.Attribute)):
                        _bind(module, n, ("expr", value))
                    else:
                        _bind(module, n, ("value",))
        elif isinstance(st, ast.Expr) and isinstance(st.value, ast.Call):
            call = st.value
            # setattr(_current_module, "estimator", estimator): how the API
            # modules attach tf.estimator, tf.keras and tf.flags.
            if (isinstance(call.func, ast.Name) and call.func.id == "setattr"
                    and len(call.args) == 3 and isinstance(call.args[1], ast.Constant)
                    and isinstance(call.args[1].value, str)):
                value = call.args[2]
                if isinstance(value, (ast.Name, ast.Attribute)):
                    _bind(module, call.args[1].value, ("expr", value))
                else:
                    _bind(module, call.args[1].value, ("value",))
        for field in ("body", "orelse", "finalbody"):
            if isinstance(st, (ast.If, ast.Try, ast.With, ast.For, ast.While)):
                _scan_module(module, getattr(st, field, []) or [])
        if isinstance(st, ast.Try):
            for h in st.handlers:
                _scan_module(module, h.body)
        if isinstance(st, (ast.For, ast.With)):
            targets = [st.target] if isinstance(st, ast.For) else [
                i.optional_vars for i in st.items if i.optional_vars is not None]
            for t in targets:
                for n in _target_names(t):
                    _bind(module, n, ("value",))


def _target_names(t):
    if isinstance(t, ast.Name):
        return [t.id]
    if isinstance(t, (ast.Tuple, ast.List)):
        return [n for e in t.elts for n in _target_names(e)]
    if isinstance(t, ast.Starred):
        return _target_names(t.value)
    return []


def _last_name(expr):
    if isinstance(expr, ast.Call):
        expr = expr.func
    if isinstance(expr, ast.Attribute):
        return expr.attr
    if isinstance(expr, ast.Name):
        return expr.id
    return None


# Decorators TF 1.15 puts on its API functions that keep the signature; a
# function with any other decorator is not signature-checked.
_SIGNATURE_KEEPING_DECORATORS = {
    "tf_export", "estimator_export", "keras_export", "deprecated", "deprecated_args",
    "deprecated_arg_values", "deprecated_endpoints", "deprecated_alias",
    "add_dispatch_support", "add_dispatch_list", "_binary_assert_doc", "_unary_assert_doc",
    "classmethod", "staticmethod", "contextmanager",
    "do_not_generate_docs", "do_not_doc_inheritable", "doc_private", "docs_private",
    "for_subclass_implementers", "should_use_result", "abstractmethod",
    "wraps",  # functools.wraps returns the decorated def itself
}


def _is_abcmeta(expr):
    return _last_name(expr) == "ABCMeta"


def _plain_class(node):
    """Whether the class's attributes are what its body and bases define: no
    metaclass other than abc.ABCMeta, no decorator but TF's export and
    documentation markers (which return the class unchanged)."""
    for kw in node.keywords:
        if not (kw.arg == "metaclass" and _is_abcmeta(kw.value)):
            return False
    for d in node.decorator_list:
        name = _last_name(d)
        if name == "add_metaclass":
            if not (isinstance(d, ast.Call) and len(d.args) == 1 and _is_abcmeta(d.args[0])):
                return False
        elif name not in _SIGNATURE_KEEPING_DECORATORS:
            return False
    return True


class Tf115Api:
    """Resolves dotted TensorFlow names as TF 1.15's Python would."""

    def __init__(self, root):
        self.root = root
        self._modules = {}
        self._active = set()
        self.known_files = set()
        for name in os.listdir(root):
            if name.endswith(".files"):
                with open(os.path.join(root, name)) as f:
                    self.known_files.update(line.strip() for line in f if line.strip())

    # -- modules ---------------------------------------------------------
    def module(self, dotted):
        """The module `import dotted` gives in TF 1.15: a Module, UNKNOWN for
        modules outside TensorFlow and C extensions, or None when there is no
        such module. Like Python's import system, a submodule is looked for in
        its parent package's directory, and in the directories TF's API
        packages add to their __path__ (tf.keras, tf.estimator, tf.nn ...)."""
        if dotted.split(".")[0] not in TF_ROOTS:
            return UNKNOWN
        if dotted in self._modules:
            return self._modules[dotted]
        self._modules[dotted] = None  # a cycle resolves to "not found"
        if "." not in dotted:
            # The `tensorflow` pip package forwards everything to tensorflow_core.
            found = self._load("tensorflow_core" if dotted == "tensorflow" else dotted, dotted)
        else:
            parent_name, last = dotted.rsplit(".", 1)
            parent = self.module(parent_name)
            if parent is None or parent is UNKNOWN:
                found = parent
            else:
                found = None
                if parent.is_package:
                    found = self._load(os.path.dirname(parent.path) + "/" + last, dotted)
                if found is None and parent.extends_path:
                    r = self._module_attr(parent, last, 0)
                    if isinstance(r, Module) or r is UNKNOWN:
                        found = r
        self._modules[dotted] = found
        return found

    def _load(self, rel, dotted):
        for path, is_package in ((rel + "/__init__.py", True), (rel + ".py", False)):
            full = os.path.join(self.root, path)
            if os.path.isfile(full):
                with open(full, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), full)
                return Module(dotted, path, is_package, tree)
        if any(n.startswith(rel + ".") and n.endswith(".so") and "/" not in n[len(rel):]
               for n in self.known_files):
            return UNKNOWN  # a C extension module
        return None

    # -- attribute lookup ------------------------------------------------
    def attr(self, obj, name, depth=0):
        """obj.name in TF 1.15: a Module, Definition, UNKNOWN, or _Missing."""
        if depth > 40:
            return UNKNOWN
        if obj is UNKNOWN or obj is OBJECT:
            return UNKNOWN
        if isinstance(obj, Module):
            return self._module_attr(obj, name, depth)
        if isinstance(obj, Definition):
            if obj.is_class:
                return self._class_attr(obj, name, depth, set())
            return UNKNOWN  # attributes of functions are not modelled
        return UNKNOWN

    def _module_attr(self, mod, name, depth):
        key = (mod.dotted, name)
        if key in self._active:
            # Asked again while resolving it: a module importing its own
            # submodule (`from tensorflow._api.v1.compat.v1 import math` in
            # compat/v1/__init__.py) or a cycle of aliases. Not through here.
            return _Missing("%s.%s refers to itself" % (_public_name(mod.dotted), name))
        if depth > 60:
            return UNKNOWN
        self._active.add(key)
        try:
            return self._module_attr_uncached(mod, name, depth)
        finally:
            self._active.discard(key)

    def _module_attr_uncached(self, mod, name, depth):
        results = [self._resolve_binding(mod, b, depth) for b in mod.bindings.get(name, [])]
        for r in results:
            if not isinstance(r, _Missing):
                return r
        if mod.is_package:
            sub = self.module(mod.dotted + "." + name)
            if sub is not None:
                return sub
        for src in mod.star_imports:
            star = self.module(src)
            if star is None:
                continue
            r = self.attr(star, name, depth + 1)
            if not isinstance(r, _Missing):
                return r
        if mod.has_getattr:
            return UNKNOWN
        for other in list(self._modules.values()):
            for path, patched in getattr(other, "patches", ()):
                if patched != name:
                    continue
                target = other
                for part in path:
                    target = self.attr(target, part, depth + 1)
                if isinstance(target, Module) and target.path == mod.path:
                    return UNKNOWN
        if results:
            return results[0]
        return _Missing("module %s has no attribute %r" % (_public_name(mod.dotted), name))

    def _resolve_binding(self, mod, binding, depth):
        kind = binding[0]
        if kind == "import":
            return self.import_from(binding[1], binding[2], depth + 1)
        if kind == "module":
            m = self.module(binding[1])
            return m if m is not None else _Missing("module %s does not exist" % binding[1])
        if kind == "def":
            return Definition(binding[1], mod)
        if kind == "expr":
            return self.eval_in_module(mod, binding[1], depth + 1)
        return UNKNOWN

    def eval_in_module(self, mod, expr, depth=0):
        """A Name or attribute chain evaluated in the namespace of `mod`."""
        chain = _chain(expr)
        if chain is None:
            return UNKNOWN
        if chain[0] == "object" and len(chain) == 1 and "object" not in mod.bindings:
            return OBJECT
        obj = self._module_attr(mod, chain[0], depth + 1) if chain[0] in mod.bindings else UNKNOWN
        for part in chain[1:]:
            if isinstance(obj, _Missing):
                return obj
            obj = self.attr(obj, part, depth + 1)
        return obj

    def _class_attr(self, cls, name, depth, seen):
        if id(cls.node) in seen:
            return UNKNOWN
        seen.add(id(cls.node))
        for st in cls.node.body:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and st.name == name:
                return Definition(st, cls.module, owner=cls)
            if isinstance(st, (ast.Assign, ast.AnnAssign)):
                targets = st.targets if isinstance(st, ast.Assign) else [st.target]
                if any(name in _target_names(t) for t in targets):
                    return UNKNOWN
        if not _plain_class(cls.node):
            return UNKNOWN  # a metaclass or class decorator may add attributes
        for base in cls.node.bases:
            if (isinstance(base, ast.Call) and _last_name(base.func) == "with_metaclass"
                    and len(base.args) == 2 and _is_abcmeta(base.args[0])):
                base = base.args[1]  # six.with_metaclass(abc.ABCMeta, Base)
            b = self.eval_in_module(cls.module, base, depth + 1)
            if b is OBJECT:
                continue
            if not (isinstance(b, Definition) and b.is_class):
                return UNKNOWN
            r = self._class_attr(b, name, depth + 1, seen)
            if not isinstance(r, _Missing):
                return r
        if name.startswith("__") and name.endswith("__"):
            return UNKNOWN
        return _Missing("class %s has no attribute %r" % (cls.node.name, name))

    # -- dotted names and calls -------------------------------------------
    def import_from(self, src, name, depth=0):
        """What `from src import name` binds: the attribute, else the submodule."""
        base = self.module(src)
        if base is None:
            return _Missing("no module %s" % _public_name(src))
        if base is UNKNOWN:
            return UNKNOWN
        # Python tries the attribute first and then the submodule; TF's API
        # packages import their own submodules, so the file is looked for first.
        if base.is_package:
            sub = self._load(os.path.dirname(base.path) + "/" + name, src + "." + name)
            if sub is not None:
                return sub
        r = self.attr(base, name, depth + 1)
        if isinstance(r, _Missing):
            sub = self.module(src + "." + name)
            if sub is not None:
                return sub
        return r

    def resolve_use(self, origin, parts):
        """(object, None) or (None, reason) for attribute `parts` of what
        `origin` binds: ("import", "a.b") or ("from", "a.b", "c")."""
        if origin[0] == "import":
            obj = self.module(origin[1])
            if obj is None:
                return None, "no module %s" % _public_name(origin[1])
        else:
            obj = self.import_from(origin[1], origin[2])
        for part in parts:
            if isinstance(obj, _Missing):
                break
            obj = self.attr(obj, part)
        if isinstance(obj, _Missing):
            return None, obj.reason
        return obj, None

    def resolve(self, dotted):
        """resolve_use for `import <first>` followed by the attributes `dotted` names."""
        parts = dotted.split(".")
        return self.resolve_use(("import", parts[0]), parts[1:])

    def call_problems(self, obj, call):
        """What is wrong with `call` (an ast.Call) as a call of `obj` in TF 1.15."""
        if not isinstance(obj, Definition):
            return []
        drop_first = False
        func = obj
        if obj.is_class:
            init = self._class_attr(obj, "__init__", 0, set())
            if not isinstance(init, Definition) or not _plain_class(obj.node):
                return []
            func, drop_first = init, True
        elif obj.owner is not None:
            decorators = {_last_name(d) for d in obj.node.decorator_list}
            drop_first = "classmethod" in decorators
        node = func.node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return []
        if any(_last_name(d) not in _SIGNATURE_KEEPING_DECORATORS for d in node.decorator_list):
            return []
        args = node.args
        positional = [a.arg for a in getattr(args, "posonlyargs", []) + args.args]
        if drop_first:
            positional = positional[1:]
        names = set(positional) | {a.arg for a in args.kwonlyargs}
        problems = []
        n_pos = len(call.args)
        if (args.vararg is None and not any(isinstance(a, ast.Starred) for a in call.args)
                and n_pos > len(positional)):
            problems.append("takes at most %d positional arguments in TF 1.15, %d given"
                            % (len(positional), n_pos))
        if args.kwarg is None:
            for kw in call.keywords:
                if kw.arg is not None and kw.arg not in names:
                    problems.append("has no parameter %r in TF 1.15" % kw.arg)
        return problems


def _public_name(dotted):
    for private, public in (("tensorflow._api.v1.", "tensorflow."), ("tensorflow_core.", "tensorflow.")):
        if dotted.startswith(private):
            return public + dotted[len(private):]
    return dotted


def _chain(expr):
    """['a', 'b', 'c'] for the expression a.b.c, else None."""
    parts = []
    while isinstance(expr, ast.Attribute):
        parts.append(expr.attr)
        expr = expr.value
    if not isinstance(expr, ast.Name):
        return None
    parts.append(expr.id)
    return parts[::-1]


# ---------------------------------------------------------------------------
# The version switch
# ---------------------------------------------------------------------------


def _is_flag(test):
    return (isinstance(test, ast.Name) and test.id == SWITCH_FLAG) or (
        isinstance(test, ast.Attribute) and test.attr == SWITCH_FLAG)


def body_is_tf2_only(test):
    """True when `test` holding implies TF 2.x."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return orelse_is_tf2_only(test.operand)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(body_is_tf2_only(v) for v in test.values)
    return False


def orelse_is_tf2_only(test):
    """True when `test` failing implies TF 2.x."""
    if _is_flag(test):
        return True
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return body_is_tf2_only(test.operand)
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return any(orelse_is_tf2_only(v) for v in test.values)
    return False


def body_is_tf1_only(test):
    return orelse_is_tf2_only(test)


def _always_exits(stmts):
    return bool(stmts) and isinstance(stmts[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break))


# ---------------------------------------------------------------------------
# One file: TF uses, syntax, version-dependent public definitions
# ---------------------------------------------------------------------------


class Use:
    def __init__(self, line, origin, parts, call=None, tf2_only=False):
        self.line = line
        self.origin = origin
        self.parts = parts
        self.call = call
        self.tf2_only = tf2_only

    @property
    def dotted(self):
        return ".".join(list(self.origin[1:]) + list(self.parts))


class _UseCollector:
    """Walks a file twice with the same notion of TF-2-only code: first to
    collect what each local name binds (imports and `x = tf.a.b`), then to
    record every use of those names. A name keeps every binding it gets, each
    with whether it sits in TF-2-only code; a use is checked against each
    binding TF 1.x can reach."""

    def __init__(self, tree):
        self.aliases = {}  # name -> [(origin, parts, tf2_only)]
        self.uses = []
        self.binding_pass = True
        for _ in range(10):  # aliases of aliases, to a fixed point
            before = {k: list(v) for k, v in self.aliases.items()}
            self.block(tree.body, False)
            if before == self.aliases:
                break
        self.binding_pass = False
        self.block(tree.body, False)

    def _bind(self, name, origin, parts, tf2):
        entry = (origin, tuple(parts), tf2)
        bindings = self.aliases.setdefault(name, [])
        if entry not in bindings:
            bindings.append(entry)

    def _uses(self, expr, line, call=None, tf2=False, extra=()):
        """Uses for `expr` when it is a chain rooted at a TensorFlow name:
        one per binding of the root that TF 1.x can reach."""
        chain = _chain(expr)
        if not chain or chain[0] not in self.aliases:
            return []
        bindings = self.aliases[chain[0]]
        reachable = [b for b in bindings if not b[2]] or bindings
        return [Use(line, origin, tuple(parts) + tuple(chain[1:]) + tuple(extra), call,
                    tf2 or bound_tf2)
                for origin, parts, bound_tf2 in reachable]

    def _record(self, uses):
        if not self.binding_pass:
            self.uses.extend(uses)

    def block(self, stmts, tf2):
        for st in stmts:
            self.visit(st, tf2)
            if (isinstance(st, ast.If) and not st.orelse and body_is_tf1_only(st.test)
                    and _always_exits(st.body)):
                tf2 = True  # `if IS_TF1: return ...` - the rest runs on TF 2.x only

    def visit(self, node, tf2):
        if isinstance(node, (ast.If, ast.IfExp)):
            self.visit(node.test, tf2)
            body_tf2 = tf2 or body_is_tf2_only(node.test)
            else_tf2 = tf2 or orelse_is_tf2_only(node.test)
            if isinstance(node, ast.If):
                self.block(node.body, body_tf2)
                self.block(node.orelse, else_tf2)
            else:
                self.visit(node.body, body_tf2)
                self.visit(node.orelse, else_tf2)
            return
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] in TF_ROOTS:
                    self._record([Use(node.lineno, ("import", a.name), (), tf2_only=tf2)])
                    if a.asname:
                        self._bind(a.asname, ("import", a.name), (), tf2)
                    else:
                        top = a.name.split(".")[0]
                        self._bind(top, ("import", top), (), tf2)
            return
        if isinstance(node, ast.ImportFrom):
            if not node.level and node.module and node.module.split(".")[0] in TF_ROOTS:
                for a in node.names:
                    if a.name == "*":
                        self._record([Use(node.lineno, ("import", node.module), (), tf2_only=tf2)])
                        continue
                    origin = ("from", node.module, a.name)
                    self._record([Use(node.lineno, origin, (), tf2_only=tf2)])
                    self._bind(a.asname or a.name, origin, (), tf2)
            return
        if (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            for use in self._uses(node.value, node.lineno, tf2=tf2):
                self._bind(node.targets[0].id, use.origin, use.parts, use.tf2_only)
        if isinstance(node, ast.Call):
            fn = node.func
            if (isinstance(fn, ast.Name) and fn.id in ("getattr", "hasattr") and node.args
                    and self._uses(node.args[0], node.lineno)):
                name_arg = node.args[1] if len(node.args) > 1 else None
                extra = ()
                if (fn.id == "getattr" and len(node.args) == 2 and isinstance(name_arg, ast.Constant)
                        and isinstance(name_arg.value, str)):
                    # getattr without a default is an ordinary attribute access.
                    extra = (name_arg.value,)
                self._record(self._uses(node.args[0], node.lineno, tf2=tf2, extra=extra))
                for a in node.args[1:]:
                    self.visit(a, tf2)
                return
            uses = self._uses(fn, fn.lineno, call=node, tf2=tf2)
            if uses:
                self._record(uses)
                for a in node.args:
                    self.visit(a, tf2)
                for k in node.keywords:
                    self.visit(k.value, tf2)
                return
        if isinstance(node, (ast.Attribute, ast.Name)):
            uses = self._uses(node, node.lineno, tf2=tf2)
            if uses:
                if isinstance(node, ast.Attribute) or isinstance(node.ctx, ast.Load):
                    self._record(uses)
                return
        for field, value in ast.iter_fields(node):
            if isinstance(value, list):
                if value and isinstance(value[0], ast.stmt):
                    self.block(value, tf2)
                else:
                    for v in value:
                        if isinstance(v, ast.AST):
                            self.visit(v, tf2)
            elif isinstance(value, ast.AST):
                self.visit(value, tf2)


# -- Python 3.7 -------------------------------------------------------------

# Standard-library names newer than Python 3.7, by module.
_NEW_STDLIB_NAMES = {
    "functools": {"cache": "3.9", "cached_property": "3.8", "singledispatchmethod": "3.8"},
    "math": {"prod": "3.8", "isqrt": "3.8", "dist": "3.8", "comb": "3.8", "perm": "3.8",
             "lcm": "3.9", "nextafter": "3.9", "ulp": "3.9", "cbrt": "3.11", "exp2": "3.11"},
    "itertools": {"pairwise": "3.10"},
    "shlex": {"join": "3.8"},
    "statistics": {"fmean": "3.8", "geometric_mean": "3.8", "multimode": "3.8",
                   "quantiles": "3.8", "NormalDist": "3.8"},
    "threading": {"get_native_id": "3.8", "excepthook": "3.8"},
    "random": {"randbytes": "3.9"},
    "os": {"waitstatus_to_exitcode": "3.9", "pidfd_open": "3.9", "memfd_create": "3.8"},
    "sys": {"unraisablehook": "3.8", "orig_argv": "3.10", "stdlib_module_names": "3.10"},
    "contextlib": {"aclosing": "3.10", "chdir": "3.11"},
    "asyncio": {"to_thread": "3.9", "timeout": "3.11", "TaskGroup": "3.11"},
    "ast": {"unparse": "3.9"},
    "enum": {"StrEnum": "3.11"},
    "typing": {n: "3.8" for n in ("Literal", "Final", "Protocol", "TypedDict", "get_origin",
                                  "get_args", "runtime_checkable", "SupportsIndex", "final")},
}
_NEW_STDLIB_NAMES["typing"].update({n: "3.9" for n in ("Annotated",)})
_NEW_STDLIB_NAMES["typing"].update({n: "3.10" for n in ("ParamSpec", "Concatenate", "TypeAlias",
                                                         "TypeGuard", "is_typeddict")})
_NEW_STDLIB_NAMES["typing"].update({n: "3.11" for n in ("Self", "Never", "LiteralString",
                                                         "assert_never", "reveal_type", "Required",
                                                         "NotRequired", "Unpack", "TypeVarTuple")})
_NEW_STDLIB_MODULES = {"importlib.metadata": "3.8", "zoneinfo": "3.9", "graphlib": "3.9",
                       "tomllib": "3.11"}
_NEW_METHODS = {"removeprefix": "3.9", "removesuffix": "3.9", "bit_count": "3.10",
                "is_relative_to": "3.9", "with_stem": "3.9", "hardlink_to": "3.10"}
# (callable's last name, keyword) -> version
_NEW_KEYWORDS = {("zip", "strict"): "3.10", ("unlink", "missing_ok"): "3.8",
                 ("copytree", "dirs_exist_ok"): "3.8", ("shutdown", "cancel_futures"): "3.9",
                 ("dataclass", "slots"): "3.10", ("dataclass", "kw_only"): "3.10",
                 ("TemporaryDirectory", "ignore_cleanup_errors"): "3.10",
                 ("basicConfig", "force"): "3.8", ("bisect", "key"): "3.10",
                 ("bisect_left", "key"): "3.10", ("bisect_right", "key"): "3.10",
                 ("insort", "key"): "3.10"}
_BUILTIN_GENERICS = {"list", "dict", "tuple", "set", "frozenset", "type"}
_NEW_BUILTINS = {"aiter": "3.10", "anext": "3.10"}


def python37_problems(tree, src):
    """(line, message) for what Python 3.7 would reject in an already parsed file."""
    problems = []
    future_annotations = any(
        isinstance(n, ast.ImportFrom) and n.module == "__future__"
        and any(a.name == "annotations" for a in n.names) for n in tree.body)
    stdlib_alias = {}  # local name -> module it names
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in _NEW_STDLIB_MODULES:
                    problems.append((node.lineno, "module %s is new in Python %s"
                                     % (a.name, _NEW_STDLIB_MODULES[a.name])))
                if a.name in _NEW_STDLIB_NAMES:
                    stdlib_alias[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            for a in node.names:
                full = node.module + "." + a.name
                if node.module in _NEW_STDLIB_MODULES or full in _NEW_STDLIB_MODULES:
                    version = _NEW_STDLIB_MODULES.get(node.module) or _NEW_STDLIB_MODULES[full]
                    problems.append((node.lineno, "module %s is new in Python %s" % (full, version)))
                elif a.name in _NEW_STDLIB_NAMES.get(node.module, {}):
                    problems.append((node.lineno, "%s is new in Python %s"
                                     % (full, _NEW_STDLIB_NAMES[node.module][a.name])))

    def annotation_problems(ann):
        for sub in ast.walk(ann):
            if isinstance(sub, ast.BinOp) and isinstance(sub.op, ast.BitOr):
                yield sub.lineno, "`X | Y` annotation is evaluated at runtime and fails before Python 3.10"
            if (isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name)
                    and sub.value.id in _BUILTIN_GENERICS):
                yield sub.lineno, "`%s[...]` annotation is evaluated at runtime and fails before Python 3.9" % sub.value.id

    def runtime_annotations(stmts, in_function):
        for st in stmts:
            if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = st.args
                for arg in getattr(a, "posonlyargs", []) + a.args + a.kwonlyargs + [
                        x for x in (a.vararg, a.kwarg) if x is not None]:
                    if arg.annotation is not None:
                        yield arg.annotation
                if st.returns is not None:
                    yield st.returns
                yield from runtime_annotations(st.body, True)
            elif isinstance(st, ast.ClassDef):
                yield from runtime_annotations(st.body, False)
            elif isinstance(st, ast.AnnAssign) and not in_function:
                yield st.annotation
            else:
                for field in ("body", "orelse", "finalbody", "handlers"):
                    inner = getattr(st, field, None)
                    if isinstance(inner, list):
                        yield from runtime_annotations(
                            [x for h in inner for x in (h.body if isinstance(h, ast.ExceptHandler) else [h])],
                            in_function)

    if not future_annotations:
        for ann in runtime_annotations(tree.body, False):
            problems.extend(annotation_problems(ann))

    for node in ast.walk(tree):
        if isinstance(node, (ast.Return, ast.Yield)) and isinstance(node.value, ast.Tuple):
            seg = ast.get_source_segment(src, node.value) or ""
            if any(isinstance(e, ast.Starred) for e in node.value.elts) and not seg.startswith("("):
                problems.append((node.lineno, "unparenthesized `*x` in a return/yield tuple needs Python 3.8"))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            for d in node.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                if _chain(target) is None:
                    problems.append((d.lineno, "decorator that is not a dotted name needs Python 3.9"))
        if isinstance(node, ast.Subscript):
            sl = node.slice
            elts = sl.elts if isinstance(sl, ast.Tuple) else [sl]
            if any(isinstance(e, ast.Starred) for e in elts):
                problems.append((node.lineno, "`*x` in a subscript needs Python 3.11"))
        if isinstance(node, ast.Try):
            for sub in node.finalbody:
                for inner in _walk_same_loop(sub):
                    if isinstance(inner, ast.Continue):
                        problems.append((inner.lineno, "`continue` in `finally` needs Python 3.8"))
        if isinstance(node, ast.Attribute):
            chain = _chain(node)
            if chain and len(chain) == 2 and chain[0] in stdlib_alias:
                module = stdlib_alias[chain[0]]
                if chain[1] in _NEW_STDLIB_NAMES.get(module, {}):
                    problems.append((node.lineno, "%s.%s is new in Python %s"
                                     % (module, chain[1], _NEW_STDLIB_NAMES[module][chain[1]])))
        if isinstance(node, ast.Call):
            last = _last_name(node.func)
            if isinstance(node.func, ast.Attribute) and node.func.attr in _NEW_METHODS:
                problems.append((node.lineno, ".%s() is new in Python %s"
                                 % (node.func.attr, _NEW_METHODS[node.func.attr])))
            if isinstance(node.func, ast.Name) and node.func.id in _NEW_BUILTINS:
                problems.append((node.lineno, "%s() is new in Python %s"
                                 % (node.func.id, _NEW_BUILTINS[node.func.id])))
            for kw in node.keywords:
                if (last, kw.arg) in _NEW_KEYWORDS:
                    problems.append((node.lineno, "%s(%s=...) is new in Python %s"
                                     % (last, kw.arg, _NEW_KEYWORDS[(last, kw.arg)])))
    if sys.version_info >= (3, 12):
        problems.extend(_pep701_fstrings(tree, src))
    return problems


def _walk_same_loop(node):
    """Nodes under `node`, not descending into loops or functions (a continue
    there belongs to them, not to the enclosing finally)."""
    yield node
    if isinstance(node, (ast.For, ast.AsyncFor, ast.While, ast.FunctionDef,
                         ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        for st in getattr(node, "orelse", []):
            yield from _walk_same_loop(st)
        return
    for child in ast.iter_child_nodes(node):
        yield from _walk_same_loop(child)


def _pep701_fstrings(tree, src):
    """On a Python >= 3.12 parser: f-strings that reuse their own quote inside
    a replacement field, which only PEP 701 allows."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.JoinedStr):
            continue
        seg = ast.get_source_segment(src, node) or ""
        m = re.match(r"[rRfFbBuU]*('''|\"\"\"|'|\")", seg)
        if not m:
            continue
        quote = m.group(1)
        inner = seg[m.end():len(seg) - len(quote)]
        depth, i = 0, 0
        while i < len(inner):
            ch = inner[i]
            if ch == "{" and depth == 0 and inner[i + 1:i + 2] == "{":
                i += 2
                continue
            if ch == "{":
                depth += 1
            elif ch == "}" and depth:
                depth -= 1
            elif depth and (inner.startswith(quote, i) or ch == "\\"):
                out.append((node.lineno, "f-string reusing its quotes or a backslash inside {} needs Python 3.12"))
                break
            i += 1
    return out


# -- version-dependent public definitions -------------------------------------


def version_dependent_definitions(tree):
    """(line, message) for public functions/classes whose definition differs
    between the TF 1.x and TF 2.x branches of a version switch."""
    problems = []

    def signature(node):
        if isinstance(node, ast.ClassDef):
            return tuple(sorted((n.name, ast.dump(n.args)) for n in node.body
                                if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                and (not n.name.startswith("_") or n.name == "__init__")))
        return ast.dump(node.args)

    def defs(stmts):
        return {st.name: st for st in stmts
                if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                and not st.name.startswith("_")}

    def scan(stmts):
        for st in stmts:
            if isinstance(st, ast.ClassDef):
                scan(st.body)
            if not isinstance(st, ast.If):
                continue
            if body_is_tf2_only(st.test) or orelse_is_tf2_only(st.test):
                a, b = defs(st.body), defs(st.orelse)
                for name in sorted(set(a) | set(b)):
                    node = a.get(name) or b.get(name)
                    if name not in a or name not in b:
                        problems.append((node.lineno, "public %r is defined for only one TF "
                                         "major version" % name))
                    elif signature(a[name]) != signature(b[name]):
                        problems.append((b[name].lineno, "public %r has different parameters on "
                                         "TF 1.x and TF 2.x" % name))
            scan(st.body)
            scan(st.orelse)

    scan(tree.body)
    return problems


# ---------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------


class Report:
    def __init__(self):
        self.violations = []  # (path, line, kind, message)
        self.symbols = {}  # dotted -> [status, first location, count]

    def add(self, path, line, kind, message):
        self.violations.append((path, line, kind, message))


def _markers(src):
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            m = MARKER_RE.search(tok.string)
            if m:
                out[tok.start[0]] = m.group(1).strip()
    return out


def check_file(path, display, api, report):
    with open(path, encoding="utf-8") as f:
        src = f.read()
    try:
        tree = ast.parse(src, display, feature_version=(3, 7))
    except SyntaxError as e:
        report.add(display, e.lineno or 0, "python3.7", e.msg)
        return
    for line, message in python37_problems(tree, src):
        report.add(display, line, "python3.7", message)
    for line, message in version_dependent_definitions(tree):
        report.add(display, line, "api-by-version", message)

    markers = _markers(src)
    collector = _UseCollector(tree)
    needed_markers = set()
    seen = set()
    for use in collector.uses:
        entry = report.symbols.setdefault(use.dotted, [set(), "%s:%d" % (display, use.line), 0])
        entry[2] += 1
        if use.tf2_only:
            entry[0].add("tf2-branch")
            continue
        obj, reason = api.resolve_use(use.origin, use.parts)
        if reason is not None:
            problems = ["%s: not in TF 1.15 (%s)" % (_public_name(use.dotted), reason)]
        elif use.call is not None:
            problems = ["%s %s" % (_public_name(use.dotted), p)
                        for p in api.call_problems(obj, use.call)]
        else:
            problems = []
        if not problems:
            entry[0].add("ok")
        elif markers.get(use.line):
            entry[0].add("tf2-marker")
            needed_markers.add(use.line)
        else:
            entry[0].add("MISSING" if reason else "BAD-CALL")
            for p in problems:
                if (use.line, p) not in seen:
                    seen.add((use.line, p))
                    report.add(display, use.line, "tf115-api", p)
    for line, reason in sorted(markers.items()):
        if not reason:
            report.add(display, line, "marker", "`# tf2-only:` needs a reason after the colon")
        elif line not in needed_markers:
            report.add(display, line, "marker",
                       "stale `# tf2-only:` marker: nothing on this line needs it")


def python_files(paths):
    for p in paths:
        if os.path.isfile(p):
            yield p
            continue
        for dirpath, dirnames, filenames in os.walk(p):
            dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
            for name in sorted(filenames):
                if name.endswith(".py"):
                    yield os.path.join(dirpath, name)


def run(paths, api_root=None, list_symbols=False, out=sys.stdout, api=None):
    api = api or Tf115Api(api_root or tf115_wheel.python_dir())
    report = Report()
    files = list(python_files(paths))
    for path in files:
        display = os.path.relpath(path, REPO) if os.path.abspath(path).startswith(REPO + os.sep) else path
        check_file(path, display, api, report)
    if list_symbols:
        for dotted in sorted(report.symbols):
            statuses, where, count = report.symbols[dotted]
            out.write("%-20s %-62s %3d use(s), first at %s\n"
                      % ("+".join(sorted(statuses)), _public_name(dotted), count, where))
    for path, line, kind, message in sorted(report.violations):
        out.write("%s:%d: [%s] %s\n" % (path, line, kind, message))
    out.write("TF 1.15 API / Python 3.7 check: %d files, %d distinct TensorFlow symbols, "
              "%d violation(s)\n" % (len(files), len(report.symbols), len(report.violations)))
    return report


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="*", help="files or directories (default: %s)"
                        % ", ".join(DEFAULT_PATHS))
    parser.add_argument("--list", action="store_true", help="list every TensorFlow symbol used")
    parser.add_argument("--api-root", help="an unpacked TF 1.15 Python tree (default: the cached wheel)")
    args = parser.parse_args(argv)
    paths = args.paths or [os.path.join(REPO, p) for p in DEFAULT_PATHS if os.path.isdir(os.path.join(REPO, p))]
    report = run(paths, args.api_root, args.list)
    return 1 if report.violations else 0


if __name__ == "__main__":
    sys.exit(main())
