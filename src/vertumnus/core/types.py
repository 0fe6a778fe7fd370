"""Domain types shared by the policy core, the simulator and the shells.

The vocabulary, explained once and used everywhere:

- **request**: one prefill job. ``length`` is its input length L in tokens;
  ``block_keys`` is its prefix block sequence h_1..h_n.
- **block**: a fixed-size run of ``block_size`` tokens whose KV can be cached
  and reused. A block is identified by a **chained key**
  (:mod:`vertumnus.core.keys`): the key of block k depends on its own content
  hash and on the key of block k-1, so equal keys mean equal prefixes (as in
  vLLM's and SGLang's block hashing). The last block of a request may be
  partial.
- **worker**: a persistent context-parallel (CP) worker of **degree** C: C
  ranks, one GPU each.
- **composition**: the multiset of worker degrees of a pool, written like
  ``4xCP4+3xCP8`` (four CP4 workers and three CP8 workers, 40 GPUs).
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    """One prefill request.

    ``block_keys`` are chained keys (:mod:`vertumnus.core.keys`), one per
    block of ``block_size`` tokens covering the input, the last possibly
    partial. ``arrival_s`` is seconds from the start of the trace.
    """

    id: int
    arrival_s: float
    length: int
    block_keys: tuple[int, ...]
    output_length: int = 0

    def __post_init__(self) -> None:
        if self.length <= 0:
            raise ValueError(f"request {self.id}: input length must be positive, got {self.length}")
        if self.arrival_s < 0:
            raise ValueError(f"request {self.id}: arrival time must be >= 0, got {self.arrival_s}")


def cached_tokens(matched_blocks: int, length: int, block_size: int) -> int:
    """Tokens of a request of ``length`` served from ``matched_blocks`` cached blocks.

    At least one token is always computed: the first output token needs the
    last position's hidden state, so a fully cached prompt still runs one token.
    """
    return max(0, min(matched_blocks * block_size, length - 1))


_TERM = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?CP(\d+)\s*$", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Composition:
    """A multiset of worker degrees, e.g. ``4xCP4+3xCP8``.

    ``degrees`` is sorted ascending; two compositions with the same workers
    compare equal whatever order they were written in.
    """

    degrees: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.degrees:
            raise ValueError("a composition needs at least one worker")
        if min(self.degrees) < 1:
            raise ValueError(f"worker degrees must be >= 1, got {self.degrees}")
        object.__setattr__(self, "degrees", tuple(sorted(self.degrees)))

    @classmethod
    def parse(cls, text: str) -> Composition:
        """Parse ``4xCP4+3xCP8`` (also ``CP8``, ``2*CP4``); raise ValueError naming the bad term."""
        if not text or not text.strip():
            raise ValueError("empty composition; expected something like 4xCP4+3xCP8")
        degrees: list[int] = []
        for term in text.split("+"):
            m = _TERM.match(term)
            if not m:
                raise ValueError(
                    f"bad composition term {term.strip()!r} in {text!r}; "
                    "expected terms like 4xCP4 joined by '+', e.g. 4xCP4+3xCP8"
                )
            count = int(m.group(1)) if m.group(1) is not None else 1
            degree = int(m.group(2))
            if count < 1 or degree < 1:
                raise ValueError(
                    f"bad composition term {term.strip()!r}: count and degree must be >= 1"
                )
            degrees.extend([degree] * count)
        return cls(tuple(degrees))

    @classmethod
    def of(cls, degrees: Sequence[int]) -> Composition:
        return cls(tuple(degrees))

    @property
    def gpus(self) -> int:
        return sum(self.degrees)

    @property
    def workers(self) -> int:
        return len(self.degrees)

    def count(self, degree: int) -> int:
        return self.degrees.count(degree)

    def __str__(self) -> str:
        counts = Counter(self.degrees)
        return "+".join(f"{counts[d]}xCP{d}" for d in sorted(counts))
