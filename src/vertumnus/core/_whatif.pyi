from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

def replay(
    arrivals: npt.NDArray[np.float64],
    hit: npt.NDArray[np.float64],
    miss: npt.NDArray[np.float64],
    index: Sequence[int],
    reused: npt.NDArray[np.int64],
    carry_ptr: npt.NDArray[np.int64],
    carry_ids: npt.NDArray[np.int64],
    n_prefixes: int,
    starts: Sequence[Sequence[float]],
    lam_terms: Sequence[float],
    beta: float,
    extra: float,
    out: npt.NDArray[np.float64],
    held: npt.NDArray[np.int64] | None = None,
) -> None: ...
def order_pair(values: npt.NDArray[np.float64], k: int) -> tuple[float, float]: ...
