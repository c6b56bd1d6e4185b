"""Admission filters of dynamic tables: which new keys get a row.

A DynamicVariable with a filter gives a key that it does not hold yet a row
only once the filter admits it. Until then a read of that key gives the
filter's default row, and the key's gradient is dropped: no update, no
optimizer slots, no row. Keys the table holds read and train as usual.
Every inserting read applies the filter: sparse_read, lookup_sparse, the
owner's side of a sharded lookup, sparse_read_and_evict.

Settings (DynamicVariable keyword arguments):
- filter_ratio=p, SOK's filter, in (0, 1]: applied when the lookup asks
  for it (lookup_sparse(..., use_low_frequency_filter=True)). A new key
  enters with probability p, decided per key and call by a hash of (key,
  the table's call count), so a run repeats itself exactly, on any device.
- min_count=n (an integer >= 1; 1: no counting): a new key enters in the
  call that brings its occurrences to n. Every occurrence counts, repeats
  within a batch included (DeepRec's counter filter). Counts are kept per
  key in a side table (exact; a key's count is dropped when it enters),
  or, with min_count_counters=m, in a count-min sketch of m counters in
  all, shared by its min_count_hashes hashes (default 3), that never holds
  more than that: a key counts at each of its hashes' counters (at one of
  them twice where two of its hashes meet), so colliding keys can make a
  key enter early, never late. Two reads of one table at once (a Session
  running lookup_sparse([v, v], ...), threads) add their counts under the
  table's lock; a key then enters in whichever call sees its count reach n.
- filter_default: the row (a number for every column) that keys not
  admitted read; 0.0 by default.

The counts are part of the table's state: sok.dump writes them next to the
rows and sok.load restores them (a dump without counts starts them afresh;
counts kept another way, exact or a sketch of another size, are refused);
for tables sharded over workers each worker counts the keys it owns (a
sketch dumps, counter by counter, the largest of its shards' counts, and
each shard loads those: a key's count can only be overestimated, and a dump
after a load writes the same counters). So is the call count that salts
filter_ratio's draws: a load goes on drawing where the dump left off (from
0 again, a restarted job would repeat its first calls' draws and turn the
same keys away). tf.train.Checkpoint saves both as well, as an object of
the table's (CheckpointState below, "admission"); a checkpoint written
without it (before the table had a filter) leaves them as they are. A
tf.compat.v1.train.Saver saves the rows its var_list names, not the
filter's state.

A known limit of the hash below: it mixes a key's 31-bit pieces modulo
2^31 - 1, so some pairs of keys hash alike under every salt (0 and 2^31 - 1,
2^31 and 2^32 - 1): in a sketch they count as one key (one may enter early,
never late), and filter_ratio draws them alike. Exact counts are per key.
"""

import contextlib
import json
import math
import threading
import weakref

import numpy as np
import tensorflow as tf

from sok_graph import compat
from sok_graph.tables import replica_shards
from sok_graph.tables.keras_weights import held_by
from sok_graph.initializers import initializer_spec
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.ops import util as util_ops

SETTINGS = ("filter_ratio", "min_count", "min_count_counters", "min_count_hashes",
            "filter_default")

# Hashing: keys are cut into 31-bit pieces and mixed modulo the Mersenne
# prime 2^31 - 1 with int64 products of two 31-bit numbers (exact in int64,
# so every device and TensorFlow version gives the same value).
_PRIME = (1 << 31) - 1
_MULTIPLIERS = (1103515245, 2147001325, 1664525013, 1013904223, 2027382509, 1597334677)


def _mix(value, multiplier):
    return tf.math.floormod(tf.math.floormod(value, _PRIME) * multiplier, _PRIME)


def key_hash(keys, salt):
    """int64 in [0, 2^31 - 1) for each key: a fixed function of (key, salt)."""
    k = tf.cast(keys, tf.int64)
    low = tf.bitwise.bitwise_and(k, _PRIME)
    middle = tf.bitwise.bitwise_and(tf.bitwise.right_shift(k, 31), _PRIME)
    high = tf.bitwise.bitwise_and(tf.bitwise.right_shift(k, 62), 3)
    salt = tf.cast(salt, tf.int64)
    h = (_mix(low, _MULTIPLIERS[0]) + _mix(middle, _MULTIPLIERS[1])
         + _mix(high + 1, _MULTIPLIERS[2]) + _mix(salt, _MULTIPLIERS[3]))
    h = _mix(h, _MULTIPLIERS[4])
    h = tf.bitwise.bitwise_xor(h, tf.bitwise.right_shift(h, 15))
    return _mix(h + salt, _MULTIPLIERS[5])


