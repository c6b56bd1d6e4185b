"""Dynamic (hash-table) embedding: sok_graph's table vs TensorFlow's
MutableHashTable and TFRA's dynamic_embedding, op by op.

Defaults: 65,536 int64 keys per call, dim 16, tables pre-filled with
1,000,000 random 62-bit keys and known rows. Three operations:

  find         rows of existing keys, nothing inserted
               sok: SokDynamicTableFind; MutableHashTable: lookup;
               TFRA: CuckooHashTable lookup (the table's static default)
  insert-new   keys never seen by the table (a fresh key range per call)
               sok: SokDynamicTableFindOrInsert, which also initialises the
               new rows (normal initializer) and returns them; baselines:
               insert of the same keys with given rows (their comparable
               cost: find-or-insert with them is a lookup plus this insert).
               An extra row, "sok, zeros init (info)", times the same op on
               a second sok table with the zeros initializer, to show how
               much of sok's time is making normal-distributed rows.
  scatter-add  row += delta for existing (unique) keys
               sok: SokDynamicTableScatter(mode="add"); MutableHashTable:
               lookup + add + insert; TFRA: CuckooHashTable accum with
               exists=True (its one-op scatter-add)

Every op is called directly in eager mode (the sok_graph.ops.dynamic
wrappers, the baselines' table objects; inputs made once, outside the
timing). All implementations run in the same process, in interleaved rounds
(each round times `--calls` calls of every op of every implementation);
the result is the median over `--rounds` rounds of the mean time per call
in the round (min and max over rounds beside it), in ms per call and
millions of keys per second.
After each round's insert-new calls the inserted keys are removed again
(untimed), so every table holds --table-size keys when a round starts, and
later rounds still insert keys the table has never held. One untimed warm-up
round comes first; tables grow their storage there, so the timed rounds
measure inserts into tables with room, for every implementation alike.

Before anything is timed, each implementation's results are checked against
the known rows (find, find of missing keys, insert, scatter-add), and the
table sizes are checked after every timed round.

Memory (sok only): stats()["memory_bytes"] / size of a bounded "hybrid"
table filled to its max_capacity (2**20 for the default table size: memory
counts allocated capacity, so a full table is the one the budget of
dim*4 + 32 bytes per key applies to) and of the unbounded "hbm" table of
the benchmark, right after its fill (before the warm-up grows it).

TFRA (tensorflow-recommenders-addons, CPU) is measured when it imports; it
is only built for some TensorFlow versions (0.7.2: TensorFlow 2.15.1). When
it does not import, a "skipped" line says why and the rest runs as usual.
(TFRA 0.7.2 imports pkg_resources, which setuptools >= 81 no longer has: it
needs setuptools < 81 importable.) This script installs nothing.

    python bench/dynamic_bench.py [--keys-per-call 65536 --dim 16
        --table-size 1000000 --rounds 15 --calls 5]
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import sok_graph as sok  # noqa: E402
from sok_graph.data.flags import int_at_least  # noqa: E402
from sok_graph.ops import dynamic as dynamic_ops  # noqa: E402

OPS = ("find", "insert-new", "scatter-add")
# The project's targets: sok speed / baseline speed, per op and baseline.
TARGETS = {("find", "MutableHashTable"): 8.0, ("find", "TFRA"): 4.0,
           ("insert-new", "TFRA"): 1.5, ("scatter-add", "TFRA"): 3.0}
FILL_CHUNK = 1 << 16
SOK_ZEROS = "sok, zeros init (info)"


def unique_keys(rng, n):
    """n distinct random int64 keys in [1, 2**62), in random order."""
    while True:
        keys = np.unique(rng.integers(1, 2 ** 62, size=n + n // 64 + 16, dtype=np.int64))
        if len(keys) >= n:
            return rng.permutation(keys)[:n]


def chunks(n, size=FILL_CHUNK):
    for start in range(0, n, size):
        yield slice(start, min(start + size, n))


class Sok:
    """sok_graph's dynamic table (DynamicVariable, var_type="hbm")."""

    ops = OPS

    def __init__(self, dim, keys, rows, initializer="normal", name="sok", ops=OPS):
        self.dim = dim
        self.name = name
        self.ops = ops
        self.initializer = initializer
        self.var = sok.DynamicVariable(dim, initializer=initializer, var_type="hbm",
                                       key_type=tf.int64)
        self.handle = self.var.handle
        self.default = tf.constant(0.0, tf.float32)
        for s in chunks(len(keys)):
            self.var.import_rows(tf.constant(keys[s]), tf.constant(rows[s]))

    def find(self, keys):
        return dynamic_ops.find(self.handle, keys, self.dim, self.default)[0]

    def find_found(self, keys):
        rows, found = dynamic_ops.find(self.handle, keys, self.dim, self.default)
        return rows.numpy(), found.numpy()

    def insert_new(self, keys, values):
        del values  # the table initialises new rows itself
        return dynamic_ops.find_or_insert(self.handle, keys, self.dim)[0]

    def scatter_add(self, keys, deltas):
        return dynamic_ops.scatter(self.handle, keys, deltas, "add")

    def overwrite(self, keys, rows):
        dynamic_ops.scatter(self.handle, keys, rows, "update")

    def remove(self, keys):
        return int(dynamic_ops.remove(self.handle, keys))

    def size(self):
        return int(self.var.size[0])


