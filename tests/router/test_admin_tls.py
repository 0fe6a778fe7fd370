"""TLS on the Admin port (``admin_tls_cert_file``): a real router on loopback serves Admin
over TLS with a certificate issued the operator's way (:mod:`vertumnus.admintls`), while
Prefill stays plaintext on the public port. The operator's client reaches it verifying
the pool's name against the CA; a plaintext client, a client trusting another CA, and a
client expecting another pool's routers do not. A certificate issued anew takes effect
without a restart."""

from __future__ import annotations

import asyncio
import datetime
import os
import ssl

import grpc
import pytest
from cryptography import x509

from tests.router.test_dispatch import _pool, _send, _sync
from vertumnus import admintls
from vertumnus._proto import pool_pb2, pool_pb2_grpc
from vertumnus.admin import cmd_admin
from vertumnus.cli import build_parser
from vertumnus.operator.routerapi import AdminError, RouterAdmin
from vertumnus.router.settings import RouterSettings

NOW = datetime.datetime(2026, 12, 6, tzinfo=datetime.UTC)
NAME = admintls.router_name("pool", "ns")


def make_ca(cn: str = "test-ca") -> tuple[bytes, bytes]:
    return admintls.new_ca(cn, NOW)


def write_issued(folder, ca: tuple[bytes, bytes], name: str = NAME) -> tuple[str, str]:  # type: ignore[no-untyped-def]
    """A certificate for ``name`` from ``ca``, written as the kubelet updates a Secret's
    files (new files renamed over the old ones)."""
    issued = admintls.issue(ca[0], ca[1], name, datetime.datetime.now(datetime.UTC))
    paths = []
    for base, pem in (("tls.crt", issued.cert_pem), ("tls.key", issued.key_pem)):
        path = folder / base
        tmp = folder / f".{base}.new"
        tmp.write_bytes(pem)
        os.replace(tmp, path)
        paths.append(str(path))
    return paths[0], paths[1]


def _settings(cert: str, key: str, **kw) -> RouterSettings:  # type: ignore[no-untyped-def]
    return RouterSettings(
        listen="127.0.0.1:0",
        admin_listen="127.0.0.1:0",
        metrics_listen="",
        cache_manager=None,
        admin_tls_cert_file=cert,
        admin_tls_key_file=key,
        **kw,
    )


def test_admin_over_tls_reaches_only_the_pools_verified_routers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ca, other_ca = make_ca(), make_ca("another-ca")
    cert, key = write_issued(tmp_path, ca)

    @_sync
    async def run() -> None:
        engine, running = await _pool(_settings(cert, key))
        good = RouterAdmin([running.admin_address], "t", admintls.AdminTLS(ca[0], NAME))
        others = [
            RouterAdmin([running.admin_address], "t"),  # plaintext
            RouterAdmin([running.admin_address], "t", admintls.AdminTLS(other_ca[0], NAME)),
            RouterAdmin(
                [running.admin_address],
                "t",
                admintls.AdminTLS(ca[0], admintls.router_name("other-pool", "ns")),
            ),
        ]
        try:
            assert await good.draining_workers() == set()
            for other in others:
                with pytest.raises(AdminError) as err:
                    await other.drain(0, timeout_s=2)
                assert err.value.code == "UNAVAILABLE"
            assert await good.draining_workers() == set()  # no refused drain ran
            # Prefill stays on the plaintext public port (the kubelet's gRPC probe has no TLS).
            async with grpc.aio.insecure_channel(running.address) as public:
                reply = await _send(pool_pb2_grpc.PrefillStub(public), "r0")
                assert reply.request_id == "r0"
            assert await good.drain(0, timeout_s=5)
        finally:
            for a in (good, *others):
                await a.close()
            await running.stop(1.0)
            await engine.server.stop(0)

    run()


