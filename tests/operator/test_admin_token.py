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


def test_the_operator_issues_the_routers_certificate_and_renews_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Issued for the pool's router Service's name, derived from the operator's key: the
    same bytes all through a period (not at every apply, nor from a restarted operator:
    the Secret would change and the routers reload), a new one when the period turns,
    with two thirds of the old one's validity left."""
    import datetime

    from cryptography import x509

    from tests.operator.test_resources import _spec
    from tests.router.test_admin_tls import make_ca
    from vertumnus.admintls import PERIOD_DAYS, VALID_DAYS, router_name

    ca = make_ca()
    now = [1_800_000_000.0]

    def runtime_(uid: str = "uid-1") -> PoolRuntime:
        return PoolRuntime(
            None,  # type: ignore[arg-type]
            "pool",
            "ns",
            uid,
            clock=lambda: now[0],
            admin_key=KEY,
            admin_ca=ca,
        )

    runtime = runtime_()
    spec = _spec()
    tls = runtime.admin_tls(spec)
    assert tls is not None
    assert tls.server_name == router_name("pool", "ns") == "pool-router.ns.svc"
    assert runtime.reconciler.admin_cert is None
    runtime._keep_admin_cert(spec)
    first = runtime.reconciler.admin_cert
    assert first is not None
    cert = x509.load_pem_x509_certificate(first[0])
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca[0]))
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == ["pool-router.ns.svc"]
    at = datetime.datetime.fromtimestamp(now[0], datetime.UTC)
    assert cert.not_valid_before_utc <= at
    assert cert.not_valid_after_utc - at >= datetime.timedelta(days=VALID_DAYS - PERIOD_DAYS)
    # A restarted operator (a new runtime) issues the same bytes; another pool does not.
    again = runtime_()
    again._keep_admin_cert(spec)
    assert again.reconciler.admin_cert == first
    other = runtime_("uid-2")
    other._keep_admin_cert(spec)
    assert other.reconciler.admin_cert is not None
    assert other.reconciler.admin_cert[1] != first[1]  # its own key
    # All through the period: the same; when it turns, a new one, two thirds left of the old.
    start = cert.not_valid_before_utc + datetime.timedelta(hours=1)
    now[0] = (
        start + datetime.timedelta(days=PERIOD_DAYS) - datetime.timedelta(seconds=1)
    ).timestamp()
    runtime._keep_admin_cert(spec)
    assert runtime.reconciler.admin_cert is first
    now[0] += 2
    runtime._keep_admin_cert(spec)
    renewed = runtime.reconciler.admin_cert
    assert renewed is not None and renewed != first
    renewed_cert = x509.load_pem_x509_certificate(renewed[0])
    at = datetime.datetime.fromtimestamp(now[0], datetime.UTC)
    assert cert.not_valid_after_utc - at > datetime.timedelta(days=VALID_DAYS - PERIOD_DAYS - 1)
    assert renewed_cert.not_valid_after_utc - cert.not_valid_after_utc == datetime.timedelta(
        days=PERIOD_DAYS
    )
    # A pool that asks for plaintext Admin: no certificate, no TLS; asked again, its own.
    off = _spec(router={"adminTLS": False})
    runtime._keep_admin_cert(off)
    assert runtime.admin_tls(off) is None and runtime.reconciler.admin_cert is None
    runtime._keep_admin_cert(spec)
    assert runtime.reconciler.admin_cert == renewed
    # Without a CA there is nothing to issue: Admin in plaintext.
    plain = PoolRuntime(None, "pool", "ns", "uid-1", admin_key=KEY)  # type: ignore[arg-type]
    plain._keep_admin_cert(spec)
    assert plain.admin_tls(spec) is None and plain.reconciler.admin_cert is None