class MutableHashTable:
    """tf.lookup.experimental.MutableHashTable, int64 -> float32[dim]."""

    name = "MutableHashTable"
    ops = OPS

    def __init__(self, dim, keys, rows):
        self.table = tf.lookup.experimental.MutableHashTable(
            key_dtype=tf.int64, value_dtype=tf.float32, default_value=tf.zeros([dim]))
        for s in chunks(len(keys)):
            self.table.insert(tf.constant(keys[s]), tf.constant(rows[s]))

    def find(self, keys):
        return self.table.lookup(keys)

    def find_found(self, keys):
        return self.table.lookup(keys).numpy(), None

    def insert_new(self, keys, values):
        return self.table.insert(keys, values)

    def scatter_add(self, keys, deltas):
        return self.table.insert(keys, self.table.lookup(keys) + deltas)

    def overwrite(self, keys, rows):
        self.table.insert(keys, rows)

    def remove(self, keys):
        before = self.size()
        self.table.remove(keys)
        return before - self.size()

    def size(self):
        return int(self.table.size())


class Tfra:
    """TFRA dynamic_embedding.Variable (CPU): the ops of its CuckooHashTable."""

    name = "TFRA"
    ops = OPS

    def __init__(self, dim, keys, rows, de):
        self.var = de.Variable(key_dtype=tf.int64, value_dtype=tf.float32, dim=dim,
                               initializer=0.0, name="dynamic_bench_tfra")
        (self.table,) = self.var.tables
        for s in chunks(len(keys)):
            self.table.insert(tf.constant(keys[s]), tf.constant(rows[s]))
        self.exists = {}

    def find(self, keys):
        return self.table.lookup(keys)

    def find_found(self, keys):
        rows, found = self.table.lookup(keys, return_exists=True)
        return rows.numpy(), found.numpy()

    def insert_new(self, keys, values):
        return self.table.insert(keys, values)

    def scatter_add(self, keys, deltas):
        n = int(keys.shape[0])
        if n not in self.exists:
            self.exists[n] = tf.ones([n], tf.bool)
        return self.table.accum(keys, deltas, self.exists[n])

    def overwrite(self, keys, rows):
        self.table.insert(keys, rows)

    def remove(self, keys):
        before = self.size()
        self.table.remove(keys)
        return before - self.size()

    def size(self):
        return int(self.table.size())


