"""TLS on the public port (``tls_cert_file``): a real router on loopback serves Prefill
over TLS with a certificate the user provides (in Kubernetes, a CPPool's
``spec.router.tls.secretName``), and gRPC health alone, in plaintext, on
``health_listen`` for the kubelet's probes. A client verifying the CA gets its prefill; a
plaintext client and a client trusting another CA do not; a renewed certificate
(cert-manager's) takes effect without a restart. ``vertumnus load --tls-ca-file`` dials
it; bad files and settings are refused naming them."""

from __future__ import annotations

import asyncio
import json

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.router.test_admin_tls import make_ca, write_issued
from tests.router.test_dispatch import _pool, _send, _sync
from vertumnus._proto import pool_pb2_grpc
from vertumnus.channels import channel
from vertumnus.cli import build_parser
from vertumnus.router.config import ConfigError, parse_router_config
from vertumnus.router.settings import RouterSettings

NAME = "pool-router.team-a.svc"


def _settings(cert: str, key: str, **kw) -> RouterSettings:  # type: ignore[no-untyped-def]
    return RouterSettings(
        listen="127.0.0.1:0",
        health_listen="127.0.0.1:0",
        metrics_listen="",
        cache_manager=None,
        tls_cert_file=cert,
        tls_key_file=key,
        **kw,
    )


async def _health(address: str, service: str = "") -> int:
    async with grpc.aio.insecure_channel(address) as ch:
        reply = await health_pb2_grpc.HealthStub(ch).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=5
        )
        return int(reply.status)


def test_prefill_over_tls_reaches_only_clients_that_verify_the_router(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ca, other_ca = make_ca(), make_ca("another-ca")
    cert, key = write_issued(tmp_path, ca, NAME)
    (tmp_path / "ca.crt").write_bytes(ca[0])
    (tmp_path / "other.crt").write_bytes(other_ca[0])

    @_sync
    async def run() -> None:
        engine, running = await _pool(_settings(cert, key))
        try:
            async with channel(running.address, str(tmp_path / "ca.crt"), NAME, aio=True) as ch:
                reply = await _send(pool_pb2_grpc.PrefillStub(ch), "r0")
                assert reply.request_id == "r0" and reply.first_token_id >= 0
            for ca_file, name in (("", ""), (str(tmp_path / "other.crt"), NAME)):
                async with channel(running.address, ca_file, name, aio=True) as ch:
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await _send(pool_pb2_grpc.PrefillStub(ch), "r1")
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE
            # The probes' port: plaintext health, and nothing else.
            assert running.health_port is not None
            probes = f"127.0.0.1:{running.health_port}"
            assert await _health(probes) == health_pb2.HealthCheckResponse.SERVING
            assert await _health(probes, "vertumnus.v1.Prefill") == 1
            async with grpc.aio.insecure_channel(probes) as ch:
                with pytest.raises(grpc.aio.AioRpcError) as err:
                    await _send(pool_pb2_grpc.PrefillStub(ch), "r2")
                assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
        finally:
            await running.stop(1.0)
            await engine.server.stop(0)

    run()


def test_a_renewed_certificate_takes_effect_without_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    old_ca, new_ca = make_ca("old"), make_ca("new")
    cert, key = write_issued(tmp_path, old_ca, NAME)
    for name, pem in (("old.crt", old_ca[0]), ("new.crt", new_ca[0])):
        (tmp_path / name).write_bytes(pem)

    async def prefill(address: str, ca_file: str) -> str:
        async with channel(address, ca_file, NAME, aio=True) as ch:
            return (await _send(pool_pb2_grpc.PrefillStub(ch), "r")).request_id

    @_sync
    async def run() -> None:
        engine, running = await _pool(_settings(cert, key))
        try:
            assert await prefill(running.address, str(tmp_path / "old.crt")) == "r"
            write_issued(tmp_path, new_ca, NAME)  # as cert-manager renews the Secret
            assert await prefill(running.address, str(tmp_path / "new.crt")) == "r"
            with pytest.raises(grpc.aio.AioRpcError):
                await prefill(running.address, str(tmp_path / "old.crt"))
        finally:
            await running.stop(1.0)
            await engine.server.stop(0)

    run()


def test_vertumnus_load_dials_the_tls_port_with_the_ca(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    ca = make_ca()
    cert, key = write_issued(tmp_path, ca, NAME)
    (tmp_path / "ca.crt").write_bytes(ca[0])
    out = tmp_path / "load.json"

    @_sync
    async def run() -> None:
        engine, running = await _pool(_settings(cert, key))
        try:
            args = build_parser().parse_args(
                ["load", "--target", running.address, "--requests", "5", "--json", str(out),
                 "--tls-ca-file", str(tmp_path / "ca.crt"), "--tls-server-name", NAME,
                 "--no-progress"]
            )  # fmt: skip
            assert await asyncio.to_thread(args.func, args) == 0
        finally:
            await running.stop(1.0)
            await engine.server.stop(0)

    run()
    assert json.loads(out.read_text())["summary"]["completed"] == 5
    args = build_parser().parse_args(
        ["load", "--target", "127.0.0.1:1", "--requests", "1", "--json", str(out),
         "--tls-ca-file", str(tmp_path / "missing.crt")]
    )  # fmt: skip
    assert args.func(args) == 2
    assert "--tls-ca-file" in capsys.readouterr().err


def test_bad_public_tls_files_and_settings_are_refused_naming_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vertumnus.router.serve import start_router

    ca = make_ca()
    cert, key = write_issued(tmp_path, ca, NAME)

    async def start(c: str, k: str) -> None:
        await start_router(_settings(c, k), ["127.0.0.1:1"], discover_timeout_s=1)

    with pytest.raises(ValueError, match="public TLS file .*missing.crt"):
        asyncio.run(start(str(tmp_path / "missing.crt"), key))
    with pytest.raises(ValueError, match="public TLS files .* not a PEM certificate"):
        asyncio.run(start(key, key))
    with pytest.raises(ValueError, match="tls_cert_file and tls_key_file go together"):
        RouterSettings(tls_cert_file=cert)
    with pytest.raises(ValueError, match="health_listen: .* has the port of listen"):
        RouterSettings(listen="127.0.0.1:50050", health_listen="0.0.0.0:50050")
    with pytest.raises(ValueError, match="health_listen: expected HOST:PORT"):
        RouterSettings(health_listen="nowhere")


def test_router_json_names_the_public_certificate_and_the_probes_port() -> None:
    raw = {
        "pool": "p",
        "port": 50050,
        "healthPort": 50070,
        "tlsCertFile": "/etc/vertumnus/tls/tls.crt",
        "tlsKeyFile": "/etc/vertumnus/tls/tls.key",
        "engines": [{"domain": 0, "host": "e", "basePort": 51000}],
    }
    s = parse_router_config(raw).settings
    assert s.health_listen == "0.0.0.0:50070"
    assert (s.tls_cert_file, s.tls_key_file) == (raw["tlsCertFile"], raw["tlsKeyFile"])
    with pytest.raises(ConfigError, match="healthPort"):
        parse_router_config({**raw, "healthPort": 50050})
    with pytest.raises(ConfigError, match="go together"):
        parse_router_config({k: v for k, v in raw.items() if k != "tlsKeyFile"})
