"""When a failed worker's place may be given a new worker: the operator's repair backoff.

A router reports a worker FAILED when its engine says it cannot serve it (an SGLang
server that exited); the operator replaces it with a ``replace`` transition
(:meth:`vertumnus.operator.transitions.TransitionRunner.replace`). This module decides
*when*, and keeps what the status says meanwhile. Pure: the caller passes the clock.
"""

from __future__ import annotations

from collections.abc import Mapping

from vertumnus.core.lattice import Slot
from vertumnus.operator.status import Problem

__all__ = ["Repairs"]


class Repairs:
    """When a failed worker's place may be given a new worker (backoff per place).

    A place (domain, offset, degree) whose new worker fails again waits
    ``base_s`` · 2^(n−1) after its n-th replacement, at most ``max_s`` — as a kubelet
    backs off a crash-looping container — so a server that cannot start (a bad model
    path, a broken GPU) is not restarted in a tight loop. A place not replaced for
    ``reset_s`` starts over. Nothing here is persisted: an operator restart forgets
    the backoff, not the failure (the routers still report it)."""

    def __init__(
        self,
        base_s: float = 30.0,
        max_s: float = 600.0,
        reset_s: float = 1800.0,
        every_s: float = 2.0,
    ) -> None:
        self.base_s, self.max_s, self.reset_s, self.every_s = base_s, max_s, reset_s, every_s
        self._count: dict[tuple[int, int, int], tuple[int, float]] = {}
        """place → (replacements, when the last one began)."""
        self._failed: dict[int, tuple[Slot, str]] = {}
        self._looked = float("-inf")

    @staticmethod
    def _place(slot: Slot) -> tuple[int, int, int]:
        return (slot.domain, slot.offset, slot.degree)

    def due(self, now: float) -> bool:
        """Time to ask the routers again (every ``every_s``)."""
        if now - self._looked < self.every_s:
            return False
        self._looked = now
        return True

    def seen(self, failed: Mapping[int, tuple[Slot, str]]) -> None:
        self._failed = dict(failed)

    def may_replace(self, slot: Slot, now: float) -> bool:
        count, last = self._count.get(self._place(slot), (0, float("-inf")))
        if now - last > self.reset_s:
            count = 0
        wait = 0.0 if count == 0 else min(self.max_s, self.base_s * 2 ** (count - 1))
        return now - last >= wait

    def replaced(self, slot: Slot, now: float) -> None:
        count, _ = self._count.get(self._place(slot), (0, 0.0))
        self._count[self._place(slot)] = (count + 1, now)

    def problems(self) -> list[Problem]:
        return [
            Problem(
                "Degraded",
                "WorkerFailed",
                f"worker {w} (CP{slot.degree}, domain {slot.domain}) cannot serve: {why}",
            )
            for w, (slot, why) in sorted(self._failed.items())
        ]