def import_tfra():
    """(module tensorflow_recommenders_addons.dynamic_embedding, None) or
    (None, the reason it is unavailable)."""
    try:
        import tensorflow_recommenders_addons as tfra
        from tensorflow_recommenders_addons import dynamic_embedding as de
    except Exception as e:  # noqa: BLE001  (any import failure means: skip)
        return None, f"{type(e).__name__}: {e}"
    return (de, getattr(tfra, "__version__", "?")), None


def check(impl, table_size, table_keys, table_rows, check_keys, rng, dim):
    """Asserts that impl's results are the known rows, before any timing;
    leaves the table as it found it."""
    idx = rng.choice(table_size, size=min(4096, table_size), replace=False)
    keys_np, expected = table_keys[idx], table_rows[idx]
    keys = tf.constant(keys_np)
    what = f"{impl.name}:"

    assert impl.size() == table_size, (what, "size after fill", impl.size())
    rows, found = impl.find_found(keys)
    np.testing.assert_array_equal(rows, expected, err_msg=f"{what} find of existing keys")
    if found is not None:
        assert found.all(), (what, "find: existing keys reported missing")

    missing = tf.constant(check_keys)
    rows, found = impl.find_found(missing)
    np.testing.assert_array_equal(rows, np.zeros_like(rows),
                                  err_msg=f"{what} find of missing keys: not the default")
    if found is not None:
        assert not found.any(), (what, "find: missing keys reported found")
    assert impl.size() == table_size, (what, "find inserted keys", impl.size())

    # Insert of new keys: what find returns afterwards is what was inserted
    # (sok: the rows find-or-insert returned, from the normal initializer).
    given = rng.normal(0, 0.05, (len(check_keys), dim)).astype(np.float32)
    out = impl.insert_new(missing, tf.constant(given))
    if isinstance(impl, Sok):
        given = out.numpy()
        if impl.initializer == "zeros":
            assert not given.any(), (what, "new rows not from the zeros initializer")
        else:  # normal, stddev 0.05
            assert 0.03 < given.std() < 0.07, (what, "new rows not from the initializer",
                                               given.std())
        again = impl.insert_new(keys, None).numpy()
        np.testing.assert_array_equal(again, expected,
                                      err_msg=f"{what} find-or-insert of existing keys")
    assert impl.size() == table_size + len(check_keys), (what, "size after insert", impl.size())
    rows, found = impl.find_found(missing)
    np.testing.assert_array_equal(rows, given, err_msg=f"{what} find after insert")
    if found is not None:
        assert found.all(), (what, "inserted keys reported missing")
    assert impl.remove(missing) == len(check_keys), (what, "remove of inserted keys")
    assert impl.size() == table_size, (what, "size after remove", impl.size())

    # Scatter-add: rows become row + delta (the same float32 sum numpy makes).
    delta = rng.normal(0, 0.01, expected.shape).astype(np.float32)
    impl.scatter_add(keys, tf.constant(delta))
    rows, _ = impl.find_found(keys)
    np.testing.assert_array_equal(rows, expected + delta, err_msg=f"{what} scatter-add")
    assert impl.size() == table_size, (what, "scatter-add changed the size", impl.size())
    impl.overwrite(keys, tf.constant(expected))
    rows, _ = impl.find_found(keys)
    np.testing.assert_array_equal(rows, expected, err_msg=f"{what} restore after scatter-add")


def run_round(impls, batches, deltas, new_batches, new_values, next_new, calls, table_size,
              record):
    """One round: `calls` calls of each op of each implementation. Records
    seconds per call into record[(op, impl.name)] when record is not None."""
    for op in OPS:
        for impl in impls:
            if op not in impl.ops:
                continue
            if op == "find":
                start = time.perf_counter()
                for j in range(calls):
                    impl.find(batches[j])
                elapsed = time.perf_counter() - start
            elif op == "scatter-add":
                start = time.perf_counter()
                for j in range(calls):
                    impl.scatter_add(batches[j], deltas)
                elapsed = time.perf_counter() - start
            else:
                first = next_new[impl.name]
                mine = new_batches[first:first + calls]
                assert len(mine) == calls, "ran out of new keys"
                start = time.perf_counter()
                for keys in mine:
                    impl.insert_new(keys, new_values)
                elapsed = time.perf_counter() - start
                next_new[impl.name] = first + calls
                n = sum(int(k.shape[0]) for k in mine)
                assert impl.size() == table_size + n, (impl.name, "insert-new: size",
                                                       impl.size(), table_size + n)
                removed = sum(impl.remove(k) for k in mine)
                assert removed == n and impl.size() == table_size, (
                    impl.name, "removing the new keys", removed, impl.size())
            if record is not None:
                record[(op, impl.name)].append(elapsed / calls)


