"""Bytes each worker sends per training step: sok_graph's deduplicated
all-to-all lookup vs an all-gather-based lookup (SOK 1.x's distributed
embedding), from the formulas in docs/multiworker.md.

The only measured input is the share of distinct ids in a worker's batch,
rho(n), sampled here from the Zipf distribution the benchmarks use.

    python bench/comm_cost_model.py [--batch 65536] [--tables 26] [--hotness 3] [--dim 16]
"""

import argparse

import numpy as np

KEY_BYTES, VALUE_BYTES = 8, 4


def distinct_share(n, zipf, vocab, rng):
    """rho(n): distinct ids / ids among n Zipf-distributed ids."""
    ids = np.minimum(rng.zipf(zipf, n) - 1, vocab - 1)
    return len(np.unique(ids)) / n


def alltoall_bytes(b, h, d, n_workers, rho):
    """sok_graph, per worker and table: the distinct ids go to their owners
    ((N-1)/N of them leave the worker), rows come back, and in the backward
    one gradient row per distinct id goes back to its owner."""
    u = rho * b * h
    remote = (n_workers - 1) / n_workers
    return u * remote * (KEY_BYTES + 2 * d * VALUE_BYTES)


def allgather_bytes(b, h, d, n_workers):
    """All-gather lookup, per worker and table: every worker's ids go to every
    other worker (ring all-gather: (N-1) * b * h keys sent); each worker
    combines its own rows for the whole global batch and a reduce-scatter
    returns [b, d] per worker ((N-1) * b * d values sent); the backward
    all-gathers the [b, d] gradients ((N-1) * b * d values sent)."""
    return (n_workers - 1) * b * (h * KEY_BYTES + 2 * d * VALUE_BYTES)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=65536, help="global batch")
    p.add_argument("--tables", type=int, default=26)
    p.add_argument("--hotness", type=int, default=3, help="ids per sample per table")
    p.add_argument("--dim", type=int, default=16)
    p.add_argument("--zipf", type=float, default=1.2)
    p.add_argument("--vocab", type=int, default=10_000_000)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    print(f"global batch {args.batch}, {args.tables} tables, hotness {args.hotness}, dim "
          f"{args.dim}, Zipf {args.zipf} over {args.vocab:,} ids")
    print(f"{'workers':>7s} {'ids/worker':>10s} {'rho':>6s} {'all-to-all MB':>14s} "
          f"{'all-gather MB':>14s} {'ratio':>7s}")
    for n in (8, 64, 512):
        b = args.batch // n
        rho = distinct_share(b * args.hotness, args.zipf, args.vocab, rng)
        ours = args.tables * alltoall_bytes(b, args.hotness, args.dim, n, rho)
        theirs = args.tables * allgather_bytes(b, args.hotness, args.dim, n)
        print(f"{n:7d} {b * args.hotness:10d} {rho:6.3f} {ours / 1e6:14.2f} "
              f"{theirs / 1e6:14.2f} {theirs / ours:6.1f}x")


if __name__ == "__main__":
    main()
