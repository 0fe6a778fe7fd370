"""The selection helpers of cacheranking.py against plain sorts."""

from __future__ import annotations

import random

import numpy as np
import pytest

from vertumnus.core.cacheranking import _exact_order, _lex_batches_dense, _lex_select


def _columns(rng: random.Random, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    # A mass of ties at 0 (or at a value inside), small integer depths, keys
    # that repeat (one key, two degrees), as in a reclamation ranking.
    values = rng.choice(((0.0, 0.5), (0.25, 0.5, 1.0), (0.0,)))
    bound = np.array([rng.choice(values) if rng.random() < 0.7 else rng.random() for _ in range(n)])
    neg_depth = np.array([-rng.randint(1, 6) for _ in range(n)], dtype=np.int64)
    keys = np.array([rng.randrange(n // 2 + 1) << 40 for _ in range(n)], dtype=np.uint64)
    return bound, neg_depth, keys


@pytest.mark.parametrize("seed", range(30))
def test_lex_select_and_dense_batches_match_a_sort(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 400)
    bound, neg_depth, keys = _columns(rng, n)
    order = sorted(range(n), key=lambda i: (bound[i], neg_depth[i], keys[i], i))
    cols = [bound.__getitem__, neg_depth.__getitem__, keys.__getitem__, lambda i: i]
    k = rng.randint(1, n + 3)
    got = _lex_select(cols, np.arange(n), k)
    assert sorted(got.tolist()) == sorted(order[:k])
    # Dense batches over the finite items only, as reclamation reads them.
    scratch = bound.copy()
    hidden = np.array([rng.random() < 0.2 for _ in range(n)])
    scratch[hidden] = np.inf
    visible = [i for i in order if not hidden[i]]
    gen = _lex_batches_dense(scratch, cols[1:], len(visible), rng.randint(1, 40))
    out: list[int] = []
    head = next(gen, None)
    while head is not None:
        out.extend(head.tolist())
        head = (
            gen.send(rng.choice((None, rng.randint(1, 50))) if out else None)
            if len(out) < len(visible)
            else None
        )
    assert out == visible


@pytest.mark.parametrize("seed", range(30))
def test_exact_order_with_items_coming_back(seed: int) -> None:
    """Items whose exact key is only bounded at first (as a capped footprint
    walk gives), and bounds alone in the stream, still give the full sort's
    order."""
    rng = random.Random(seed)
    items = [(rng.randint(1, 9), rng.randint(1, 6), i) for i in range(rng.randint(0, 60))]
    # key (−m/f, f, i) for missed m, footprint f; the stream's bound (−m,).
    stream: list[tuple[tuple, tuple[int, int, int] | None]] = []
    for bound, item in sorted(((-float(m),), (m, f, i)) for m, f, i in items):
        if rng.random() < 0.3:
            stream.append((bound, None))  # a bound alone (a batch's floor)
        stream.append((bound, item))

    def exact(item: tuple[int, int, int], top: tuple | None) -> tuple | None:
        m, f, i = item
        if i % 7 == 3:
            return None
        cap = int(m / -top[0]) + 1 if top is not None else None
        if cap is not None and f > cap:
            return (-m / (cap + 1), cap + 1), item, False
        return (-m / f, f, i), (m, f, i), True

    got = [v for _, v in _exact_order(iter(stream), exact)]
    want = sorted((x for x in items if x[2] % 7 != 3), key=lambda x: (-x[0] / x[1], x[1], x[2]))
    assert got == want