def test_a_certificate_issued_anew_takes_effect_without_a_restart(tmp_path) -> None:  # type: ignore[no-untyped-def]
    old_ca, new_ca = make_ca("old"), make_ca("new")
    cert, key = write_issued(tmp_path, old_ca)

    async def get_pool(address: str, ca: bytes) -> pool_pb2.PoolStatus:
        options = admintls.AdminTLS(ca, NAME)
        async with grpc.aio.secure_channel(address, options.credentials(), options.options()) as ch:
            return await pool_pb2_grpc.AdminStub(ch).GetPool(pool_pb2.GetPoolRequest(), timeout=5)

    @_sync
    async def run() -> None:
        engine, running = await _pool(_settings(cert, key))
        try:
            await get_pool(running.admin_address, old_ca[0])
            write_issued(tmp_path, new_ca)  # each new connection's handshake reads it
            await get_pool(running.admin_address, new_ca[0])
            with pytest.raises(grpc.aio.AioRpcError):
                await get_pool(running.admin_address, old_ca[0])
            # A broken pair keeps the certificate before it.
            (tmp_path / "tls.key").write_bytes(b"not a key")
            await get_pool(running.admin_address, new_ca[0])
        finally:
            await running.stop(1.0)
            await engine.server.stop(0)

    run()


def test_bad_tls_files_are_refused_at_start_naming_them(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from vertumnus.router.serve import start_router

    ca = make_ca()
    cert, key = write_issued(tmp_path, ca)
    other = tmp_path / "other"
    other.mkdir()
    _, other_key = write_issued(other, ca)

    async def start(c: str, k: str) -> None:
        await start_router(_settings(c, k), ["127.0.0.1:1"], discover_timeout_s=1)

    for c, k, text in (
        (str(tmp_path / "missing.crt"), key, "missing.crt"),
        (cert, other_key, "not a PEM certificate and its key"),
        (key, key, "not a PEM certificate and its key"),
    ):
        with pytest.raises(ValueError, match=text):
            asyncio.run(start(c, k))
    with pytest.raises(ValueError, match="port of its own"):
        RouterSettings(admin_tls_cert_file=cert, admin_tls_key_file=key)
    with pytest.raises(ValueError, match="go together"):
        RouterSettings(admin_listen="127.0.0.1:0", admin_tls_cert_file=cert)


def test_vertumnus_admin_dials_tls_with_the_ca_and_the_pools_name(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    ca = make_ca()
    cert, key = write_issued(tmp_path, ca)
    (tmp_path / "ca.crt").write_bytes(ca[0])

    @_sync
    async def run() -> None:
        engine, running = await _pool(_settings(cert, key))
        try:

            def admin(*extra: str) -> int:
                argv = ["admin", "pool", "--target", running.admin_address, "--json", *extra]
                return cmd_admin(build_parser().parse_args(argv))

            trusted = ("--tls-ca-file", str(tmp_path / "ca.crt"))
            assert await asyncio.to_thread(admin, "--timeout", "3", *trusted) == 1  # name
            assert await asyncio.to_thread(admin, "--timeout", "3") == 1  # plaintext
            capsys.readouterr()
            assert await asyncio.to_thread(admin, *trusted, "--tls-server-name", NAME) == 0
            assert '"composition"' in capsys.readouterr().out
        finally:
            await running.stop(1.0)
            await engine.server.stop(0)

    run()


def test_the_ca_files_are_checked_to_belong_together(tmp_path) -> None:  # type: ignore[no-untyped-def]
    ca, other = make_ca(), make_ca("other")
    (tmp_path / "ca.crt").write_bytes(ca[0])
    (tmp_path / "ca.key").write_bytes(ca[1])
    (tmp_path / "other.key").write_bytes(other[1])
    assert admintls.read_ca(str(tmp_path / "ca.crt"), str(tmp_path / "ca.key")) == ca
    with pytest.raises(ValueError, match="is not .*ca.crt's"):
        admintls.read_ca(str(tmp_path / "ca.crt"), str(tmp_path / "other.key"))
    with pytest.raises(ValueError, match="not a PEM certificate"):
        admintls.read_ca(str(tmp_path / "ca.key"), str(tmp_path / "ca.key"))
    with pytest.raises(ValueError, match="admin CA file .*none"):
        admintls.read_ca(str(tmp_path / "none"), str(tmp_path / "ca.key"))


def test_an_issued_certificate_names_the_pool_and_chains_to_the_ca() -> None:
    ca = make_ca()
    issued = admintls.issue(ca[0], ca[1], NAME, NOW)
    cert = x509.load_pem_x509_certificate(issued.cert_pem)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [NAME]
    assert cert.issuer == x509.load_pem_x509_certificate(ca[0]).subject
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca[0]))
    assert issued.not_after == NOW + datetime.timedelta(days=admintls.VALID_DAYS)
    assert cert.not_valid_after_utc == issued.not_after.replace(microsecond=0)


