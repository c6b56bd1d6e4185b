"""Every ```python block of README.md and docs/*.md runs, as written, in a
fresh process.

A block that uses names it does not define (a model, a batch, a session)
gets them from a prelude written here, and a few lines after it check what
the block promises. Blocks that need several processes (Horovod) are named
in ELSEWHERE with the test that runs the same calls. A block found in the
documents and named nowhere here fails the test, so a new snippet comes with
its check.
"""

import glob
import os
import re
import subprocess
import sys
import textwrap

import pytest
import tensorflow as tf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
IS_TF1 = tf.__version__.startswith("1.")

# TF 1.x starts in graph mode; the TF2-style blocks need eager execution.
_HEADER = "import tensorflow as tf\nif tf.__version__.startswith('1.'):\n" \
          "    tf.compat.v1.enable_eager_execution()\n"


def blocks():
    """(document, first line of the block, code) of every python block."""
    found = []
    for path in [os.path.join(ROOT, "README.md")] + sorted(glob.glob(
            os.path.join(ROOT, "docs", "*.md"))):
        text = open(path, encoding="utf-8").read()
        for code in re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
            found.append((os.path.relpath(path, ROOT), code.splitlines()[0].strip(), code))
    return found


_SERVING_MODEL = """
import datetime, time
import numpy as np
import sok_graph as sok
sok.init()

class Model(tf.Module):
    def __init__(self):
        self.user_table = sok.DynamicVariable(4, initializer="zeros", name="user")
        self.item_table = sok.Variable(tf.ones([10, 4]), name="item")

    def __call__(self, inputs):
        ids = tf.RaggedTensor.from_tensor(inputs["ids"])
        a, b = sok.lookup_sparse([self.user_table, self.item_table], [ids, ids % 10],
                                 combiners=["sum", "mean"])
        return {"score": tf.reduce_sum(a + b, 1)}

model = Model()
user_table, item_table = model.user_table, model.item_table
sok.assign(user_table, tf.constant([1, 2, 3], tf.int64), tf.ones([3, 4]))

def train():
    time.sleep(0.01)
    sok.assign(user_table, tf.constant([2, 7], tf.int64), tf.fill([2, 4], 5.0))
"""

# document, first line of the block -> (prelude, checks after it, TF2 only)
RUN = {
    ("README.md", "import tensorflow as tf"): ("", """
assert isinstance(grads[0], tf.IndexedSlices) and isinstance(grads[1], tf.IndexedSlices)
assert sorted(grads[1].indices.numpy().tolist()) == [1, 4]
""", False),
    ("README.md", 'items = sok.DynamicVariable(16, initializer="normal")          '
                  '# grows without bound'): ("""
import sok_graph as sok
sok.init()
item_ids = tf.ragged.constant([[5, 9], [2 ** 40]], tf.int64)
user_ids = tf.ragged.constant([[1], [2, 3]], tf.int64)
""", """
assert emb_items.shape == (2, 16) and emb_users.shape == (2, 16)
assert int(items.size[0]) == 3 and int(users.size[0]) == 3
""", False),
    ("README.md", "opt = sok.OptimizerWrapper(tf.keras.optimizers.Adam(0.01))   "
                  "# or any tf.compat.v1.train optimizer"): ("""
import datetime
import numpy as np
import sok_graph as sok
sok.init()
user = sok.Variable(tf.ones([20, 4]), name="user")
items = sok.DynamicVariable(4, initializer="zeros", name="items")
utc_datetime = datetime.datetime.now(datetime.timezone.utc)
with tf.GradientTape() as tape:
    a, b = sok.lookup_sparse([user, items], [tf.ragged.constant([[1, 2]], tf.int64),
                                             tf.ragged.constant([[7, 2 ** 40]], tf.int64)],
                             combiners=["sum", "sum"])
    loss = tf.reduce_sum(a * b) + tf.reduce_sum(a)
""", """
assert sorted(np.asarray(keys[0]).tolist()) == [7, 2 ** 40], keys  # one entry per table
assert np.asarray(rows[0]).shape == (2, 4)
assert not np.array_equal(user.numpy()[1], np.ones(4, np.float32))
""", False),
    ("README.md", "from sok_graph.data.parquet import ParquetReader"): ("""
import pyarrow as pa
import pyarrow.parquet as pq
pq.write_table(pa.table({"label": [0.0, 1.0, 1.0], "C1": [[1, 2], [3], []],
                         "C2": [[4], [5, 6], [7]], "I1": [0.5, 1.5, 2.5],
                         "I2": [1.0, 2.0, 3.0]}), "part-0.parquet")
files, rank, n = ["part-0.parquet"], 0, 1
""", """
rows = sum(len(b["label"]) for b in reader)
assert rows == 3, rows
""", False),
    ("docs/serving.md", 'sok.export_for_serving(model, "export/1", input_signature=['):
        (_SERVING_MODEL, """
assert "serving_default" in loaded.signatures
""", True),
    ("docs/serving.md", "def build():                      # the serving graph, built anew"): ("""
import sok_graph as sok
tf.compat.v1.disable_eager_execution()
sok.init()

class MyModel:
    def __init__(self):
        self.table = sok.Variable(tf.ones([10, 4]), name="emb")

    def __call__(self, ids):
        return tf.reduce_sum(sok.lookup_sparse(self.table, ids, combiners="sum"), 1)

training = MyModel()
sess = tf.compat.v1.Session()
sess.run(tf.compat.v1.global_variables_initializer())
""", """
import os
assert os.path.exists("export/1/saved_model.pb")
""", False),
    ("docs/serving.md", "# since: when the export read its tables (UTC microseconds; "
                        "a datetime too)"): (_SERVING_MODEL + """
import json
sok.export_for_serving(model, "export/1", input_signature=[
    {"ids": tf.TensorSpec([None, 3], tf.int64, name="ids")}])
""", """
keys = np.load("deltas/0001/user.keys.npy")
assert sorted(keys.tolist()) == [2, 7], keys
""", True),
    ("docs/serving.md", 't = loaded.sok_tables["user"]'): (_SERVING_MODEL + """
sok.export_for_serving(model, "export/1", input_signature=[
    {"ids": tf.TensorSpec([None, 3], tf.int64, name="ids")}])
since = time.time() * 1e6
train()
sok.export_serving_delta([user_table, item_table], since, "deltas/0001")
loaded = tf.saved_model.load("export/1")
""", """
got = loaded.signatures["serving_default"](ids=tf.constant([[7, 7, 7]], tf.int64))["score"]
assert abs(float(got.numpy()[0]) - (3 * 5 * 4 + 4)) < 1e-5, got
""", True),
    ("docs/sok_compat.md", 'gpus = tf.config.experimental.list_physical_devices("GPU")'): ("""
import sok_graph as sok
hvd = None  # the block only asks Horovod for its rank where there are GPUs
""", """
assert sok.context.communicator().world_size == 1
""", False),
}

