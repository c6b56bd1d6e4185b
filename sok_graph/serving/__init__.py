"""Servable models and delta updates of sok tables (docs/serving.md).

export.py   export_for_serving: a SavedModel with no sok_graph op (sok tables
            become plain variables, sok lookups stock TensorFlow ops)
delta.py    export_serving_delta / apply_serving_delta: the rows changed
            since a time, as small checked files, and their application
mode.py     serving mode, which the lookups consult
tables.py   the serving tables and the stock-op lookup
sources.py  sok tables read whole, in chunks
collective.py  what the workers learn from each other: the earliest clock
            (an export's or a delta's created) and whether rank 0 failed

The package imports nothing here, so that the lookups and tables can
import serving.mode without a cycle; sok_graph's top level exports the
three public functions.
"""