class _MountedSecret:
    """A Secret volume as the kubelet writes it (its AtomicWriter): the data in a
    timestamped directory, ``..data`` a symlink to it, each key a symlink through
    ``..data``; an update writes a new directory and swaps ``..data`` by rename."""

    def __init__(self, folder) -> None:  # type: ignore[no-untyped-def]
        self.folder = folder
        self.version = 0

    def write(self, data: dict[str, bytes]) -> None:
        self.version += 1
        target = self.folder / f"..2026_12_06_{self.version}"
        target.mkdir()
        for key, value in data.items():
            (target / key).write_bytes(value)
        tmp = self.folder / "..data_tmp"
        tmp.symlink_to(target.name)
        os.replace(tmp, self.folder / "..data")
        for key in data:
            link = self.folder / key
            if not link.is_symlink():
                link.symlink_to(f"..data/{key}")


def test_a_secret_updated_the_kubelets_way_is_read_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The token and the certificate, updated by swapping the volume's ``..data`` link
    (the files' own paths never change): the router serves the new ones."""
    from vertumnus.admintoken import bearer

    ca = make_ca()
    secret = _MountedSecret(tmp_path)

    def issue_and_write(token: str, authority: tuple[bytes, bytes]) -> None:
        issued = admintls.issue(
            authority[0], authority[1], NAME, datetime.datetime.now(datetime.UTC)
        )
        secret.write(
            {"token": token.encode(), "tls.crt": issued.cert_pem, "tls.key": issued.key_pem}
        )

    issue_and_write("first", ca)
    settings = _settings(
        str(tmp_path / "tls.crt"),
        str(tmp_path / "tls.key"),
        admin_token_file=str(tmp_path / "token"),
    )

    async def get_pool(address: str, authority: bytes, token: str) -> None:
        verify = admintls.AdminTLS(authority, NAME)
        async with grpc.aio.secure_channel(address, verify.credentials(), verify.options()) as ch:
            await pool_pb2_grpc.AdminStub(ch).GetPool(
                pool_pb2.GetPoolRequest(), timeout=5, metadata=bearer(token)
            )

    @_sync
    async def run() -> None:
        engine, running = await _pool(settings)
        try:
            await get_pool(running.admin_address, ca[0], "first")
            new_ca = make_ca("rotated")
            issue_and_write("second", new_ca)
            await get_pool(running.admin_address, new_ca[0], "second")
            for authority, token in ((ca[0], "second"), (new_ca[0], "first")):
                with pytest.raises(grpc.aio.AioRpcError):
                    await get_pool(running.admin_address, authority, token)
        finally:
            await running.stop(1.0)
            await engine.server.stop(0)

    run()


def test_a_seeded_certificate_is_the_same_from_any_issuer_in_its_period(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """With a seed the key, serial, validity and signature are derived (RFC 6979 for an EC
    CA; an RSA CA's, the chart's genCA, signs deterministically anyway); without one each
    issue is fresh. Either way it chains to the CA and serves TLS."""
    import datetime as dt

    ec_ca = make_ca()
    rsa_ca = admintls.new_ca("rsa-ca", NOW, rsa=True)
    seed = admintls.cert_seed(b"k" * 32, "ns", "pool", "uid-1")
    later = NOW + dt.timedelta(days=3)
    for ca in (ec_ca, rsa_ca):
        a = admintls.issue(ca[0], ca[1], NAME, NOW, seed)
        assert admintls.period_of(NOW) == admintls.period_of(later)
        assert admintls.issue(ca[0], ca[1], NAME, later, seed) == a
        b = admintls.issue(ca[0], ca[1], NAME, NOW + dt.timedelta(days=30), seed)
        assert b.cert_pem != a.cert_pem and b.key_pem != a.key_pem
        assert admintls.issue(ca[0], ca[1], NAME, NOW) != admintls.issue(ca[0], ca[1], NAME, NOW)
        cert = x509.load_pem_x509_certificate(a.cert_pem)
        cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca[0]))
        assert cert.not_valid_before_utc <= NOW < cert.not_valid_after_utc == a.not_after
        assert 0 < cert.serial_number < 2**159
        (tmp_path / "tls.crt").write_bytes(a.cert_pem)
        (tmp_path / "tls.key").write_bytes(a.key_pem)
        # The pair loads as a server's.
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).load_cert_chain(
            tmp_path / "tls.crt", tmp_path / "tls.key"
        )
