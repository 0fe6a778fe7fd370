"""The watched copy of a collection (:mod:`vertumnus.operator.informer`) over real HTTP.

A loopback server plays one pod collection: a LIST with a resourceVersion, and WATCH
streams the test feeds event by event (including 410 Gone, a dropped connection and a
refused watch). The same code runs against the real API server in every operator e2e.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import kopf
import pytest
from aiohttp import web

from vertumnus.operator.informer import Informer
from vertumnus.operator.kube import KubeClient, request_kind

PATH = "/api/v1/namespaces/ns/pods"


def _pod(name: str, rv: int, phase: str = "Pending") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": str(rv)}, "status": {"phase": phase}}


class Collection:
    """A pod collection: ``lists`` and ``watches`` record the requests' parameters; each
    watch serves the events put on ``feed`` until a ``None`` (the server ends it) or a
    ``"drop"`` (the connection is cut)."""

    def __init__(self, *pods: dict[str, Any], version: int = 10) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.version = version
        self.lists: list[dict[str, str]] = []
        self.watches: list[dict[str, str]] = []
        self.feed: asyncio.Queue[Any] = asyncio.Queue()
        self.refuse_watch = False

    async def handle(self, request: web.Request) -> web.StreamResponse:
        params = dict(request.query)
        if params.get("watch") != "true":
            self.lists.append(params)
            return web.json_response(
                {
                    "metadata": {"resourceVersion": str(self.version)},
                    "items": list(self.pods.values()),
                }
            )
        self.watches.append(params)
        if self.refuse_watch:
            return web.json_response(
                {"kind": "Status", "reason": "Forbidden", "message": "no watch"}, status=403
            )
        resp = web.StreamResponse()
        await resp.prepare(request)
        while True:
            event = await self.feed.get()
            if event is None:
                return resp
            if event == "drop":
                assert request.transport is not None
                request.transport.close()
                return resp
            data = json.dumps(event).encode() + b"\n"
            # Split a line across writes: the client must join chunks.
            await resp.write(data[:7])
            await resp.write(data[7:])


async def _serve(collection: Collection) -> tuple[web.AppRunner, KubeClient]:
    app = web.Application()
    app.router.add_get(PATH, collection.handle)
    runner = web.AppRunner(app, shutdown_timeout=0.2)  # watches left open end at cleanup
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, KubeClient(kopf.ConnectionInfo(server=f"http://127.0.0.1:{port}"))


async def _until(check: Any, what: str, timeout: float = 5.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def _names(informer: Informer) -> dict[str, str]:
    return {o["metadata"]["name"]: o["status"]["phase"] for o in informer.items()}


def _run(test: Any, collection: Collection) -> None:
    async def go() -> None:
        runner, kube = await _serve(collection)
        try:
            await test(kube)
        finally:
            await kube.close()
            await runner.cleanup()

    asyncio.run(go())


def test_the_copy_follows_the_list_and_then_the_watch_events():
    col = Collection(_pod("a", 5), _pod("b", 6))
    changes = []

    async def test(kube: KubeClient) -> None:
        inf = Informer(kube, PATH, "pool=p", on_change=lambda: changes.append(1), timeout_s=60)
        assert not inf.synced
        # Not started: a caller's read lists.
        assert {o["metadata"]["name"] for o in await inf.current()} == {"a", "b"}
        assert len(col.lists) == 1
        inf.start()
        await _until(lambda: col.watches, "the watch")
        assert inf.synced and _names(inf) == {"a": "Pending", "b": "Pending"}
        assert len(col.lists) == 2
        assert await inf.current() == inf.items() and len(col.lists) == 2  # the copy
        # The watch starts where the list ended, with bookmarks, selected server-side.
        assert col.lists[0]["labelSelector"] == "pool=p"
        assert col.watches[0]["resourceVersion"] == "10"
        assert col.watches[0]["allowWatchBookmarks"] == "true"
        assert col.watches[0]["labelSelector"] == "pool=p"
        assert col.watches[0]["timeoutSeconds"] == "60"
        before = len(changes)
        await col.feed.put({"type": "MODIFIED", "object": _pod("a", 11, "Running")})
        await col.feed.put({"type": "ADDED", "object": _pod("c", 12)})
        await col.feed.put({"type": "DELETED", "object": _pod("b", 13)})
        await col.feed.put({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "20"}}})
        await _until(lambda: "b" not in _names(inf), "the deletion")
        assert _names(inf) == {"a": "Running", "c": "Pending"}
        assert len(changes) == before + 3  # the bookmark is no change
        await col.feed.put(None)  # the server ends the watch: the next starts at the bookmark
        await _until(lambda: len(col.watches) == 2, "the next watch")
        assert col.watches[1]["resourceVersion"] == "20"
        assert len(col.lists) == 2 and inf.synced and inf.restarts == 0
        # The client counts what it asked the server (the operator exports it).
        assert kube.requests == {("list", "pods"): 2, ("watch", "pods"): 2}
        await inf.close()
        assert not inf.synced

    _run(test, col)


def test_410_gone_lists_again_and_replaces_the_copy():
    col = Collection(_pod("a", 5))

    async def test(kube: KubeClient) -> None:
        inf = Informer(kube, PATH, "pool=p", timeout_s=60)
        inf.start()
        await _until(lambda: col.watches, "the watch")
        # Meanwhile a pod went and another came, and the events are no longer kept.
        col.pods = {"z": _pod("z", 40, "Running")}
        col.version = 41
        await col.feed.put({"type": "ERROR", "object": {"kind": "Status", "code": 410}})
        await _until(lambda: len(col.watches) == 2, "the watch after the relist")
        assert len(col.lists) == 2 and _names(inf) == {"z": "Running"}
        assert col.watches[1]["resourceVersion"] == "41"
        assert inf.synced and inf.restarts == 0  # expiry is routine, not a failure
        await inf.close()

    _run(test, col)


def test_a_cut_connection_unsyncs_the_copy_until_a_new_list():
    col = Collection(_pod("a", 5))

    failures = []

    async def test(kube: KubeClient) -> None:
        inf = Informer(kube, PATH, "pool=p", timeout_s=60, on_failure=lambda: failures.append(1))
        inf.start()
        await _until(lambda: col.watches, "the watch")
        await col.feed.put("drop")
        await _until(lambda: not inf.synced, "the copy to be marked unsynced")
        assert inf.restarts == 1
        col.pods["b"] = _pod("b", 30)  # changed while nobody watched: only a list shows it
        await _until(lambda: len(col.watches) == 2, "the watch after the backoff", timeout=5.0)
        assert len(col.lists) == 2 and inf.synced and set(_names(inf)) == {"a", "b"}
        assert failures == [1]
        await inf.close()

    _run(test, col)


def test_a_refused_watch_leaves_the_copy_unsynced_and_retries():
    col = Collection(_pod("a", 5))
    col.refuse_watch = True

    async def test(kube: KubeClient) -> None:
        inf = Informer(kube, PATH, "pool=p", timeout_s=60)
        inf.start()
        await _until(lambda: inf.restarts >= 1, "the refusal")
        # A caller reading while unsynced gets a fresh list, not the copy.
        assert not inf.synced
        col.pods["c"] = _pod("c", 30)
        assert sorted(o["metadata"]["name"] for o in await inf.current()) == ["a", "c"]
        col.refuse_watch = False
        await _until(lambda: inf.synced and len(col.watches) >= 2, "the retry", timeout=5.0)
        await inf.close()

    _run(test, col)


@pytest.mark.parametrize(
    ("method", "path", "kind"),
    [
        ("GET", "/api/v1/namespaces/ns/pods", ("list", "pods")),
        ("GET", "/api/v1/namespaces/ns/pods/p-d0", ("get", "pods")),
        ("GET", "/apis/vertumnus.io/v1alpha1/cppools", ("list", "cppools")),
        (
            "PATCH",
            "/apis/vertumnus.io/v1alpha1/namespaces/ns/cppools/p/status",
            ("patch", "cppools/status"),
        ),
        ("POST", "/api/v1/namespaces/ns/events", ("create", "events")),
        ("DELETE", "/apis/apps/v1/namespaces/ns/deployments/r", ("delete", "deployments")),
        ("GET", "/api/v1/namespaces/ns", ("get", "namespaces")),
        ("GET", "/apis/scheduling.k8s.io/v1alpha2", ("get", "")),
    ],
)
def test_a_request_is_counted_by_its_verb_and_resource(method, path, kind):
    assert request_kind(method, path) == kind
