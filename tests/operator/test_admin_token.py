"""The operator's Admin client carries its pool's token: against a real router on
loopback that requires the token the operator derives for that pool (as the pod mounts
it from the Secret the operator writes), a drain goes through; a client of another pool
(or of another operator's key) is refused, and its drain never runs."""

from __future__ import annotations

import base64

import pytest

from tests.router.test_dispatch import _pool, _sync
from vertumnus.admintoken import pool_token
from vertumnus.operator import resources as res
from vertumnus.operator.pool import PoolRuntime
from vertumnus.operator.routerapi import AdminError, RouterAdmin
from vertumnus.router.settings import RouterSettings

KEY = b"operator-key-" * 3


def test_the_operator_drains_through_a_router_that_requires_its_pool_token(tmp_path) -> None:  # type: ignore[no-untyped-def]
    runtime = PoolRuntime(None, "pool", "ns", "uid-1", admin_key=KEY)  # type: ignore[arg-type]
    # What the router pod mounts: the Secret the operator applies, decoded by the kubelet.
    secret = res.admin_secret(runtime.owner, runtime.admin_token)
    token_file = tmp_path / "token"
    token_file.write_bytes(base64.b64decode(secret["data"]["token"]))
    assert runtime.admin_token == pool_token(KEY, "ns", "pool", "uid-1")

    @_sync
    async def run() -> None:
        settings = RouterSettings(
            listen="127.0.0.1:0",
            admin_listen="127.0.0.1:0",
            metrics_listen="",
            cache_manager=None,
            admin_token_file=str(token_file),
        )
        engine, running = await _pool(settings)
        others = [
            RouterAdmin([running.admin_address], pool_token(KEY, "ns", "pool", "uid-2")),
            RouterAdmin(
                [running.admin_address], pool_token(b"another-key" * 3, "ns", "pool", "uid-1")
            ),
        ]
        admin = RouterAdmin([running.admin_address], runtime.admin_token)
        try:
            for other in others:
                with pytest.raises(AdminError) as err:
                    await other.drain(0, timeout_s=5)
                assert err.value.code == "UNAUTHENTICATED"
            assert await admin.draining_workers() == set()  # the refused drains never ran
            assert await admin.drain(0, timeout_s=5)
            assert await admin.draining_workers() == {0}
        finally:
            for a in (admin, *others):
                await a.close()
            await running.stop(1.0)
            await engine.server.stop(0)

    run()
