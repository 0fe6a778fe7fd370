"""The Admin API's token (``admin_token_file``): a real router on loopback, in front of
the scripted one-worker engine of ``test_dispatch``, refuses every Admin call without
the token (and the refused call never runs), lets Prefill through without one, reads
a rotated token file, and fails closed when the file goes; ``vertumnus admin`` sends
the token from ``--token-file``."""

from __future__ import annotations

import asyncio
import os

import grpc
import pytest

from tests.router.test_dispatch import _pool, _send, _sync
from vertumnus import admintoken
from vertumnus._proto import pool_pb2, pool_pb2_grpc
from vertumnus.admin import cmd_admin
from vertumnus.cli import build_parser
from vertumnus.router.serve import start_router
from vertumnus.router.settings import RouterSettings

TOKEN = "s3cret-token-of-the-pool"


def _settings(token_file, **kw) -> RouterSettings:  # type: ignore[no-untyped-def]
    return RouterSettings(
        listen="127.0.0.1:0",
        metrics_listen="",
        cache_manager=None,
        admin_token_file=str(token_file),
        **kw,
    )


async def _code(call) -> tuple[grpc.StatusCode, str]:  # type: ignore[no-untyped-def]
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value.code(), err.value.details() or ""


def _replace(path, text: str) -> None:  # type: ignore[no-untyped-def]
    """As the kubelet updates a mounted Secret: a new file renamed over the old one."""
    new = path.with_suffix(".new")
    new.write_text(text)
    os.replace(new, path)


@pytest.mark.parametrize("own_port", [True, False], ids=["admin-port", "public-port"])
def test_admin_needs_the_token_and_prefill_does_not(tmp_path, own_port) -> None:  # type: ignore[no-untyped-def]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    kw = {"admin_listen": "127.0.0.1:0"} if own_port else {}

    @_sync
    async def run() -> None:
        engine, running = await _pool(_settings(token_file, **kw))
        try:
            async with (
                grpc.aio.insecure_channel(running.address) as public,
                grpc.aio.insecure_channel(running.admin_address) as admin_ch,
            ):
                admin = pool_pb2_grpc.AdminStub(admin_ch)
                drain = pool_pb2.DrainRequest(worker=0)
                for md in ((), (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)):
                    code, details = await _code(admin.Drain(drain, metadata=md))
                    assert code == grpc.StatusCode.UNAUTHENTICATED, md
                    assert "<pool>-router-admin" in details
                # Counted for an alert, by method.
                refused = running.router.metrics.registry.get_sample_value(
                    "vertumnus_router_admin_refused_total", {"method": "Drain"}
                )
                assert refused == 3
                good = admintoken.bearer(TOKEN)
                status = await admin.GetPool(pool_pb2.GetPoolRequest(), metadata=good)
                # The refused drains never ran.
                assert status.workers[0].state == pool_pb2.WorkerStatus.SERVING
                # Prefill needs no token.
                reply = await _send(pool_pb2_grpc.PrefillStub(public), "r0")
                assert reply.request_id == "r0"
                await admin.Drain(drain, metadata=good)
                status = await admin.GetPool(pool_pb2.GetPoolRequest(), metadata=good)
                assert status.workers[0].state == pool_pb2.WorkerStatus.DRAINING
        finally:
            await running.stop(1.0)
            await engine.server.stop(0)

    run()


def test_a_rotated_token_takes_effect_and_a_missing_file_refuses_all(tmp_path) -> None:  # type: ignore[no-untyped-def]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    asyncio.run(asyncio.wait_for(_rotations(token_file), 60))


async def _rotations(token_file) -> None:  # type: ignore[no-untyped-def]
    engine, running = await _pool(_settings(token_file))
    get = pool_pb2.GetPoolRequest()
    try:
        async with grpc.aio.insecure_channel(running.admin_address) as ch:
            admin = pool_pb2_grpc.AdminStub(ch)
            await admin.GetPool(get, metadata=admintoken.bearer(TOKEN))
            _replace(token_file, "rotated\n")
            code, _ = await _code(admin.GetPool(get, metadata=admintoken.bearer(TOKEN)))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            await admin.GetPool(get, metadata=admintoken.bearer("rotated"))
            # A file emptied or gone refuses every call: never open.
            _replace(token_file, "\n")
            code, _ = await _code(admin.GetPool(get, metadata=admintoken.bearer("rotated")))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            token_file.unlink()
            code, _ = await _code(admin.GetPool(get, metadata=admintoken.bearer("rotated")))
            assert code == grpc.StatusCode.UNAUTHENTICATED
            _replace(token_file, "back\n")
            await admin.GetPool(get, metadata=admintoken.bearer("back"))
    finally:
        await running.stop(1.0)
        await engine.server.stop(0)


