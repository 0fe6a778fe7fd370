from collections.abc import Mapping, Sequence

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.placement import PlacementParams, WorkerState

def place_fields(
    length: int,
    matched_blocks: Mapping[int, int],
    workers: Sequence[WorkerState],
    model: PrefillModel,
    params: PlacementParams,
    block_size: int,
) -> tuple[int, float, int, float, int] | None: ...
