"""The status view (phases, conditions, workers) and the compare-and-swap status writes.

The writes are tested against a small real HTTP server (aiohttp) that keeps one CPPool
with Kubernetes' resourceVersion semantics: a merge patch carrying a stale
resourceVersion gets 409 Conflict.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import replace

import kopf
import pytest
from aiohttp import web

from vertumnus.core import planner
from vertumnus.core import transition as tr
from vertumnus.core.lattice import layout_for
from vertumnus.core.types import Composition
from vertumnus.operator.gang import GangStatus
from vertumnus.operator.kube import KubeClient
from vertumnus.operator.record import LostRecord, Record
from vertumnus.operator.status import (
    Observation,
    Problem,
    StatusStore,
    build_status,
    ran_before,
)


def _record(text="2xCP8") -> Record:
    return Record(tr.initial_pool(layout_for(Composition.parse(text), 8)))


def _cond(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


def test_a_ready_pool():
    obs = Observation(
        domains=2,
        pods=2,
        bound=2,
        ready_domains={0, 1},
        gang=GangStatus(True, "Scheduled", ""),
        generation=3,
    )
    st = build_status(_record(), obs, [], 1000.0)
    assert (
        st["phase"],
        st["composition"],
        st["epoch"],
        st["readyGPUs"],
        st["observedGeneration"],
    ) == ("Ready", "2xCP8", 1, 16, 3)
    assert [(w["id"], w["degree"], w["domain"], w["ranks"], w["state"]) for w in st["workers"]] == [
        (0, 8, 0, list(range(8)), "Serving"),
        (1, 8, 1, list(range(8)), "Serving"),
    ]
    assert _cond(st, "Ready")["status"] == "True" and _cond(st, "GangScheduled")["status"] == "True"
    assert (
        _cond(st, "Progressing")["status"] == "False" and _cond(st, "Degraded")["status"] == "False"
    )
    # lastTransitionTime stays while a condition's status does not change
    again = build_status(_record(), obs, st["conditions"], 2000.0)
    assert _cond(again, "Ready")["lastTransitionTime"] == _cond(st, "Ready")["lastTransitionTime"]
    # The controller's last what-if check, once there was one (the CHECK column).
    assert st["lastCheck"] is None
    check = {"hop": 4, "verdict": "veto", "current": {"composition": "2xCP8", "mean_s": 0.3}}
    st = build_status(replace(_record(), last_check=check), obs, [], 3000.0)
    assert st["lastCheck"] == check


def test_an_unschedulable_gang_says_why():
    gang = GangStatus(False, "Unschedulable", "minCount (3) cannot be satisfied")
    obs = Observation(
        domains=3,
        pods=3,
        bound=0,
        ready_domains=set(),
        gang=gang,
        unschedulable="pool-d0: 0/2 nodes are available",
    )
    st = build_status(_record("3xCP8"), obs, [], 0.0)
    assert st["phase"] == "Unschedulable" and st["readyGPUs"] == 0
    assert _cond(st, "GangScheduled")["message"] == "minCount (3) cannot be satisfied"
    assert _cond(st, "Ready")["reason"] == "Unschedulable"
    assert "0/3 domain pods bound: pool-d0: 0/2 nodes" in _cond(st, "Ready")["message"]


def test_a_missing_gang_api_and_a_degraded_pool():
    obs = Observation(
        domains=2, problems=[Problem("GangScheduled", "GangAPIUnavailable", "no volcano")]
    )
    st = build_status(_record(), obs, [], 0.0)
    assert st["phase"] == "Unschedulable"
    assert (_cond(st, "GangScheduled")["reason"], _cond(st, "Ready")["reason"]) == (
        "GangAPIUnavailable",
        "GangAPIUnavailable",
    )
    obs = Observation(
        domains=2,
        bound=2,
        ready_domains={0, 1},
        gang=GangStatus(True, "Scheduled", ""),
        problems=[Problem("Degraded", "NeedsNewPods", "gpus changed")],
    )
    st = build_status(_record(), obs, [], 0.0)
    assert st["phase"] == "Degraded" and _cond(st, "Degraded")["reason"] == "NeedsNewPods"
    assert _cond(st, "Ready")["status"] == "True"  # still serving as it was


def test_a_restarted_operator_knows_from_the_status_whether_the_pool_ran():
    """A domain missing after a restart is a loss only if the pool ran before: the status
    written by the previous operator says so (the daemon's own memory is gone)."""
    ready = Observation(
        domains=2, bound=2, ready_domains={0, 1}, gang=GangStatus(True, "Scheduled", "")
    )
    placing = Observation(domains=2, bound=1, ready_domains={0})
    lost = replace(placing, problems=[Problem("Degraded", "DomainLost", "1 of 2 lost")])
    assert ran_before(build_status(_record(), ready, [], 0.0), _record())
    assert ran_before(build_status(_record(), lost, [], 0.0), _record())
    assert not ran_before(build_status(_record(), placing, [], 0.0), _record())
    assert not ran_before({}, _record())  # a new CPPool
    committed = replace(_record(), last_transition={"id": 1, "kind": "split"})
    assert ran_before(build_status(committed, placing, [], 0.0), committed)


def test_a_transition_in_flight_shows_its_phase_and_workers():
    r = _record("1xCP8")
    pool, t, _ = tr.begin(r.pool, planner.Split(0, "load"))
    r = Record(pool, started=((t.id, 0.0),))
    obs = Observation(domains=1, bound=1, ready_domains={0}, gang=GangStatus(True, "", ""))
    st = build_status(r, obs, [], 5.0)
    assert st["phase"] == "Draining" and st["transitions"][0] == {
        "id": 1,
        "kind": "split",
        "phase": "Draining",
        "removed": [0],
        "added": [1, 2],
        "epoch": 0,
        "started": "1970-01-01T00:00:00Z",
        "reason": "load",
    }
    assert st["workers"][0]["state"] == "Draining"
    assert _cond(st, "Progressing")["reason"] == "Draining"
    pool, _ = tr.drained(pool, t.id, 0)
    st = build_status(Record(pool), obs, [], 5.0)
    assert st["phase"] == "Switching" and st["epoch"] == 2
    assert [w["state"] for w in st["workers"]] == ["Switching", "Switching"]


class FakeApi:
    """One CPPool behind a real HTTP server, with resourceVersion preconditions."""

    def __init__(self) -> None:
        self.obj = {
            "metadata": {"name": "p", "namespace": "ns", "resourceVersion": "1"},
            "status": {},
        }
        self.patches = 0

    def bump(self) -> None:
        self.obj["metadata"]["resourceVersion"] = str(
            int(self.obj["metadata"]["resourceVersion"]) + 1
        )

    async def get(self, request: web.Request) -> web.Response:
        return web.json_response(self.obj)

    async def patch(self, request: web.Request) -> web.Response:
        body = json.loads(await request.text())
        self.patches += 1
        rv = body.get("metadata", {}).get("resourceVersion")
        if rv is not None and rv != self.obj["metadata"]["resourceVersion"]:
            return web.json_response(
                {"kind": "Status", "reason": "Conflict", "message": "stale"}, status=409
            )
        self.obj["status"] = body["status"]
        self.bump()
        return web.json_response(self.obj)


async def _serve(api: FakeApi) -> tuple[web.AppRunner, KubeClient]:
    app = web.Application()
    path = "/apis/vertumnus.io/v1alpha1/namespaces/ns/cppools/p"
    app.router.add_get(path, api.get)
    app.router.add_patch(path + "/status", api.patch)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, KubeClient(kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"))


def test_status_writes_retry_a_conflict_and_refuse_a_takeover():
    api = FakeApi()

    async def go():
        runner, kube = await _serve(api)
        try:
            sizes: list[int] = []
            store = StatusStore(
                kube, "ns", "p", lambda r: {"epoch": r.pool.epoch}, "1", written=sizes.append
            )
            rec = _record()
            sent = time.monotonic()
            await store.write(Record(rec.pool, seq=1))
            assert api.obj["status"]["state"]["seq"] == 1
            # The size of the object the write returned, for the pool's gauge.
            assert sizes == [len(json.dumps(api.obj, separators=(",", ":")))]
            # The object the write returned, stamped with when it was sent: the pool's loop
            # reuses it instead of reading the CPPool again.
            assert store.latest == api.obj and sent <= store.latest_at <= time.monotonic()
            api.bump()  # someone touched the object (kopf's annotations): same seq, retry
            await store.write(Record(rec.pool, seq=2))
            assert api.obj["status"]["state"]["seq"] == 2 and api.patches == 3
            api.obj["status"]["state"]["seq"] = 7  # another operator wrote the record
            api.bump()
            with pytest.raises(LostRecord, match="seq is 7"):
                await store.write(Record(rec.pool, seq=3))
            assert api.obj["status"]["state"]["seq"] == 7  # not overwritten
        finally:
            await kube.close()
            await runner.cleanup()

    asyncio.run(go())
