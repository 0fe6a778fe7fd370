"""Which problems a pool's loop reports as Warning Events, and when again.

The loop itself runs against a real API server in the e2e; here its ``_observed`` is fed
observations directly, with the Events kept in a list.
"""

from __future__ import annotations

import asyncio

from vertumnus.operator.events import MemoryEvents
from vertumnus.operator.gang import GangStatus
from vertumnus.operator.pool import PoolRuntime
from vertumnus.operator.status import Observation, Problem

LOST = Problem("Degraded", "DomainLost", "1 of 2 domain pods are not ready (a node lost?)")


def _runtime() -> tuple[PoolRuntime, MemoryEvents]:
    runtime = PoolRuntime(None, "p", "ns", "uid", admin_key=b"k" * 32)  # type: ignore[arg-type]  # no API calls here
    events = runtime.events = MemoryEvents()  # type: ignore[assignment]
    return runtime, events


def _obs(*problems: Problem, gang: GangStatus | None = None) -> Observation:
    return Observation(domains=2, ready_domains={0}, problems=list(problems), gang=gang)


def test_a_problem_is_reported_when_it_appears_and_again_when_it_comes_back():
    runtime, events = _runtime()

    async def go():
        for obs in (_obs(LOST), _obs(LOST), _obs(), _obs(), _obs(LOST)):
            await runtime._observed(obs)

    asyncio.run(go())
    # Once per incident: not at every step it lasts, and not only the first time ever.
    assert events.events == [("Warning", "DomainLost", LOST.message)] * 2


def test_a_rolling_update_is_progress_not_a_warning():
    runtime, events = _runtime()

    async def go():
        for message in ("draining [0]", "resuming [0]", "draining [1]"):
            await runtime._observed(_obs(Problem("Progressing", "RollingUpdate", message)))

    asyncio.run(go())
    assert events.events == []


def test_an_unschedulable_gang_is_reported_per_incident():
    runtime, events = _runtime()
    stuck = GangStatus(False, "Unschedulable", "0/2 nodes have 8 free GPUs")
    fine = GangStatus(True, "Scheduled", "")

    async def go():
        for gang in (stuck, stuck, fine, stuck):
            await runtime._observed(_obs(gang=gang))

    asyncio.run(go())
    assert [r for _, r, _ in events.events] == ["GangUnschedulable"] * 2
