"""Streaming Parquet reader: batches of ragged id columns (values +
row_splits), dense float columns and labels, as numpy arrays or through
tf.data.

Files are split into units of one row group (row groups without rows are
skipped); each worker (rank r of world_size) reads units r, r + world_size,
... of the unit list in the files' order, optionally shuffled among
themselves per epoch. Workers read disjoint data whatever seeds they are
given (the dealing is fixed, as tf.data's shard before a shuffle), and
memory never holds more than a few row groups, whatever the files' size. Every worker yields
as many batches in an epoch as the worker with the fewest rows (with
even_batches=True, the default), so that no worker waits in a collective
for one that has run out. Two background threads
keep both cores busy: one decodes the next row groups (pyarrow releases the
GIL and decodes the columns in parallel), the other cuts them into batches
and converts those, so decoding overlaps conversion and the consumer. List
columns become (values, row_splits) without copying the values.
"""

import os
import queue
import threading

import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 (pa.compute)
import pyarrow.parquet as pq

_DONE = object()


def _refuse_beyond_int64(column, value):
    raise ValueError(f"column '{column}' holds the id {value}, beyond int64 (ids must be "
                     f"< 2**63)")


class ParquetReader:
    """``ParquetReader(files, batch_size, ragged_columns, dense_columns=(),
    label_column="label", rank=0, world_size=1, shuffle=False, seed=0,
    prefetch=2, drop_remainder=False, even_batches=True)``

    Workers read whole row groups, so with several workers the files must
    hold at least world_size row groups with rows (else a ValueError), and
    each worker's row groups need not add up to the same number of rows.
    Every worker must be given the same files in the same order (they deal
    the row groups by position); seeds may differ. With
    even_batches=True (the default) every worker yields the same number of
    batches in an epoch: the fewest any worker's rows make (counted from
    the files' metadata); a worker with more rows leaves the rest unread
    that epoch (with shuffle=True, other rows each epoch). ``batch_counts(epoch)`` gives each worker's
    count before that cut, so the rows left out can be told. A training loop with collectives (every sok
    lookup across workers) needs this: a worker that ran out stopped
    calling them and the others waited forever. even_batches=False reads
    every row, in unequal numbers of batches (for work without collectives,
    such as each worker scoring its own part).

    ragged_columns and dense_columns are lists of column names (or one name);
    a ragged column holds lists of integer ids, dense and label columns
    numbers, checked in every file when the reader is made. Files may differ
    in these types (int32 or int64 ids, float or double numbers).

    Iterating yields dicts: for each ragged column ``name`` two int64 arrays
    ``name`` (values) and ``name_splits`` (row_splits, batch + 1); ``dense``
    a float32 [batch, len(dense_columns)] array (a null is NaN, a missing
    feature); ``label`` float32 [batch] (a null, NaN or infinite label is
    a ValueError: it would make the loss NaN).
    A null list is an empty one (a sample without ids); a null id inside a
    list, or an id of an unsigned column at 2**63 or more (beyond int64), is
    a ValueError, as is a dense value beyond float32's range.
    Each iteration is one epoch; with shuffle=True the order of a worker's
    units differs per epoch (seed + epoch). The files must not change while
    the reader is used: a file whose row groups no longer match what the
    reader counted when it was made is a RuntimeError. Up to ``prefetch`` batches (1 to 1024) are
    converted ahead of the consumer, and one row group is decoded ahead of them.
    ``dataset()`` gives the same batches through tf.data.
    """

    def __init__(self, files, batch_size, ragged_columns, dense_columns=(),
                 label_column="label", rank=0, world_size=1, shuffle=False, seed=0,
                 prefetch=2, drop_remainder=False, even_batches=True):
        if isinstance(files, (str, bytes, os.PathLike)):
            files = [files]
        try:
            # A generator passed `not files` and made an empty reader.
            files = list(files)
        except TypeError:
            raise TypeError(f"files must be a path or a list of paths of Parquet files; got "
                            f"{files!r}") from None
        if not files:
            raise ValueError("files must name at least one Parquet file")
        if not _is_int(batch_size) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer; got {batch_size!r}")
        # Floats failed later, in a slice ("slice indices must be integers").
        if not _is_int(world_size) or world_size < 1:
            raise ValueError(f"world_size must be a positive integer; got {world_size!r}")
        if not _is_int(rank) or not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, world_size={world_size}), an integer; got "
                             f"{rank!r}")
        if not _is_int(seed) or seed < 0:
            raise ValueError(f"seed must be a non-negative integer; got {seed!r}")
        if not _is_int(prefetch) or not 1 <= prefetch <= 1024:
            # 0 and -5 were read as 1; 10**12 made a queue without a bound.
            raise ValueError(f"prefetch must be an integer in [1, 1024] (batches read ahead); "
                             f"got {prefetch!r}")
        for flag, value in (("shuffle", shuffle), ("drop_remainder", drop_remainder),
                            ("even_batches", even_batches)):
            if not isinstance(value, (bool, np.bool_)):
                raise TypeError(f"{flag} must be True or False; got {value!r}")
        self.files = [os.fsdecode(f) if isinstance(f, (bytes, os.PathLike)) else f
                      for f in files]
        # A file named twice (or by two spellings, or through a hard link or
        # a bind mount, which only the device and inode numbers tell) had
        # every row read twice an epoch, without a word.
        first = {}
        for i, f in enumerate(self.files):
            if isinstance(f, str):
                try:
                    found = os.stat(f)
                    real = (found.st_dev, found.st_ino)
                except OSError:  # missing: the read names it
                    real = os.path.realpath(f)
                if real in first:
                    j = first[real]
                    raise ValueError(
                        f"files[{i}] ({f!r}) is the file files[{j}] ({self.files[j]!r}) names "
                        f"too: each of its rows would be read twice an epoch; give each file "
                        f"once")
                first[real] = i
        self.batch_size = int(batch_size)
        self.ragged_columns = _names("ragged_columns", ragged_columns)
        self.dense_columns = _names("dense_columns", dense_columns)
        if label_column is not None and not isinstance(label_column, str):
            raise TypeError(f"label_column must be a column name or None; got {label_column!r}")
        self.label_column = label_column
        _check_output_keys(self.ragged_columns, self.dense_columns, label_column)
        if not (self.ragged_columns or self.dense_columns or label_column):
            # A batch of nothing: iterating gave no batch of a file of rows,
            # and dataset() failed in TensorFlow naming no argument.
            raise ValueError("ragged_columns, dense_columns and label_column name no column: "
                             "a batch needs at least one")
        self.rank, self.world_size = int(rank), int(world_size)
        self.shuffle, self.seed = bool(shuffle), int(seed)
        self.prefetch = int(prefetch)
        self.drop_remainder = bool(drop_remainder)
        self.even_batches = bool(even_batches)
        self._epoch = 0
        self._units = []
        self._layout = {}  # file: its row groups' numbers of rows, when counted
        for f in self.files:
            if not isinstance(f, str):
                raise TypeError(f"files must be paths of Parquet files; got {f!r}")
            try:
                meta = pq.ParquetFile(f).metadata
            except (OSError, pa.ArrowException) as e:
                # pyarrow's "Parquet file size is 0 bytes" named no file.
                raise type(e)(f"{f}: not a readable Parquet file: {e}") from None
            schema = meta.schema.to_arrow_schema()
            for name in self.columns:
                if name not in schema.names:
                    raise ValueError(f"column '{name}' is not in {f}; it has {schema.names}")
                if len(schema.get_all_field_indices(name)) > 1:
                    # pyarrow said "Column a does not exist in schema".
                    raise ValueError(f"{f} has {len(schema.get_all_field_indices(name))} "
                                     f"columns named '{name}'; a column read must be named "
                                     f"once")
            self._check_types(f, schema)
            self._layout[f] = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
            # A row group without rows is no worker's share: dealt as one, it
            # left a worker nothing to read, and with even_batches every
            # worker read nothing.
            self._units.extend((f, g) for g, rows in enumerate(self._layout[f]) if rows)
        if 1 < self.world_size and len(self._units) < self.world_size:
            # Workers read whole row groups: those past the last one got no
            # batch at all, and a synchronous job waited for them forever.
            raise ValueError(
                f"the files hold {len(self._units)} row group(s) with rows, fewer than "
                f"world_size={self.world_size}: workers {len(self._units)}.."
                f"{self.world_size - 1} would read nothing; write the files with smaller row "
                f"groups, or use fewer workers")

    def _check_types(self, path, schema):
        """ValueError naming the file, the column and its type where a
        column cannot be read as asked: a ragged column that is not a list
        of integers, a dense or label column that is not numbers (they
        failed mid-epoch with "'Int64Array' object has no attribute
        'offsets'", "could not convert string to float" or "setting an
        array element with a sequence", naming no column)."""
        for name in self.ragged_columns:
            t = schema.field(name).type
            if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or \
                    not pa.types.is_integer(t.value_type):
                raise ValueError(f"column '{name}' must hold lists of integer ids (a ragged "
                                 f"column); in {path} it is {t}")
        numeric = self.dense_columns + ([self.label_column] if self.label_column else [])
        for name in numeric:
            t = schema.field(name).type
            if not (pa.types.is_integer(t) or pa.types.is_floating(t) or
                    pa.types.is_boolean(t)):
                what = "a dense column" if name in self.dense_columns else "the label column"
                raise ValueError(f"column '{name}' must hold numbers ({what}); in {path} it "
                                 f"is {t}")

    @property
    def columns(self):
        cols = self.ragged_columns + self.dense_columns
        return cols + ([self.label_column] if self.label_column else [])

    def _my_units(self, epoch):
        """This worker's units in epoch `epoch`'s order. The dealing does not
        depend on the seed: workers given different seeds (tf.data's habit:
        shard, then shuffle with the worker's own seed) dealt a shuffled list
        each, read some row groups twice and others never, and counted
        different numbers of batches for even_batches."""
        units = self._units[self.rank::self.world_size]
        if self.shuffle:
            order = np.random.default_rng(self.seed + epoch).permutation(len(units))
            units = [units[i] for i in order]
        return units

    def batch_counts(self, epoch=0):
        """The number of batches each worker's row groups make in epoch
        `epoch` (a list, by rank; the same every epoch), before even_batches
        cuts them to the smallest: from the files' metadata, without reading
        them."""
        if not _is_int(epoch) or epoch < 0:
            raise ValueError(f"epoch must be a non-negative integer; got {epoch!r}")
        counts = []
        for r in range(self.world_size):
            rows = sum(self._layout[f][g] for f, g in self._units[r::self.world_size])
            full, rest = divmod(rows, self.batch_size)
            counts.append(full + (1 if rest and not self.drop_remainder else 0))
        return counts

    def _tables(self, epoch):
        units = self._my_units(epoch)
        left = {}  # file: its units still to read (it is closed after the last)
        for f, _ in units:
            left[f] = left.get(f, 0) + 1
        files = {}
        try:
            for f, g in units:
                if f not in files:
                    files[f] = self._open_unchanged(f)
                table = files[f].read_row_group(g, columns=self.columns)
                left[f] -= 1
                if not left[f]:
                    # Kept open to the epoch's end, a data set of more files
                    # than the process may open failed mid-epoch ("Too many
                    # open files").
                    _close(files.pop(f))
                yield table
        finally:
            for handle in files.values():
                _close(handle)

    def _open_unchanged(self, path):
        """pq.ParquetFile(path), or a RuntimeError where its row groups are
        no longer those counted when the reader was made: the batch counts
        (and with them even_batches' promise of equal counts) came from
        them."""
        handle = pq.ParquetFile(path)
        meta = handle.metadata
        now = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        if now != self._layout[path]:
            _close(handle)
            raise RuntimeError(f"{path} changed after the reader was made: its row groups hold "
                               f"{now} rows, where the reader counted {self._layout[path]}; "
                               f"make a new reader for the new files")
        return handle

    def _batches(self, epoch):
        """Tables of batch_size rows (the last may be shorter), carrying rows
        over from one row group to the next. Row groups are decoded one
        ahead, in a thread of their own."""
        pending, rows = [], 0
        for table in _background(lambda: self._tables(epoch), 1):
            pending.append(table)
            rows += table.num_rows
            if rows < self.batch_size:
                continue
            merged = self._concat(pending)
            start = 0
            while merged.num_rows - start >= self.batch_size:
                yield merged.slice(start, self.batch_size)
                start += self.batch_size
            pending = [merged.slice(start)] if start < merged.num_rows else []
            rows = merged.num_rows - start
        if rows and not self.drop_remainder:
            yield self._concat(pending)

    def _concat(self, tables):
        """One table of `tables` (row groups, possibly of different files).
        Files of one data set may differ in their columns' types (int32 or
        int64 ids, float or double labels), which pa.concat_tables refused
        ("Schema at index 1 was different") for a batch spanning two such
        files: their columns are then cast to one type each, ids to int64
        and numbers to float64, as the batch holds them in the end."""
        first = tables[0].schema
        if all(t.schema.equals(first) for t in tables[1:]):
            return pa.concat_tables(tables)
        ragged = set(self.ragged_columns)

        def common(t):
            for f in t.schema:
                # The cast below wraps uint64 ids of 2**63 or more around to
                # negative ids, where _convert would have refused them.
                if f.name in ragged and getattr(f.type, "value_type", None) == pa.uint64():
                    top = pa.compute.max(pa.compute.list_flatten(t.column(f.name))).as_py()
                    if top is not None and top >= 1 << 63:
                        _refuse_beyond_int64(f.name, top)
            return t.cast(pa.schema([pa.field(f.name, pa.list_(pa.int64()) if f.name in ragged
                                              else pa.float64()) for f in t.schema]),
                          safe=False)

        return pa.concat_tables([common(t) for t in tables])

    def _convert(self, table):
        out = {}
        for name in self.ragged_columns:
            col = table.column(name)
            # combine_chunks copies even a single chunk; only a batch that
            # straddles row groups has several.
            col = col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()
            offsets = _view(col.offsets, name)
            values = _view(col.values, name)
            first = offsets[0]
            ids = values[first:offsets[-1]]
            if ids.dtype == np.uint64 and len(ids) and ids.max() >= np.uint64(1 << 63):
                # astype(int64) made 2**64 - 1 the id -1.
                _refuse_beyond_int64(name, int(ids.max()))
            out[name] = ids.astype(np.int64, copy=False)
            splits = offsets.astype(np.int64)
            if first:  # a batch that starts inside a row group
                splits -= first
            out[name + "_splits"] = splits
        if self.dense_columns:
            # Column by column into [columns, rows], then one transposing
            # copy: a third of the time of writing the strided columns of a
            # [rows, columns] matrix.
            dense = np.empty((len(self.dense_columns), table.num_rows), np.float32)
            for i, c in enumerate(self.dense_columns):
                dense[i] = _floats(table.column(c), c)
            out["dense"] = np.ascontiguousarray(dense.T)
        if self.label_column:
            raw = _numbers(table.column(self.label_column))
            with np.errstate(over="ignore"):
                labels = raw.astype(np.float32, copy=False)
            # A dense column's null is a missing feature (NaN); a missing,
            # NaN or infinite label made the loss, and from it every weight,
            # NaN.
            bad = np.flatnonzero(~np.isfinite(labels))
            if len(bad):
                value = raw[bad[0]]
                what = ("beyond float32's range" if np.isfinite(np.float64(value))
                        else "a null, NaN or infinite label")
                raise ValueError(f"label column '{self.label_column}' holds {value!r}, {what} "
                                 f"(row {int(bad[0])} of a batch of {len(labels)}); every "
                                 f"label must be a finite float32 number")
            out["label"] = labels
        return out

    def _epoch_batches(self, epoch):
        """This worker's batches of epoch `epoch`: with even_batches, as
        many as the worker with the fewest makes."""
        batches = self._batches(epoch)
        if not self.even_batches or self.world_size == 1:
            return batches
        return _first(batches, min(self.batch_counts(epoch)))

    def __iter__(self):
        epoch = self._epoch
        self._epoch += 1
        return _background(lambda: map(self._convert, self._epoch_batches(epoch)),
                           self.prefetch)

    def dataset(self, ragged=True):
        """The batches as a tf.data.Dataset of dicts (one epoch per
        iteration), with ragged columns as tf.RaggedTensor; with
        ragged=False, in the iterator's structure (values and row_splits
        tensors per ragged column).

        ragged=False is the faster way into a training step that runs as a
        tf.function and builds its RaggedTensors there
        (tf.RaggedTensor.from_row_splits(values, splits, validate=False) costs
        nothing in a graph): a RaggedTensor inside a tf.data element is
        encoded into a variant (TensorFlow 2.15 checks its row_splits element
        by element), decoded on the way out and, when the dataset is iterated
        eagerly, rebuilt in Python.

        tf.data's autotuner is off for this pipeline (Dataset.with_options
        with options.autotune.enabled = True turns it back on): there is
        nothing in it to tune, and its bookkeeping cost 15-30% of the
        throughput on 2 cores (bench/data_bench.py). A reader of one worker's
        part (world_size > 1) turns tf.data's auto-sharding off: a
        multi-worker strategy's experimental_distribute_dataset takes the
        part whole."""
        if not isinstance(ragged, bool):
            raise TypeError(f"ragged must be True or False; got {ragged!r}")
        import tensorflow as tf

        from sok_graph import compat

        signature = {}
        for name in self.ragged_columns:
            signature[name] = tf.TensorSpec([None], tf.int64)
            signature[name + "_splits"] = tf.TensorSpec([None], tf.int64)
        if self.dense_columns:
            signature["dense"] = tf.TensorSpec([None, len(self.dense_columns)], tf.float32)
        if self.label_column:
            signature["label"] = tf.TensorSpec([None], tf.float32)
        columns = self.ragged_columns

        def to_ragged(batch):
            out = {k: v for k, v in batch.items() if not k.endswith("_splits") and k not in columns}
            for name in columns:
                out[name] = tf.RaggedTensor.from_row_splits(batch[name], batch[name + "_splits"],
                                                            validate=False)
            return out

        # With the autotuner off, AUTOTUNE takes tf.data's fixed defaults (a
        # map call per core, a prefetch buffer that grows while the consumer
        # waits).
        autotune = tf.data.experimental.AUTOTUNE
        ds = compat.dataset_from_generator(self.__iter__, signature)
        if ragged:
            ds = ds.map(to_ragged, num_parallel_calls=autotune)
        options = tf.data.Options()
        if compat.IS_TF1:
            options.experimental_optimization.autotune = False
        else:
            options.autotune.enabled = False
        policy = getattr(tf.data.experimental, "AutoShardPolicy", None)
        if self.world_size > 1 and policy is not None:
            # The reader gives this worker its own part already: a
            # MultiWorkerMirroredStrategy's experimental_distribute_dataset
            # sharded that part again (tf.data's AUTO policy falls back to
            # every world_size-th batch), so each worker trained on 1/N of its
            # rows, 1/N of the data in all, and the workers' batch counts
            # differed (even_batches promises them equal), without an error.
            options.experimental_distribute.auto_shard_policy = policy.OFF
        return ds.prefetch(autotune).with_options(options)