def memory_rows(args, table_keys):
    """[(label, size, memory_bytes)] of sok tables."""
    out = []
    capacity = 1 << max(4, int(np.ceil(np.log2(args.table_size))))
    hybrid = sok.DynamicVariable(args.dim, initializer="zeros", var_type="hybrid",
                                 key_type=tf.int64, init_capacity=1 << 16 if capacity >= 1 << 16
                                 else capacity, max_capacity=capacity)
    keys = np.arange(1, capacity + 1, dtype=np.int64)
    zeros = tf.zeros([FILL_CHUNK, args.dim])
    for s in chunks(capacity):
        hybrid.import_rows(tf.constant(keys[s]), zeros[:s.stop - s.start])
    st = {k: int(v) for k, v in hybrid.stats().items()}
    assert st["size"] == capacity and st["row_limit"] == capacity and st["evicted_total"] == 0, st
    out.append((f"hybrid, max_capacity 2^{capacity.bit_length() - 1}, full", st["size"],
                st["memory_bytes"]))
    del hybrid
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys-per-call", type=int_at_least(1), default=65536)
    p.add_argument("--dim", type=int_at_least(1), default=16)
    p.add_argument("--table-size", type=int_at_least(1), default=1000000)
    p.add_argument("--rounds", type=int_at_least(1), default=15)
    p.add_argument("--calls", type=int_at_least(1), default=5,
                   help="calls of each op per timed round")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    n, dim, calls = args.keys_per_call, args.dim, args.calls
    if n > args.table_size:
        p.error("--keys-per-call must be <= --table-size (find and scatter-add use existing keys)")

    rng = np.random.default_rng(args.seed)
    new_calls = (1 + args.rounds) * calls  # the warm-up round, then the timed ones
    n_check = min(4096, n)
    all_keys = unique_keys(rng, args.table_size + n_check + new_calls * n)
    table_keys = all_keys[:args.table_size]
    check_keys = all_keys[args.table_size:args.table_size + n_check]
    new_keys = all_keys[args.table_size + n_check:]
    table_rows = rng.normal(0, 0.05, (args.table_size, dim)).astype(np.float32)

    tfra, tfra_skip = import_tfra()
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs; {n} int64 keys per call, "
          f"dim {dim}, tables pre-filled with {args.table_size} keys; eager op calls, median "
          f"of {args.rounds} rounds x {calls} calls (after 1 warm-up round); load average "
          f"{os.getloadavg()[0]:.2f} at start", flush=True)
    if tfra_skip:
        print(f"TFRA: skipped: tensorflow_recommenders_addons does not import here "
              f"({tfra_skip})", flush=True)
    else:
        print(f"TFRA: tensorflow_recommenders_addons {tfra[1]} (CPU CuckooHashTable)",
              flush=True)

    start = time.perf_counter()
    impls = [Sok(dim, table_keys, table_rows)]
    sok_fill = {k: int(v) for k, v in impls[0].var.stats().items()}  # before any growth
    impls.append(MutableHashTable(dim, table_keys, table_rows))
    if tfra:
        impls.append(Tfra(dim, table_keys, table_rows, tfra[0]))
    # Information only: sok's insert-new with rows that cost nothing to
    # make, to show how much of it is the normal initializer's work.
    impls.append(Sok(dim, table_keys, table_rows, initializer="zeros", name=SOK_ZEROS,
                     ops=("insert-new",)))
    for impl in impls:
        check(impl, args.table_size, table_keys, table_rows, check_keys, rng, dim)
    print(f"filled and checked {len(impls)} tables in {time.perf_counter() - start:.1f} s "
          f"(find, find of missing keys, insert, scatter-add: results equal the known rows)",
          flush=True)

    # Inputs of the timed calls, made once: `calls` batches of distinct
    # existing keys (find, scatter-add) and the new-key batches.
    batches = [tf.constant(table_keys[rng.choice(args.table_size, size=n, replace=False)])
               for _ in range(calls)]
    deltas = tf.constant(rng.normal(0, 1e-3, (n, dim)).astype(np.float32))
    new_values = tf.constant(rng.normal(0, 0.05, (n, dim)).astype(np.float32))
    new_batches = [tf.constant(new_keys[i * n:(i + 1) * n]) for i in range(new_calls)]
    next_new = {impl.name: 0 for impl in impls}

    record = {(op, impl.name): [] for impl in impls for op in impl.ops}
    run_round(impls, batches, deltas, new_batches, new_values, next_new, calls,
              args.table_size, None)
    for _ in range(args.rounds):
        run_round(impls, batches, deltas, new_batches, new_values, next_new, calls,
                  args.table_size, record)
    secs = {key: float(np.median(v)) for key, v in record.items()}

    print()
    print(f"{'op':<13}{'implementation':<22}{'ms/call':>9}{'min':>9}{'max':>9}{'Mkeys/s':>10}")
    for op in OPS:
        for impl in impls:
            if op not in impl.ops:
                continue
            s, times = secs[(op, impl.name)], record[(op, impl.name)]
            print(f"{op:<13}{impl.name:<22}{s * 1e3:>9.2f}{min(times) * 1e3:>9.2f}"
                  f"{max(times) * 1e3:>9.2f}{n / s / 1e6:>10.2f}")
            if tfra_skip and impl.name == MutableHashTable.name:
                print(f"{op:<13}{'TFRA':<22}skipped: tensorflow_recommenders_addons not "
                      f"importable")

    print()
    print("ratio = baseline median ms/call / sok median ms/call (same run; > 1: sok "
          "faster); per round: the median over rounds of that round's ratio:")
    print(f"{'op':<13}{'baseline':<22}{'ratio':>8}{'per round':>11}  target")
    for op in OPS:
        for base in ("MutableHashTable", "TFRA"):
            target = TARGETS.get((op, base))
            goal = "none" if target is None else f">= {target:g}x"
            if (op, base) not in secs:
                print(f"{op:<13}{base:<22}{'skipped':>8}{'':>11}  {goal}")
                continue
            ratio = secs[(op, base)] / secs[(op, "sok")]
            paired = float(np.median(np.array(record[(op, base)]) /
                                     np.array(record[(op, "sok")])))
            verdict = "" if target is None else ("  met" if ratio >= target else "  NOT met")
            print(f"{op:<13}{base:<22}{ratio:>7.2f}x{paired:>10.2f}x  {goal}{verdict}")

    print()
    budget = dim * 4 + 32
    print(f"sok memory (stats()['memory_bytes'], allocated capacity) per key; "
          f"budget dim*4 + 32 = {budget} bytes:")
    print(f"{'table':<34}{'size':>10}{'memory_bytes':>14}{'bytes/key':>11}  vs budget")
    rows = memory_rows(args, table_keys)
    rows.append((f"hbm (unbounded), {args.table_size} keys", sok_fill["size"],
                 sok_fill["memory_bytes"]))
    for label, size, mem in rows:
        per_key = mem / size
        verdict = "met" if per_key <= budget else "over"
        if label.startswith("hbm"):
            verdict += " (capacity not full: info)"
        print(f"{label:<34}{size:>10}{mem:>14}{per_key:>11.2f}  {verdict}")


if __name__ == "__main__":
    main()
