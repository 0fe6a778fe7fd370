from array import array
from collections.abc import Sequence

class Core:
    def __init__(
        self,
        degrees: Sequence[int],
        lam: Sequence[float],
        d: Sequence[float],
        a: Sequence[float],
        max_tokens: Sequence[int],
        capacity: Sequence[int],
        b: float,
        c: float,
        alpha: float,
        beta: float,
        extra: float,
        block_size: int,
        started_s: float,
        /,
    ) -> None: ...
    def serve(self, arrival: float, length: int, keys: array[int], /) -> float | None: ...
    def free_times(self) -> list[float]: ...
    def cached(self, worker: int, /) -> list[int]: ...
    def nbytes(self) -> int: ...