def _first(iterator, n):
    """The first n items of a generator, which is closed after them (its
    background decoding stops)."""
    try:
        for _ in range(n):
            try:
                item = next(iterator)
            except StopIteration:
                return
            yield item
    finally:
        iterator.close()


def _is_int(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _names(what, columns):
    """A list of column names; one name is a list of it, as `files` takes one
    file (list("ids") made the columns 'i', 'd', 's')."""
    if isinstance(columns, str):
        return [columns]
    if isinstance(columns, bytes) or not hasattr(columns, "__iter__"):
        # bytes were iterated into numbers ("got 108"); None and numbers
        # failed with "'NoneType' object is not iterable".
        raise TypeError(f"{what} must be a column name or a list of column names; got "
                        f"{columns!r}")
    columns = list(columns)
    bad = [c for c in columns if not isinstance(c, str)]
    if bad:
        raise TypeError(f"{what} must hold column names (str); got {bad[0]!r}")
    return columns


def _check_output_keys(ragged, dense, label):
    """ValueError where two outputs would share a key of the batch dict: a
    ragged column 'x' gives 'x' and 'x_splits', the dense columns 'dense',
    the label 'label'. A ragged column named 'label' or 'dense', or one
    beside a ragged column 'x_splits', had its values replaced in every
    batch without an error."""
    owner = {}
    for name in ragged:
        for key in (name, name + "_splits"):
            owner.setdefault(key, []).append(f"ragged column '{name}'")
    if dense:
        owner.setdefault("dense", []).append("the dense columns")
    if label:
        owner.setdefault("label", []).append(f"label column '{label}'")
    for key, who in owner.items():
        if len(who) > 1:
            raise ValueError(f"{' and '.join(who)} would both be the batch's '{key}'; rename a "
                             f"column, or list a ragged column once")


def _view(array, column):
    """A numpy view of a primitive Arrow array's values, without copying
    (pyarrow's to_numpy costs ~70 us a call with NumPy 2, a few ms a batch)."""
    if not pa.types.is_integer(array.type):
        raise ValueError(f"column '{column}' must hold lists of integer ids; its values are "
                         f"{array.type}")
    if array.null_count:
        raise ValueError(f"column '{column}' holds null ids; every id must be a number")
    dtype = np.dtype(str(array.type))  # int8 ... uint64: the same names in NumPy
    return np.frombuffer(array.buffers()[1], dtype, len(array), array.offset * dtype.itemsize)


def _floats(column, name):
    """A dense column's values as float32: a view where it is one float32
    chunk without nulls, else pyarrow's conversion (nulls become NaN, other
    numeric types are cast; a finite value beyond float32's range is a
    ValueError: it became infinite without a word)."""
    if column.num_chunks == 1 and column.null_count == 0:
        chunk = column.chunk(0)
        data = chunk.buffers()[1]
        if chunk.type == pa.float32() and data is not None:
            return np.frombuffer(data, np.float32, len(chunk), chunk.offset * 4)
    raw = _numbers(column)
    with np.errstate(over="ignore", invalid="ignore"):
        values = raw.astype(np.float32)
    overflow = np.flatnonzero(np.isinf(values) & np.isfinite(raw.astype(np.float64)))
    if len(overflow):
        raise ValueError(f"dense column '{name}' holds {float(raw[overflow[0]])!r} (row "
                         f"{int(overflow[0])} of a batch of {len(raw)}), beyond float32's range")
    return values


def _numbers(column):
    """A number column as numpy, a null as NaN (pyarrow gives a bool
    column's nulls as None in an object array)."""
    raw = column.to_numpy()
    if raw.dtype == object:
        raw = np.array([np.nan if v is None else v for v in raw], np.float64)
    return raw


def _close(handle):
    """Closes a pq.ParquetFile (pyarrow < 8 has no close; its file goes with
    the object)."""
    close = getattr(handle, "close", None)
    if close is not None:
        close()


def _background(make_iterator, depth):
    """Iterates make_iterator() in a thread of its own, at most `depth` items
    ahead of the consumer. Exceptions reach the consumer; a consumer that
    stops early stops the thread."""
    q = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()

    def produce():
        try:
            for item in make_iterator():
                if stop.is_set():
                    return
                q.put(item)
            q.put(_DONE)
        except BaseException as e:  # surfaced in the consumer
            q.put(e)

    worker = threading.Thread(target=produce, daemon=True)
    worker.start()
    try:
        while True:
            item = q.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        while worker.is_alive():  # unblock a producer waiting on a full queue
            try:
                q.get_nowait()
            except queue.Empty:
                worker.join(0.01)
