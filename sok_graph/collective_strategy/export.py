"""Writing the SavedModel of export_saved_model, through sok.export_for_serving's
graph writer (sok_graph/serving/export.py): the serving graph is built as one
process would build it, in serving mode, with the trained values loaded.
"""

from sok_graph.serving import mode as serving_mode
from sok_graph.serving.export import write_graph_saved_model


def _exporting():
    """Whether a serving graph is being built (partitioned get_variable then
    makes one ordinary variable of the whole table)."""
    return serving_mode.active()


def _write_saved_model(export_dir, values, signature_def_fn, assets_extra, as_text,
                       clear_devices, strip_default_attrs, comm, table_sources=None,
                       source_runner=None):
    return write_graph_saved_model(
        export_dir, signature_def_fn, values, table_sources or {}, source_runner,
        assets_extra=assets_extra, as_text=as_text, clear_devices=clear_devices,
        strip_default_attrs=strip_default_attrs, rank=comm.rank,
        what="CollectiveStrategy.export_saved_model")