@pytest.mark.parametrize("content", [None, "", "  \n"], ids=["missing", "empty", "blank"])
def test_a_router_without_a_readable_token_does_not_start(tmp_path, content) -> None:  # type: ignore[no-untyped-def]
    token_file = tmp_path / "token"
    if content is not None:
        token_file.write_text(content)

    @_sync
    async def run() -> None:
        with pytest.raises(ValueError, match=f"admin token file {token_file}"):
            await start_router(_settings(token_file), ["127.0.0.1:1"], discover_timeout_s=1)

    run()


def test_the_router_command_refuses_an_unreadable_token_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    args = build_parser().parse_args(
        ["router", "--engine", "127.0.0.1:1", "--admin-token-file", str(tmp_path / "nope")]
    )
    assert args.func(args) == 2
    assert f"admin token file {tmp_path / 'nope'}" in capsys.readouterr().err


def test_vertumnus_admin_sends_the_token_file(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    wrong = tmp_path / "wrong"
    wrong.write_text("not-it\n")

    @_sync
    async def run() -> None:
        engine, running = await _pool(_settings(token_file, admin_listen="127.0.0.1:0"))
        try:

            def admin(*extra: str) -> int:
                argv = ["admin", "pool", "--target", running.admin_address, "--json", *extra]
                args = build_parser().parse_args(argv)
                return cmd_admin(args)

            # The CLI blocks: off the loop that serves the router.
            assert await asyncio.to_thread(admin) == 2
            assert "UNAUTHENTICATED" in capsys.readouterr().err
            assert await asyncio.to_thread(admin, "--token-file", str(wrong)) == 2
            capsys.readouterr()
            assert await asyncio.to_thread(admin, "--token-file", str(token_file)) == 0
            assert '"composition"' in capsys.readouterr().out
            missing = str(tmp_path / "missing")
            assert await asyncio.to_thread(admin, "--token-file", missing) == 2
            assert f"admin token file {missing}" in capsys.readouterr().err
        finally:
            await running.stop(1.0)
            await engine.server.stop(0)

    run()


def test_pool_tokens_differ_per_pool_and_key_and_are_stable() -> None:
    key = b"k" * 32
    token = admintoken.pool_token(key, "ns", "pool", "uid-1")
    assert token == admintoken.pool_token(key, "ns", "pool", "uid-1")
    others = {
        admintoken.pool_token(key, "ns", "pool", "uid-2"),  # the same name, created again
        admintoken.pool_token(key, "ns2", "pool", "uid-1"),
        admintoken.pool_token(key, "ns", "pool2", "uid-1"),
        admintoken.pool_token(b"j" * 32, "ns", "pool", "uid-1"),
    }
    assert token not in others and len(others) == 4
    assert len(token) == 43 and token.isascii() and "=" not in token


def test_a_short_or_missing_operator_key_is_refused(tmp_path) -> None:  # type: ignore[no-untyped-def]
    short = tmp_path / "short"
    short.write_text("tooshort\n")
    with pytest.raises(ValueError, match="8 bytes, need at least 16"):
        admintoken.read_key(str(short))
    with pytest.raises(ValueError, match="admin key file"):
        admintoken.read_key(str(tmp_path / "none"))
    good = tmp_path / "key"
    good.write_text("x" * 40 + "\n")
    assert admintoken.read_key(str(good)) == b"x" * 40


def test_the_flag_overrides_the_files_token_and_empty_means_none(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vertumnus.router.cli import router_config_from_args

    config = tmp_path / "router.json"
    config.write_text('{"adminTokenFile": "/etc/vertumnus/admin/token"}')
    base = ["router", "--config", str(config), "--engine", "127.0.0.1:1"]

    def token_file(*extra: str) -> str:
        return router_config_from_args(
            build_parser().parse_args([*base, *extra])
        ).settings.admin_token_file

    assert token_file() == "/etc/vertumnus/admin/token"
    assert token_file("--admin-token-file", "/mine") == "/mine"
    assert token_file("--admin-token-file", "") == ""


def test_refusals_are_logged_at_most_once_a_minute_with_their_count(caplog) -> None:  # type: ignore[no-untyped-def]
    from vertumnus.router import adminauth

    counted: list[str] = []
    guard = adminauth.AdminAuth(None, counted.append)  # type: ignore[arg-type]  # no token read
    with caplog.at_level("WARNING", logger="vertumnus.router"):
        for _ in range(5):
            guard._refused("/vertumnus.v1.Admin/Drain")
        first = [r.getMessage() for r in caplog.records]
        guard._logged_at -= adminauth.LOG_EVERY_S  # a minute later
        guard._refused("/vertumnus.v1.Admin/GetPool")
    assert counted == ["Drain"] * 5 + ["GetPool"]
    assert first == [
        "refused 1 Admin call(s) without a valid admin token (the last: /vertumnus.v1.Admin/Drain)"
    ]
    assert caplog.records[-1].getMessage().startswith("refused 5 Admin call(s)")
