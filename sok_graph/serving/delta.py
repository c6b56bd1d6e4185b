"""Delta publishing: the rows trained since a time, to bring a served model
up to date without a new export.

A delta directory:
  manifest.json       format, since / created (UTC microseconds), and per
                      table: name, kind, key dtype, dtype, dimension, rows,
                      and for its two files their size and CRC-32
  <table>.keys.npy    int64 keys (global row numbers of a static table)
  <table>.rows.npy    rows [n, dimension]
Plain .npy files: a server without sok_graph reads them with numpy.

Dynamic tables give the keys updated after `since` (their per-key update
times); static tables keep no update times and give every row.

A delta is applied to an export directory (apply_serving_delta, which
rewrites the SavedModel's variables with numpy and stock TensorFlow ops), or
to a loaded TF2 model through the function the SavedModel holds:
`loaded.sok_tables[name].apply_delta_fn(keys, rows)`.
"""

import json
import os
import shutil
import time
import uuid
import zlib

import numpy as np
import tensorflow as tf

from sok_graph import context
from sok_graph.tables.static import is_sok_variable
from sok_graph.ops import dynamic as dynamic_ops
from sok_graph.tables import dimension_of, is_dynamic, replica_shards
from sok_graph.serving import sources
from sok_graph.serving.export import MANIFEST, table_name
from sok_graph.serving.tables import safe_name

DELTA_FORMAT = 1
DELTA_MANIFEST = "manifest.json"


class DeltaError(ValueError):
    """A delta is corrupted, or does not fit the model it is applied to."""


def _named(variables):
    if is_sok_variable(variables) or not isinstance(variables, (list, tuple, dict)):
        variables = [variables]
    if isinstance(variables, dict):
        return dict(variables)
    out = {}
    for v in variables:
        if not is_sok_variable(v):
            raise TypeError(f"export_serving_delta takes sok tables; got {type(v).__name__}")
        name = table_name(v)
        if name in out:
            # The export numbered tables of one name (name, name_1, ...) in
            # the order the model read them, which a list here need not
            # follow: numbered by this list, a delta would reach the wrong
            # table without an error.
            raise ValueError(
                f"export_serving_delta: variables holds several tables named {name!r}; their "
                f"serving names (the export's sok_tables: {name!r}, {name + '_1'!r}, ...) follow "
                f"the order the model read them in: pass a dict {{serving name: table}}, or give "
                f"the tables distinct names")
        out[name] = v
    return out


def _crc(path):
    crc = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            crc = zlib.crc32(block, crc)
    return crc


def export_serving_delta(variables, since, delta_dir, session=None, chunk_rows=1 << 20):
    """Writes the rows of `variables` (sok tables: a list, or {serving name:
    table}) changed after `since` (a UTC datetime or microseconds) to the new
    directory `delta_dir`. Every worker calls it (tables are gathered); rank
    0 writes and returns delta_dir, the others return None. In graph mode
    pass the trained graph's `session`."""
    after = dynamic_ops.utc_micros(since, "since")
    created = int(time.time() * 1e6)
    tables = _named(variables)
    runner = sources.Runner(None if session is None else (
        session._tf_sess() if hasattr(session, "_tf_sess") else session))
    comm = context.active()
    rank = 0 if comm is None or comm.in_process else comm.rank
    collected = []
    for name, table in tables.items():
        dynamic = is_dynamic(replica_shards.shards_of(table)[0])
        _, chunks = sources.whole_table(table, runner, chunk_rows,
                                        updated_after=after if dynamic else None)
        parts = list(chunks)
        dim = dimension_of(table)
        dtype = tf.as_dtype(table.dtype).base_dtype.as_numpy_dtype
        keys = np.concatenate([k for k, _ in parts]) if parts else np.zeros([0], np.int64)
        rows = np.concatenate([r for _, r in parts]) if parts else np.zeros([0, dim], dtype)
        order = np.argsort(keys, kind="stable")
        collected.append((name, "dynamic" if dynamic else "static",
                          table.key_type.name if dynamic else "int64",
                          tf.as_dtype(dtype).name, dim, keys[order], rows[order]))
    if rank != 0:
        return None
    parent = os.path.dirname(os.path.abspath(delta_dir))
    os.makedirs(parent, exist_ok=True)
    if os.path.exists(delta_dir):
        raise FileExistsError(f"delta_dir {delta_dir!r} exists; a delta goes to a new directory")
    tmp = os.path.join(parent, f".{os.path.basename(delta_dir)}.tmp-{uuid.uuid4().hex[:8]}")
    os.makedirs(tmp)
    entries, used = [], set()
    for name, kind, key_dtype, dtype, dim, keys, rows in collected:
        stem = base = safe_name(name)
        k = 0
        while stem.lower() in used:
            k += 1
            stem = f"{base}-{k}"
        used.add(stem.lower())
        files = {}
        for part, array in (("keys", keys.astype(np.int64)), ("rows", rows)):
            file_name = f"{stem}.{part}.npy"
            path = os.path.join(tmp, file_name)
            np.save(path, np.ascontiguousarray(array))
            files[part] = dict(file=file_name, bytes=os.path.getsize(path), crc32=_crc(path))
        entries.append(dict(name=name, kind=kind, key_dtype=key_dtype, dtype=dtype,
                            dimension=dim, rows=int(len(keys)), files=files))
    manifest = dict(format=DELTA_FORMAT, since=after, created=created, tables=entries)
    with open(os.path.join(tmp, DELTA_MANIFEST), "w") as f:
        json.dump(manifest, f, indent=1)
    os.rename(tmp, delta_dir)
    return delta_dir


