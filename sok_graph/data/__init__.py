"""Data for examples, tests and benchmarks."""

from sok_graph.data.synthetic import PlantedDataset, make_planted_dataset  # noqa: F401