# The reads being built inside reads_in_order: {id(filter): its last
# call's admitted tensor}, per thread.
_ORDERED = threading.local()


@contextlib.contextmanager
def reads_in_order():
    """Inside, a graph's reads of one filtered table run in the order they
    are built (admitted says why): the reads of one lookup_sparse call,
    which are run together."""
    outer = getattr(_ORDERED, "calls", None)
    _ORDERED.calls = {} if outer is None else outer
    try:
        yield
    finally:
        _ORDERED.calls = outer


# The largest count the count tables (float32 rows) hold exactly.
_MAX_COUNT = 1 << 24

_INTEGER = ((int, np.integer), "an integer")
_NUMBER = ((int, float, np.number), "a finite number")


def _number(config, name, default, kind):
    value = config.get(name, default)
    types, what = kind
    if isinstance(value, bool) or not isinstance(value, types):
        raise ValueError(f"{name} must be {what}; got {value!r}")
    if kind is _INTEGER:
        return value  # finite; its range is the caller's check (10**400: "must be <= ...")
    try:
        # float() of an int beyond float64 (10**400) overflows: not finite.
        finite = math.isfinite(float(value))
    except (OverflowError, TypeError):
        finite = False
    if not finite:
        raise ValueError(f"{name} must be {what}; got {value!r}")
    return value


def checked_flag(value, name):
    """`value` as a bool, where it is one (or the integer 0 or 1): bool("False")
    is True, so a flag read from a config or command line as the string
    "False" turned the filter on, and keys were turned away."""
    if isinstance(value, (bool, np.bool_)) or (
            isinstance(value, (int, np.integer)) and value in (0, 1)):
        return bool(value)
    raise TypeError(f"{name} must be a bool; got {type(value).__name__} {value!r}")


def from_config(table_config):
    """The AdmissionFilter that DynamicVariable settings ask for, or None."""
    if not any(k in table_config for k in SETTINGS):
        return None
    ratio = float(_number(table_config, "filter_ratio", 1.0, _NUMBER))
    if not 0.0 < ratio <= 1.0:
        raise ValueError(f"filter_ratio must be in (0, 1] (the chance that a new key enters); "
                         f"got {ratio!r}")
    min_count = int(_number(table_config, "min_count", 1, _INTEGER))
    if min_count < 1:
        raise ValueError(f"min_count must be >= 1 (occurrences before a key enters); "
                         f"got {min_count}")
    if min_count > _MAX_COUNT:
        # Counts are kept as float32 rows, exact up to 2^24: a count there
        # plus 1 rounds back, so a key seen once a call never entered.
        raise ValueError(f"min_count must be <= 2^24 = {_MAX_COUNT} (the counts are exact up "
                         f"to it); got {min_count}")
    counters = int(_number(table_config, "min_count_counters", 0, _INTEGER))
    hashes = int(_number(table_config, "min_count_hashes", 3, _INTEGER))
    if counters < 0 or counters > (1 << 30):
        raise ValueError(f"min_count_counters must be in [0, 2^30] (0: an exact count per "
                         f"key); got {counters}")
    if not 1 <= hashes <= 8:
        raise ValueError(f"min_count_hashes must be in [1, 8]; got {hashes}")
    if counters and min_count == 1:
        raise ValueError("min_count_counters sizes the sketch of a counting filter: give "
                         "min_count >= 2 with it")
    if "min_count_hashes" in table_config and not counters:
        # It was ignored without a word: exact counts (and no counting) hash nothing.
        raise ValueError(f"min_count_hashes={table_config['min_count_hashes']!r} is the number "
                         f"of hashes of the count-min sketch: give min_count_counters (and "
                         f"min_count >= 2) with it")
    default = float(_number(table_config, "filter_default", 0.0, _NUMBER))
    with np.errstate(over="ignore"):
        as_float32 = np.float32(default)  # 3.4028235e38, float32's max as printed, fits
    if not np.isfinite(as_float32) or 0 < abs(default) < np.finfo(np.float32).tiny:
        # The row is float32: 1e39 read as inf for every key not admitted,
        # and a subnormal (1e-40) as 0 (the ops' threads flush them to zero).
        raise ValueError(f"filter_default must be 0 or a float32 number of magnitude in "
                         f"[{float(np.finfo(np.float32).tiny)!r}, float32 max] (the row keys "
                         f"not admitted read); got {table_config['filter_default']!r}")
    return AdmissionFilter(ratio, min_count, counters, hashes, default)