def read_serving_delta(delta_dir):
    """{table name: (keys, rows)} of a delta directory, after checking every
    file's size and checksum."""
    try:
        with open(os.path.join(delta_dir, DELTA_MANIFEST)) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise DeltaError(f"{delta_dir}: no readable {DELTA_MANIFEST} ({e})") from None
    if manifest.get("format") != DELTA_FORMAT:
        raise DeltaError(f"{delta_dir}: delta format {manifest.get('format')!r} is not "
                         f"{DELTA_FORMAT}")
    out = {}
    for entry in manifest["tables"]:
        arrays = []
        for part in ("keys", "rows"):
            info = entry["files"][part]
            path = _file_inside(delta_dir, info["file"])
            if not os.path.exists(path) or os.path.getsize(path) != info["bytes"] \
                    or _crc(path) != info["crc32"]:
                raise DeltaError(f"{path} is missing, truncated or corrupted (size or "
                                 "checksum differs from the manifest)")
            try:
                arrays.append(np.load(path, allow_pickle=False))
            except (ValueError, OSError) as e:
                raise DeltaError(f"{path} is not a numpy array of numbers ({e})") from None
        keys, rows = _checked_arrays(delta_dir, entry, *arrays)
        if len(keys) != entry["rows"] or rows.shape != (entry["rows"], entry["dimension"]):
            raise DeltaError(f"{delta_dir}: table {entry['name']!r} has {len(keys)} keys and "
                             f"rows of shape {rows.shape}; the manifest says {entry['rows']} "
                             f"x {entry['dimension']}")
        out[entry["name"]] = (entry, keys, rows)
    return out


def _file_inside(delta_dir, name):
    """The path of file `name` of a delta: a plain file name, inside
    delta_dir (a manifest cannot point elsewhere)."""
    if not isinstance(name, str) or name in ("", ".", "..") or os.path.basename(name) != name \
            or (os.path.altsep and os.path.altsep in name):
        raise DeltaError(f"{delta_dir}: the manifest names the file {name!r}; a delta's files "
                         f"are plain names inside its own directory")
    return os.path.join(delta_dir, name)


def _checked_arrays(delta_dir, entry, keys, rows):
    """(keys, rows) of one table of a delta: integer keys, finite float rows."""
    name = entry.get("name")
    if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer):
        raise DeltaError(f"{delta_dir}: table {name!r} has keys of dtype {keys.dtype} and shape "
                         f"{keys.shape}; keys must be a vector of integers")
    if rows.ndim != 2 or not np.issubdtype(rows.dtype, np.floating):
        raise DeltaError(f"{delta_dir}: table {name!r} has rows of dtype {rows.dtype} and shape "
                         f"{rows.shape}; rows must be a [keys, dimension] float matrix")
    if not np.all(np.isfinite(rows)):
        bad = int(np.argwhere(~np.isfinite(rows))[0][0])
        raise DeltaError(f"{delta_dir}: table {name!r} has a NaN or infinite value in the row "
                         f"of key {int(keys[bad]) if bad < len(keys) else bad}; rows must be "
                         f"finite")
    return keys, rows


def _merge_dynamic(keys, index, rows, new_keys, new_rows):
    """numpy: the keys, index and rows of a dynamic serving table after its
    delta (held keys overwritten, new keys added)."""
    n = len(keys)
    position = np.searchsorted(keys, new_keys, side="left")
    probe = np.minimum(position, max(n - 1, 0))
    found = (position < n) & (keys[probe] == new_keys) if n else np.zeros(len(new_keys), bool)
    rows = rows.copy()
    rows[index[probe[found]]] = new_rows[found]
    added_keys, added_rows = new_keys[~found], new_rows[~found]
    order = np.argsort(added_keys, kind="stable")
    added_keys, added_rows = added_keys[order], added_rows[order]
    first = len(rows)
    all_keys = np.concatenate([keys, added_keys])
    all_index = np.concatenate([index, first + np.arange(len(added_keys), dtype=np.int64)])
    order = np.argsort(all_keys, kind="stable")
    return all_keys[order], all_index[order], np.concatenate([rows, added_rows])


