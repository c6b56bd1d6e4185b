"""Key streams shaped like production features: ids from a Zipf or uniform
distribution over a vocabulary, hashed into the 63-bit key space (the
benchmarks of dynamic tables feed them; row numbers would flatter a hash
table)."""

import numpy as np


def hashed(ids):
    """splitmix64 of the ids, into [0, 2**63): distinct ids give distinct,
    evenly spread keys."""
    x = np.asarray(ids).astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    x = x ^ (x >> np.uint64(31))
    return (x & np.uint64((1 << 63) - 1)).astype(np.int64)


def draw_ids(rng, alpha, vocab, size):
    """ids in [0, vocab): Zipf(alpha) ranks (the tail past vocab folded back
    in), or uniform when alpha <= 0."""
    if alpha <= 0:
        return rng.integers(0, vocab, size=size)
    return (rng.zipf(alpha, size=size) - 1) % vocab