class AdmissionFilter:
    """The filter of one table (one shard of a sharded table)."""

    def __init__(self, ratio, min_count, counters, hashes, default):
        self.ratio, self.min_count = ratio, min_count
        self.counters, self.hashes, self.default = counters, hashes, default
        self.counts_handle = None
        self._entry_dtype = tf.int64
        self._calls = None
        self._deleter = None

    @property
    def counting(self):
        return self.min_count > 1

    @property
    def kind(self):
        """What the dumped counts are keyed by: "keys" or "sketch" (counter index)."""
        return "sketch" if self.counters else "keys"

    def create_ops(self, shared_name, key_dtype):
        """The ops that make the filter's state (graph mode: part of the
        table's initializer): the count table and the call counter."""
        ops = []
        if self.counting:
            self._entry_dtype = tf.int64 if self.counters else key_dtype
            # Eager resources are made anonymous (a reserved name each handle
            # op resolves to a resource of its own); graph ones are named
            # after their table.
            self.counts_handle = dynamic_ops.handle(
                compat.anonymous_name() if tf.executing_eagerly()
                else shared_name + "/admission_counts")
            ops.append(self._create_counts())
            if tf.executing_eagerly():
                self._deleter = compat.eager_resource_deleter(self.counts_handle)
        if self.ratio < 1.0:
            with tf.init_scope():
                self._calls = replica_shards.new_variable(
                    tf.zeros([], tf.int64), trainable=False, name="admission_calls")
            if not tf.executing_eagerly():
                # Made by the table's initializer, and out of GLOBAL_VARIABLES:
                # a tf.compat.v1.train.Saver() would save it, and restoring a
                # checkpoint written before the table had a filter_ratio
                # failed ("Key t/admission_calls not found in checkpoint").
                # The call count is the filter's state, which sok.dump keeps.
                ops.append(self._calls.initializer)
                collection = tf.compat.v1.get_collection_ref(
                    tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
                if self._calls in collection:
                    collection.remove(self._calls)
        return ops

    def _create_counts(self):
        return dynamic_ops.create(self.counts_handle, self._entry_dtype, 1,
                                  initializer_spec("zeros"))

    def restore_ops(self):
        """Graph mode: the ops that make the filter's state where it does not
        exist yet, leaving it as it is where it does (a table restored by a
        Saver, which runs no initializer: the call count, not a variable a
        Saver restores, was uninitialized and the first draw failed)."""
        ops = [self._create_counts()] if self.counting else []
        if self._calls is not None:
            calls = self._calls

            def start():
                with tf.control_dependencies([calls.assign(tf.zeros([], tf.int64))]):
                    return tf.constant(True)

            ops.append(tf.cond(tf.compat.v1.is_variable_initialized(calls),
                               lambda: tf.constant(False), start))
        return ops

    def admitted(self, keys, occurrences, found, use_ratio, bound=None, table=""):
        """bool [u]: which of the distinct `keys` (occurrences [u] int64 each)
        have or get a row now; found [u]: those the table holds already.
        Counts the new keys' occurrences. bound: a bounded table's
        max_capacity (its name: `table`): a call that would admit more keys
        than it holds is refused (InvalidArgumentError) before the filter
        changes anything. The table's own refusal came after the counts
        were added and the entering keys' counts dropped, so they had to be
        seen min_count times again, and the draws' call count moved on.

        In a graph, within reads_in_order (one lookup_sparse call), a call
        runs after the filter's previous call built there (outside control
        flow): a Session running two reads of the table at once
        (lookup_sparse([v, v], ...)) drew with the call numbers in whichever
        order its threads took them, so which keys entered changed from run
        to run. Now they are numbered in the order the reads were built, as
        eagerly and in a tf.function. Reads built apart (a training and an
        evaluation read) stay apart: one runs without the other. The caller
        records where its read ends (read_built), after the insert of the
        keys this admits."""
        after = self.previous_read()
        new = tf.logical_not(found)
        with tf.control_dependencies(after):
            if bound:
                after.append(self.room_check(keys, occurrences, found, use_ratio, bound, table))
        with tf.control_dependencies(after):
            admitted = self._admit(keys, occurrences, found, new, use_ratio)
        return admitted

    def previous_read(self):
        """[the last op of this filter's previous read built in this graph
        within reads_in_order], or []: what a read's first op (the table's
        find that tells which keys are new) runs after. Only the filter's
        part (`admitted`) was chained: in a Session running
        lookup_sparse([v, v], ...) the second read's find ran before the
        first read inserted its keys, so keys the first read had just
        admitted counted (and drew) as new again in the second, which gave
        them the default row and dropped their gradient (min_count=3: 33 of
        33 such keys; eagerly and in a tf.function they read their rows)."""
        chain = getattr(_ORDERED, "calls", None)
        if chain is None or tf.executing_eagerly():
            return []
        graph = tf.compat.v1.get_default_graph()
        previous = chain.get(id(self))
        if previous is not None and previous.graph is graph and \
                _outside_control_flow(previous.op, graph):
            return [previous]
        return []

    def read_built(self, last):
        """Records `last` (a tensor) as the end of the read being built
        within reads_in_order: the next read of the filter runs after it."""
        chain = getattr(_ORDERED, "calls", None)
        if chain is None or tf.executing_eagerly():
            return
        graph = tf.compat.v1.get_default_graph()
        if _outside_control_flow(last.op, graph):
            chain[id(self)] = last

    def _admit(self, keys, occurrences, found, new, use_ratio):
        """admitted's work: the counts and draws, and what they admit."""
        passes = tf.ones_like(new)
        if self.counting:
            passes = self._count(keys, occurrences, new, self._add)
        if use_ratio and self.ratio < 1.0:
            passes = tf.logical_and(passes, self._draws(keys, self._calls.assign_add(1)))
        enters = tf.logical_and(new, passes)
        admitted = tf.logical_or(found, enters)
        if self.counting and not self.counters:
            # An admitted key needs no count any more: the side table holds
            # only the keys still waiting.
            entered = tf.boolean_mask(keys, enters)
            with tf.control_dependencies([admitted]):
                removal = dynamic_ops.remove(self.counts_handle, entered)
            with tf.control_dependencies([removal]):
                admitted = tf.identity(admitted)
        return admitted

    def room_check(self, keys, occurrences, found, use_ratio, bound, table):
        """The assertion that the distinct `keys` a call admits (occurrences
        and found as for `admitted`) fit `bound` (the table `table`'s
        max_capacity), found by reading the counts and the call count,
        changing neither: a read checks it first, and lookup_sparse before
        any read of its call."""
        new = tf.logical_not(found)
        passes = tf.ones_like(new)
        if self.counting:
            passes = self._count(keys, occurrences, new, self._peek)
        if use_ratio and self.ratio < 1.0:
            passes = tf.logical_and(passes, self._draws(keys, self._calls.read_value() + 1))
        admitting = tf.math.count_nonzero(tf.logical_or(found, tf.logical_and(new, passes)))
        return tf.debugging.assert_less_equal(
            admitting, tf.constant(bound, tf.int64),
            message=(f"DynamicVariable '{table}': the call admits more distinct keys than its "
                     f"max_capacity={bound} holds (keys used in a call are never evicted); the "
                     f"table and its admission filter are unchanged. Keys admitted:"))

    def _draws(self, keys, call):
        """bool [u]: filter_ratio's draw for each key in call number `call`."""
        return tf.cast(key_hash(keys, call), tf.float64) / _PRIME < self.ratio

    def _count(self, keys, occurrences, new, tally):
        """bool [u]: whether each key's count reaches min_count once this
        call's occurrences of the new keys are added; tally(entries, adds):
        _add, or _peek to know without adding."""
        adds = tf.where(new, occurrences, tf.zeros_like(occurrences))
        if not self.counters:
            entries = tf.boolean_mask(keys, new)
            adds = tf.boolean_mask(adds, new)
            total = tally(entries, adds)
            # Back to one value per distinct key (0 for keys the table holds).
            index = tf.cast(tf.where(new)[:, 0], tf.int32)
            total = tf.scatter_nd(index[:, None], total, tf.shape(keys, out_type=tf.int32))
            return total >= self.min_count
        slots = tf.stack([tf.math.floormod(key_hash(keys, j + 1), self.counters)
                          for j in range(self.hashes)], axis=1)  # [u, hashes]
        flat = tf.reshape(slots, [-1])
        distinct, position = util_ops.unique(flat, out_idx=tf.int32)
        # Integer counts: TensorFlow's sum (sok's is for float rows) is exact.
        per_slot = tf.math.unsorted_segment_sum(
            tf.reshape(tf.tile(adds[:, None], [1, self.hashes]), [-1]), position,
            tf.size(distinct))
        total = tf.gather(tally(distinct, per_slot), position)
        return tf.reduce_min(tf.reshape(total, [-1, self.hashes]), axis=1) >= self.min_count

    def _peek(self, entries, adds):
        """The counts _add would leave, without adding."""
        current, _ = dynamic_ops.find(self.counts_handle, entries, 1)
        return tf.cast(tf.round(current[:, 0]), tf.int64) + tf.cast(adds, tf.int64)

    def _add(self, entries, adds):
        """Adds adds [m] to the counts of distinct entries [m]; their counts
        after that. The add is one op (the table adds under its lock): a read
        and a write back lost counts where two reads of one table ran at once
        (a Session running lookup_sparse([v, v], ...), threads). The counts
        read after it may hold another call's adds too: such a key enters in
        whichever call sees its count reach min_count (possibly both)."""
        added = dynamic_ops.scatter(self.counts_handle, entries,
                                    tf.cast(adds, tf.float32)[:, None], "add")
        with tf.control_dependencies([added]):
            total, _ = dynamic_ops.find(self.counts_handle, entries, 1)
        return tf.cast(tf.round(total[:, 0]), tf.int64)

    def clear(self):
        """The op that forgets every count (the table was emptied)."""
        if not self.counting:
            return tf.no_op()
        return dynamic_ops.clear(self.counts_handle)

    # ------------------------------------------------------------ dump/load
    @property
    def draws(self):
        """Whether the filter draws (filter_ratio < 1): its call counter, which
        salts the draws, is then part of its state."""
        return self._calls is not None

    def calls(self):
        """int64 [1]: the calls that have drawn so far (the next draw's salt
        is one more)."""
        return tf.reshape(self._calls.read_value(), [1])

    def restore_calls(self, calls):
        """The op that sets the call counter: after a load, the draws go on
        where the dump left them. Restarted at 0, they would repeat the
        salts of the first calls, and a key turned away by those draws
        would be turned away again (after each restart, for a job that
        restarts often: never admitted)."""
        return self._calls.assign(tf.cast(calls, tf.int64))  # a number, or a tensor

    def description(self):
        """What the counts mean, as a dump's manifest records it: per key, or
        per counter of a sketch of this size."""
        if not self.counters:
            return {"kind": self.kind}
        return {"kind": self.kind, "counters": self.counters, "hashes": self.hashes}

    def export(self):
        """(entries int64 [m], counts int64 [m]): the counts to dump."""
        entries, rows, _, _, _ = dynamic_ops.export(self.counts_handle, self._entry_dtype, 1,
                                                    offset=0, limit=(1 << 62))
        return tf.cast(entries, tf.int64), tf.cast(tf.round(rows[:, 0]), tf.int64)

    def restore(self, entries, counts):
        """The op that makes the counts exactly (entries, counts)."""
        entries = tf.cast(entries, self._entry_dtype)
        return dynamic_ops.import_rows(
            self.counts_handle, entries, tf.reshape(tf.cast(counts, tf.float32), [-1, 1]),
            replace=True)


class CheckpointState(compat.trackable_base_class()):
    """A filter's state in a tf.train.Checkpoint: an object the table tracks
    as "admission", so that a checkpoint of a table written before it had
    a filter (which holds no such object) still restores, into a filter
    whose state is then left as it is. Saved: what the counts are keyed by
    (the description a dump's manifest records, "" where the filter counts
    nothing), the counts (entries, counts; empty where none) and the call
    count of filter_ratio's draws ([1], or [0] where it draws nothing).
    Before, a restore kept the counts and call count of the process that
    restored: a restarted job counted from zero and repeated its first
    calls' draws, turning the same keys away again."""

    def __init__(self, admission, table_name, table=None):
        self._filter, self._table_name = admission, table_name
        # The table, weakly: a replica's shard saves nothing of its own (its
        # ReplicaShards saves the whole table's counts, ReplicaAdmission).
        self._table = weakref.ref(table) if table is not None else (lambda: None)

    def _held(self):
        table = self._table()
        return table is not None and held_by(table, "_replica_holder")

    @property
    def name(self):
        # What a TF 1.x checkpoint names the tensors by (compat's trackable).
        return self._table_name + "/admission"

    def _kind(self):
        if not self._filter.counting:
            return ""
        return json.dumps(self._filter.description(), sort_keys=True)

    def _serialize_to_tensors(self):
        return {} if self._held() else self.state_tensors()

    def state_tensors(self):
        """The filter's state as a checkpoint holds it (see the class docstring)."""
        admission = self._filter
        if admission.counting:
            entries, counts = admission.export()
        else:
            entries = counts = tf.zeros([0], tf.int64)
        calls = admission.calls() if admission.draws else tf.zeros([0], tf.int64)
        return {"kind": tf.constant(self._kind()), "entries": entries, "counts": counts,
                "calls": calls}

    def _restore_from_tensors(self, restored_tensors):
        if self._held() or not restored_tensors:
            return tf.no_op()
        return self.restore_state(restored_tensors)

    def restore_state(self, restored_tensors):
        """The op that restores state_tensors' tensors (this filter's part)."""
        admission = self._filter
        # A Saver may restore before the table's initializer ran.
        deps = [] if tf.executing_eagerly() else admission.restore_ops()
        ops = []
        with tf.control_dependencies(deps):
            if admission.counting:
                saved = restored_tensors["kind"]
                mine = self._kind()

                def refusal(kept):
                    return (f"a checkpoint's admission counts of DynamicVariable "
                            f"'{self._table_name}' were kept as {kept}; its filter keeps them "
                            f"as {mine} (a count-min sketch's counters and exact counts per "
                            f"key do not convert): restore into a table of the same "
                            f"min_count_counters / min_count_hashes")
                value = compat.constant_value(saved)
                if value is not None:
                    value = getattr(value, "item", lambda: value)()  # a 0-d array
                    value = value.decode("utf-8") if isinstance(value, bytes) else str(value)
                    if value not in ("", mine):
                        raise ValueError(refusal(value))
                    checks = []
                else:
                    checks = [tf.debugging.Assert(
                        tf.logical_or(tf.equal(saved, ""), tf.equal(saved, mine)),
                        [refusal("(below)"), saved])]
                with tf.control_dependencies(checks):
                    # A checkpoint of a filter that counted nothing holds no
                    # counts: the restored table's keys start afresh.
                    ops.append(admission.restore(restored_tensors["entries"],
                                                 restored_tensors["counts"]))
            if admission.draws:
                calls = tf.reshape(restored_tensors["calls"], [-1])
                # A checkpoint of a filter that drew nothing keeps the call
                # count as it is.
                def restored():
                    with tf.control_dependencies([admission.restore_calls(calls[0])]):
                        return tf.constant(True)

                ops.append(tf.cond(tf.equal(tf.size(calls), 1), restored,
                                   lambda: tf.constant(False)))
        if not ops:
            return tf.no_op()
        return tf.group(ops)


def _outside_control_flow(op, graph):
    """Whether `op` and what is being built in `graph` now are both outside
    any TF1 control-flow construct (while_loop, cond), so that one may
    depend on the other."""
    context = getattr(graph, "_get_control_flow_context", lambda: None)()
    return context is None and getattr(op, "_control_flow_context", None) is None
