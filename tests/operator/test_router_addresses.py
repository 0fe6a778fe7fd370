"""Where the operator dials the router replicas: the CPPool's pinned addresses, else the
ready endpoints of the pool's router Service (its EndpointSlices, as the API serves them).
The e2e reaches a real router through a Service's EndpointSlice
(``e2e/test_operator_real_pool.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from vertumnus.operator.pool import endpoint_addresses, router_addresses


def _slice(family: str, hosts: list[list[str]], ready: list[Any] | None = None, **ports: int):
    ready = ready or [True] * len(hosts)
    return {
        "addressType": family,
        "ports": [{"name": n, "port": p, "protocol": "TCP"} for n, p in ports.items()],
        "endpoints": [
            {"addresses": a, **({} if r is None else {"conditions": {"ready": r}})}
            for a, r in zip(hosts, ready, strict=True)
        ],
    }


def test_the_ready_endpoints_at_the_grpc_port_sorted() -> None:
    sl = _slice(
        "IPv4", [["10.0.0.9"], ["10.0.0.2"], ["10.0.0.5"]], [True, None, False], metrics=9464,
        grpc=50051,
    )  # fmt: skip
    # No ready condition means unknown: taken as ready, as kube-proxy does.
    assert endpoint_addresses([sl]) == ["10.0.0.2:50051", "10.0.0.9:50051"]


def test_a_slice_without_the_grpc_port_or_without_endpoints_gives_nothing() -> None:
    assert endpoint_addresses([_slice("IPv4", [["10.0.0.1"]], metrics=9464)]) == []
    assert endpoint_addresses([{"addressType": "IPv4", "ports": None, "endpoints": None}]) == []
    assert endpoint_addresses([]) == []


def test_the_admin_port_where_the_service_has_one_else_grpc() -> None:
    both = _slice("IPv4", [["10.0.0.1"]], grpc=50050, admin=50060, metrics=9090)
    assert endpoint_addresses([both]) == ["10.0.0.1:50060"]
    # A Service rendered before Admin had a port of its own: the routers serve it on grpc.
    assert endpoint_addresses([_slice("IPv4", [["10.0.0.1"]], grpc=50050)]) == ["10.0.0.1:50050"]


def test_ipv6_hosts_are_bracketed() -> None:
    sl = _slice("IPv6", [["fd00::7"]], grpc=50051)
    assert endpoint_addresses([sl]) == ["[fd00::7]:50051"]


def test_a_dual_stack_service_dials_each_router_once() -> None:
    v4 = _slice("IPv4", [["10.0.0.1"], ["10.0.0.2"]], grpc=50051)
    v6 = _slice("IPv6", [["fd00::1"], ["fd00::2"]], grpc=50051)
    assert endpoint_addresses([v6, v4]) == ["10.0.0.1:50051", "10.0.0.2:50051"]
    # A family with no ready endpoint does not hide one that has them.
    v4_empty = _slice("IPv4", [["10.0.0.1"]], [False], grpc=50051)
    assert endpoint_addresses([v4_empty, v6]) == ["[fd00::1]:50051", "[fd00::2]:50051"]


def test_an_fqdn_endpoint_and_only_an_endpoints_first_address() -> None:
    sl = _slice("FQDN", [["router-0.example", "ignored.example"]], grpc=50051)
    assert endpoint_addresses([sl]) == ["router-0.example:50051"]


class _Slices:
    def __init__(self, items: list[dict[str, Any]]) -> None:
        self.items = items
        self.reads = 0
        self.started = False

    def start(self) -> None:
        self.started = True

    async def current(self) -> list[dict[str, Any]]:
        self.reads += 1
        return self.items


def test_pinned_addresses_win_over_the_service(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv("VERTUMNUS_ROUTER_ADDRESSES", raising=False)
    slices = _Slices([_slice("IPv4", [["10.0.0.1"]], grpc=50051)])
    pinned = {"metadata": {"annotations": {"vertumnus.io/router-addresses": "a:1, b:2"}}}
    assert asyncio.run(router_addresses(pinned, slices)) == ["a:1", "b:2"]  # type: ignore[arg-type]
    assert slices.reads == 0 and not slices.started  # a pinned pool watches no Service
    unpinned: dict[str, Any] = {"metadata": {}}
    assert asyncio.run(router_addresses(unpinned, slices)) == ["10.0.0.1:50051"]  # type: ignore[arg-type]
    assert slices.started
