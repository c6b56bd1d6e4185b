"""Writing the SavedModel of export_saved_model: the serving graph is built as
one process would build it (export mode), with the trained values loaded.
"""

import os
import threading

import tensorflow as tf

from sok_graph import communication, context

_export_mode = threading.local()


def _exporting():
    return getattr(_export_mode, "on", False)


def _write_saved_model(export_dir, values, signature_def_fn, assets_extra, as_text,
                       clear_devices, strip_default_attrs, comm):
    saved_comm = context._communicator
    _export_mode.on = True
    # While the serving graph is built, sok_graph acts as one process: any
    # sok.Variable created there holds its whole table.
    context._communicator = communication.SingleProcess()
    try:
        with tf.Graph().as_default() as g:
            result = signature_def_fn()
            main_op = None
            if isinstance(result, (tuple, list)):
                result, main_op = result[0], (result[1] if len(result) > 1 else None)
            variables = g.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
            missing = [v.op.name for v in variables if v.op.name not in values]
            if missing:
                tf.compat.v1.logging.warning(
                    "export_saved_model: no trained value for %s; they keep their "
                    "initializers' values", missing)
            with tf.compat.v1.Session(graph=g) as sess:
                sess.run(tf.compat.v1.global_variables_initializer())
                for v in variables:
                    if v.op.name in values:
                        v.load(values[v.op.name], sess)
                builder = tf.compat.v1.saved_model.Builder(export_dir)
                builder.add_meta_graph_and_variables(
                    sess, [tf.saved_model.SERVING], signature_def_map=result,
                    assets_collection=g.get_collection(
                        tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
                    main_op=main_op, strip_default_attrs=strip_default_attrs,
                    clear_devices=clear_devices)
                builder.save(as_text=as_text)
        if assets_extra:
            extra = os.path.join(export_dir, "assets.extra")
            for dst, src in assets_extra.items():
                target = os.path.join(extra, dst)
                tf.io.gfile.makedirs(os.path.dirname(target))
                tf.io.gfile.copy(src, target, overwrite=True)
        return export_dir
    finally:
        _export_mode.on = False
        context._communicator = saved_comm
