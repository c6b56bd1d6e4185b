"""SOK 1.x's API on sok_graph's engine: `sok.Init` and the Session helpers
(session.py), the All2AllDenseEmbedding / DistributedEmbedding layers
(embedding_layers.py), `sok.optimizers` and `OptimizerScope` (optimizers.py)
and `sok.Saver` (saver.py). sok_graph/__init__.py exports the public names."""
