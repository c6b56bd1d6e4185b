"""Key streams shaped like production features: ids from a Zipf or uniform
distribution over a vocabulary, hashed into the 63-bit key space (the
benchmarks of dynamic tables feed them; row numbers would flatter a hash
table)."""

import numpy as np


_MASK = np.uint64((1 << 63) - 1)


def hashed(ids):
    """Integer ids in [0, 2**63) mixed into keys in [0, 2**63), evenly
    spread; distinct ids give distinct keys. splitmix64's steps taken modulo
    2**63 (an add, shifts that stay inside 63 bits and odd multipliers are
    each one-to-one there): splitmix64 itself, masked to 63 bits, sent two
    ids to one key. A negative id, one of 2**63 or more, or a float that is
    not a whole number is a ValueError (a float was truncated: 1.0, 1.5 and
    1.9 gave one key)."""
    ids = np.asarray(ids)
    if ids.dtype.kind == "b":  # as 0 and 1: numpy 2 refuses a bool's compare with 2**63
        ids = ids.astype(np.uint8)
    if ids.dtype.kind == "f":
        # As float64, where 2**63 is a number (float16 made it infinite, with
        # an overflow warning, to compare with).
        ids = ids.astype(np.float64)
        whole = np.isfinite(ids) & (ids == np.floor(ids))
        if not whole.all():
            bad = ids[~whole].flat[0].item()
            raise ValueError(f"ids must be whole numbers; got {bad!r}")
    elif ids.dtype.kind not in "iu":
        raise TypeError(f"ids must be integers; got {ids.dtype}")
    # As Python numbers: numpy before 1.25 compared an int64 with the int
    # 2**63 as float64, where 2**63 - 1 is 2**63, and refused the top 512 ids.
    low, high = (ids.min().item(), ids.max().item()) if ids.size else (0, 0)
    if low < 0 or high >= 2 ** 63:
        bad = low if low < 0 else high
        raise ValueError(f"ids must be in [0, 2**63); got {bad!r}")
    with np.errstate(over="ignore"):
        x = (ids.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)) & _MASK
        x = ((x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & _MASK
        x = ((x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & _MASK
        x = x ^ (x >> np.uint64(31))
    return x.astype(np.int64)


def draw_ids(rng, alpha, vocab, size):
    """ids in [0, vocab): Zipf(alpha) ranks (the tail past vocab folded back
    in) for alpha > 1, or uniform when alpha <= 0."""
    if isinstance(vocab, (bool, np.bool_)) or not isinstance(vocab, (int, np.integer)) \
            or vocab < 1:
        raise ValueError(f"vocab must be a positive integer; got {vocab!r}")
    if 0 < alpha <= 1 or alpha != alpha:
        raise ValueError(f"alpha must be > 1 (Zipf) or <= 0 (uniform); got {alpha!r}")
    if alpha <= 0:
        return rng.integers(0, vocab, size=size)
    # As a Python int: numpy 2 takes int64 % uint64 to float64, which gave
    # ids past 2**53 inexact (a np.uint64 vocab).
    return (rng.zipf(alpha, size=size) - 1) % int(vocab)