def _write_checkpoint(prefix, tensors):
    """Writes {key: array} as a checkpoint at `prefix` with stock SaveV2."""
    names = sorted(tensors)
    with tf.Graph().as_default() as graph:
        feeds = []
        for name in names:
            value = tensors[name]
            dtype = tf.string if isinstance(value, bytes) else tf.as_dtype(value.dtype)
            feeds.append(tf.compat.v1.placeholder(dtype, None if isinstance(value, bytes)
                                                  else value.shape))
        save = tf.raw_ops.SaveV2(prefix=tf.constant(prefix), tensor_names=tf.constant(names),
                                 shape_and_slices=tf.constant([""] * len(names)),
                                 tensors=feeds)
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(save, {f: tensors[n] for f, n in zip(feeds, names)})


def apply_serving_delta(export_dir, delta_dir, output_dir=None):
    """Writes the rows of a delta into the SavedModel at export_dir (written
    by sok.export_for_serving or CollectiveStrategy.export_saved_model): in
    place, or into a copy at output_dir. Needs only numpy and stock
    TensorFlow. Returns {table name: rows applied}."""
    if output_dir is not None:
        if os.path.exists(output_dir):
            raise FileExistsError(f"output_dir {output_dir!r} exists")
        shutil.copytree(export_dir, output_dir)
        export_dir = output_dir
    manifest_path = os.path.join(export_dir, "assets.extra", MANIFEST)
    try:
        with open(manifest_path) as f:
            served = {t["name"]: t for t in json.load(f)["tables"]}
    except (OSError, ValueError) as e:
        raise DeltaError(f"{export_dir} has no readable {manifest_path} ({e}); was it written "
                         "by sok.export_for_serving?") from None
    delta = read_serving_delta(delta_dir)
    unknown = sorted(set(delta) - set(served))
    if unknown:
        raise DeltaError(f"the delta has tables {unknown} that the model at {export_dir} does "
                         f"not serve (it serves {sorted(served)})")
    prefix = os.path.join(export_dir, "variables", "variables")
    reader = tf.train.load_checkpoint(prefix)
    tensors = {name: reader.get_tensor(name) for name in reader.get_variable_to_dtype_map()}
    applied = {}
    for name, (entry, keys, rows) in delta.items():
        table = served[name]
        if entry["dimension"] != table["dimension"] or entry["kind"] != table["kind"]:
            raise DeltaError(f"table {name!r}: the delta holds {entry['kind']} rows of "
                             f"dimension {entry['dimension']}; the model serves a "
                             f"{table['kind']} table of dimension {table['dimension']}")
        where = table["checkpoint_keys"]
        dtype = tf.as_dtype(table["dtype"]).as_numpy_dtype
        rows = rows.astype(dtype)
        if table["kind"] == "static":
            values = tensors[where["rows"]].copy()
            if len(keys) and (keys.min() < 0 or keys.max() >= len(values)):
                raise DeltaError(f"table {name!r}: delta row ids must be in [0, {len(values)})")
            values[keys] = rows
            tensors[where["rows"]] = values
        else:
            key_dtype = tf.as_dtype(table["key_dtype"]).as_numpy_dtype
            info = np.iinfo(key_dtype)
            if len(keys) and (keys.min() < info.min or keys.max() > info.max):
                raise DeltaError(f"table {name!r} has {np.dtype(key_dtype).name} keys; the "
                                 f"delta holds keys outside that type's range")
            merged = _merge_dynamic(tensors[where["keys"]].astype(np.int64),
                                    tensors[where["index"]], tensors[where["rows"]],
                                    keys.astype(np.int64), rows)
            tensors[where["keys"]] = merged[0].astype(key_dtype)
            tensors[where["index"]] = merged[1]
            tensors[where["rows"]] = merged[2]
        applied[name] = int(len(keys))
    directory = os.path.dirname(prefix)
    tmp_prefix = os.path.join(directory, f"variables-delta-{uuid.uuid4().hex[:8]}")
    _write_checkpoint(tmp_prefix, tensors)
    old = [f for f in os.listdir(directory)
           if f == "variables.index" or f.startswith("variables.data-")]
    for f in old:
        os.remove(os.path.join(directory, f))
    for f in os.listdir(directory):
        if f.startswith(os.path.basename(tmp_prefix)):
            os.rename(os.path.join(directory, f),
                      os.path.join(directory, "variables" + f[len(os.path.basename(tmp_prefix)):]))
    return applied