# Blocks that need several worker processes: the test running the same calls.
ELSEWHERE = {
    ("README.md", "sok_init_op = sok.Init(global_batch_size=1024)   "
                  "# graph mode: an op; TF2: runs at once (None)"):
        "tests/test_v1_api.py (sok.Init, All2AllDenseEmbedding, DistributedEmbedding, "
        "split_embedding_variable_from_others, OptimizerScope in both modes)",
    ("README.md", "import horovod.tensorflow as hvd"):
        "tests/test_multiworker.py and tests/multiworker/train_worker.py (Horovod workers)",
    ("docs/multiworker.md", "import horovod.tensorflow as hvd"):
        "tests/test_multiworker.py and tests/multiworker/train_worker.py (Horovod workers)",
}


def test_every_block_is_run_or_named():
    found = {(doc, first) for doc, first, _ in blocks()}
    assert found, f"no python blocks found under {ROOT} (README.md, docs/*.md)"
    named = set(RUN) | set(ELSEWHERE)
    assert found - named == set(), "python blocks with no check in this file"
    assert named - found == set(), "checks of blocks no document has any more"


@pytest.mark.parametrize("key", sorted(RUN), ids=lambda k: f"{k[0]}:{k[1][:40]}")
def test_block_runs(key, tmp_path):
    prelude, checks, tf2_only = RUN[key]
    if tf2_only and IS_TF1:
        pytest.skip("the block uses TF2 (tf.saved_model.load of a TF2 SavedModel)")
    code = [c for doc, first, c in blocks() if (doc, first) == key][0]
    if "horovod" in code or key[0] == "docs/sok_compat.md":
        pytest.importorskip("horovod.tensorflow")
    if "ParquetReader" in code:
        pytest.importorskip("pyarrow")
    script = tmp_path / "snippet.py"
    script.write_text(_HEADER + textwrap.dedent(prelude) + "\n" + code + "\n" +
                      textwrap.dedent(checks) + "\nprint('snippet ok')\n")
    proc = subprocess.run([sys.executable, str(script)], cwd=str(tmp_path),
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300, env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"))
    assert proc.returncode == 0 and "snippet ok" in proc.stdout, (
        f"{key[0]} block '{key[1]}' failed:\n{proc.stdout[-4000:]}")
