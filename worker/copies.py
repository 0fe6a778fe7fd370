"""Planning a block copy between two workers: who sends which block to whom.

Pure: given which ranks hold which of a prefix's blocks, decide the transfers.
Block j goes to its owner under the **destination's** geometry (rank
``dst.offset + j mod C_dst``), which is what re-partitions an inter-degree
copy; blocks that owner already holds are skipped, so only missing blocks
move. The sender is the block's owner under the source's geometry, or any
source rank that holds it (after a regroup a block can sit on a rank that no
longer owns it). If the source lacks a needed block the plan lists it as
missing and the engine copies nothing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from vertumnus.core.lattice import Slot

from .blocks import Block, block_owner


@dataclass
class CopyPlan:
    # sender rank -> receiver rank -> keys, in prefix order
    sends: dict[int, dict[int, list[int]]] = field(default_factory=dict)
    # receiver rank -> sender rank -> blocks (key, position, parent), in the same order
    receives: dict[int, dict[int, list[Block]]] = field(default_factory=dict)
    skipped: int = 0
    missing: list[tuple[int, int]] = field(default_factory=list)  # (position, key)


def plan_copy(
    keys: Sequence[int],
    holders: Mapping[int, Sequence[bool]],
    source: Slot,
    destination: Slot,
) -> CopyPlan:
    """``holders[rank][j]``: whether ``rank`` holds ``keys[j]``, for every rank of both workers."""
    plan = CopyPlan()
    for j, key in enumerate(keys):
        owner = destination.offset + block_owner(j, destination.degree)
        if holders[owner][j]:
            plan.skipped += 1
            continue
        preferred = source.offset + block_owner(j, source.degree)
        sender = (
            preferred
            if holders[preferred][j]
            else next((r for r in source.ranks if holders[r][j]), None)
        )
        if sender is None:
            plan.missing.append((j, key))
            continue
        plan.sends.setdefault(sender, {}).setdefault(owner, []).append(key)
        parent = keys[j - 1] if j else None
        plan.receives.setdefault(owner, {}).setdefault(sender, []).append(Block(key, j, parent))
    return plan
