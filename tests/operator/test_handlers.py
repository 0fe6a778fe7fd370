"""The kopf wiring (handlers in a registry of our own, settings) and the CLI."""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import sys
from pathlib import Path

import kopf
import pytest

from vertumnus.admintoken import pool_token
from vertumnus.operator import envnames, handlers
from vertumnus.operator.__main__ import default_priority, main

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "helm" / "vertumnus" / "examples" / "cppool.yaml"


def test_handlers_go_into_the_registry_given_not_kopfs_global_one():
    registry = kopf.OperatorRegistry()
    before = len(kopf.get_default_registry()._spawning.get_all_handlers())
    handlers.register(registry)
    daemons = registry._spawning.get_all_handlers()
    # Named: kopf logs "Daemon 'pool' succeeded.", not "Daemon 'register.<locals>.pool' ...".
    assert [h.id for h in daemons] == ["pool"]
    (daemon,) = daemons
    assert daemon.selector is not None and daemon.selector.group == "vertumnus.io"
    assert daemon.selector.any_name == "cppools" and daemon.requires_finalizer
    assert daemon.cancellation_backoff == 2.0 and daemon.cancellation_timeout == 10.0
    changing = registry._changing.get_all_handlers()
    assert [h.id for h in changing] == ["deleted"]
    watching = registry._watching.get_all_handlers()
    assert [h.id for h in watching] == [handlers.WAKE]  # wakes the pool's loop
    activities = sorted(h.id for h in registry._activities.get_all_handlers())
    assert activities == ["cleanup", "login", "startup"]
    assert len(kopf.get_default_registry()._spawning.get_all_handlers()) == before


def test_under_kopf_run_the_key_comes_from_the_environment_or_the_operator_stops(
    monkeypatch, tmp_path
):
    """``kopf run -m vertumnus.operator.kopf_entry`` has no ``--admin-key-file``: the
    startup handler reads $VERTUMNUS_ADMIN_KEY_FILE (and the CA's variables), and stops
    the operator for good, saying why, when it cannot."""
    import asyncio

    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    (startup,) = [h for h in registry._activities.get_all_handlers() if h.id == "startup"]
    monkeypatch.setattr(handlers, "connection_info", lambda: None)
    monkeypatch.setattr(handlers, "KubeClient", lambda info: object())
    for var in (envnames.ADMIN_KEY_FILE, envnames.ADMIN_CA_FILE, envnames.ADMIN_CA_KEY_FILE):
        monkeypatch.delenv(var, raising=False)

    def start() -> kopf.Memo:
        memo = kopf.Memo()
        asyncio.run(startup.fn(settings=kopf.OperatorSettings(), memo=memo))
        return memo

    with pytest.raises(kopf.PermanentError, match="no admin key"):
        start()
    key = tmp_path / "key"
    key.write_text("k" * 32)
    monkeypatch.setenv("VERTUMNUS_ADMIN_KEY_FILE", str(key))
    memo = start()
    assert memo["admin_key"] == b"k" * 32 and memo["admin_ca"] is None
    monkeypatch.setenv(envnames.ADMIN_CA_FILE, str(tmp_path / "ca.crt"))
    with pytest.raises(kopf.PermanentError, match="go together"):
        start()


def test_settings_keep_kopfs_bookkeeping_in_our_namespace():
    settings = kopf.OperatorSettings()
    handlers.configure(settings, peering_lifetime=12)
    assert settings.persistence.finalizer == "vertumnus.io/finalizer"
    assert settings.peering.lifetime == 12
    assert isinstance(settings.persistence.progress_storage, kopf.AnnotationsProgressStorage)
    assert settings.posting.level >= 30  # only warnings become kopf Events
    assert settings.background.instant_exit_timeout == 0.25  # a stopped pool's loop ends


def test_the_wake_handlers_success_is_not_logged_at_every_event(caplog):
    # kopf logs "Handler '<id>' succeeded." at INFO after every handler it runs; for the
    # handler that only wakes a pool's loop that is a line per status write of every pool.
    handlers.configure(kopf.OperatorSettings())
    handlers.configure(kopf.OperatorSettings())  # a second operator in the process: one filter
    kopf_objects = logging.getLogger("kopf.objects")
    assert len(kopf_objects.filters) == 1
    with caplog.at_level(logging.INFO, logger="kopf.objects"):
        kopf_objects.info(f"Handler {handlers.WAKE!r} succeeded.")
        kopf_objects.info("Handler 'deleted' succeeded.")
        kopf_objects.error(f"Handler {handlers.WAKE!r} failed with an exception")
    assert [r.getMessage() for r in caplog.records] == [
        "Handler 'deleted' succeeded.",
        f"Handler {handlers.WAKE!r} failed with an exception",
    ]


def test_priorities_are_stable_and_differ_between_replicas():
    a, b = default_priority("vt-operator-7d9c-abcde"), default_priority("vt-operator-7d9c-fghij")
    assert a == default_priority("vt-operator-7d9c-abcde") and a != b
    assert 1 <= a < 2**31


def test_render_prints_the_objects_of_the_example(capsys):
    assert main(["render", "-f", str(EXAMPLE), "--namespace", "x"]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    kinds = [o["kind"] for o in items]
    assert kinds.count("Pod") == 2 and kinds[0] == "PodGroup"
    assert all(o["metadata"]["namespace"] == "x" for o in items)
    # No key, no token: never a placeholder a router would take.
    assert not [o for o in items if o["metadata"]["name"].endswith("-router-admin")]


def test_render_with_the_key_includes_the_token_the_operator_would_apply(tmp_path, capsys):
    key = tmp_path / "admin.key"
    key.write_text("k" * 32)
    uid = "11111111-2222-3333-4444-555555555555"
    args = ["render", "-f", str(EXAMPLE), "--namespace", "x", "--uid", uid]
    assert main([*args, "--admin-key-file", str(key)]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    (secret,) = [o for o in items if o["metadata"]["name"].endswith("-router-admin")]
    name = secret["metadata"]["name"].removesuffix("-router-admin")
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token == pool_token(b"k" * 32, "x", name, uid)
    assert main([*args, "--admin-key-file", str(tmp_path / "none")]) == 2
    assert "admin key file" in capsys.readouterr().err


def test_render_with_the_ca_issues_the_routers_certificate(tmp_path, capsys):
    from cryptography import x509

    from tests.router.test_admin_tls import make_ca

    key = tmp_path / "admin.key"
    key.write_text("k" * 32)
    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca[0])
    (tmp_path / "ca.key").write_bytes(ca[1])
    args = ["render", "-f", str(EXAMPLE), "--namespace", "x", "--admin-key-file", str(key)]
    tls = [
        "--admin-ca-file",
        str(tmp_path / "ca.crt"),
        "--admin-ca-key-file",
        str(tmp_path / "ca.key"),
    ]
    assert main([*args, *tls]) == 0
    items = json.loads(capsys.readouterr().out)["items"]
    (secret,) = [o for o in items if o["metadata"]["name"].endswith("-router-admin")]
    assert sorted(secret["data"]) == ["tls.crt", "tls.key", "token"]
    cert = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    cert.verify_directly_issued_by(x509.load_pem_x509_certificate(ca[0]))
    (cm,) = [o for o in items if o["kind"] == "ConfigMap" and "router.json" in o["data"]]
    assert json.loads(cm["data"]["router.json"])["adminTlsCertFile"].endswith("/tls.crt")
    # The CA's two files go together, and need the key the token comes from.
    assert main([*args, "--admin-ca-file", str(tmp_path / "ca.crt")]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["render", "-f", str(EXAMPLE), *tls]) == 2
    assert "needs --admin-key-file" in capsys.readouterr().err


def test_render_names_the_bad_field(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("kind: CPPool\nmetadata: {name: p}\nspec: {gpus: 12, engine: {image: i}}\n")
    assert main(["render", "-f", str(bad)]) == 2
    assert "spec.gpus: gpus must be a multiple of gpusPerDomain" in capsys.readouterr().err


def test_python_dash_m_runs():
    out = subprocess.run(
        [sys.executable, "-m", "vertumnus.operator", "crds"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "name: cppools.vertumnus.io" in out and "clusterkopfpeerings.kopf.dev" in out
    helped = subprocess.run(
        [sys.executable, "-m", "vertumnus.operator", "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "--standalone" in helped and "--priority" in helped


def test_run_freezes_the_startup_heap_before_kopf_runs(monkeypatch, tmp_path):
    """The operator's process freezes what it imported (vertumnus.gcfreeze) once it is
    set up, before kopf runs its loop: a full collection would otherwise walk it in
    some decision tick."""
    import kopf

    import vertumnus.gcfreeze

    calls: list[str] = []
    # Stand-ins: freezing here would freeze the test runner's own objects.
    monkeypatch.setattr(vertumnus.gcfreeze, "freeze_startup", lambda: calls.append("freeze"))
    memos = []

    def run(memo, **_):  # type: ignore[no-untyped-def]
        calls.append("kopf.run")
        memos.append(memo)

    monkeypatch.setattr(kopf, "run", run)
    key = tmp_path / "admin.key"
    key.write_text("k" * 32 + "\n")
    assert main(["run", "--standalone", "--admin-key-file", str(key)]) == 0
    assert calls == ["freeze", "kopf.run"]
    assert memos[0]["admin_key"] == b"k" * 32  # what every pool's token is derived from
    assert memos[0]["admin_ca"] is None  # no CA: Admin in plaintext (a warning says so)
    from tests.router.test_admin_tls import make_ca

    ca = make_ca()
    (tmp_path / "ca.crt").write_bytes(ca[0])
    (tmp_path / "ca.key").write_bytes(ca[1])
    monkeypatch.setenv("VERTUMNUS_ADMIN_CA_FILE", str(tmp_path / "ca.crt"))
    monkeypatch.setenv("VERTUMNUS_ADMIN_CA_KEY_FILE", str(tmp_path / "ca.key"))
    assert main(["run", "--standalone", "--admin-key-file", str(key)]) == 0
    assert memos[1]["admin_ca"] == ca  # what each pool's routers' certificate is issued from


def test_run_refuses_to_start_without_a_usable_admin_key(monkeypatch, tmp_path, capsys):
    """No pool runs with an Admin API anyone could call: no key, or a short one, and the
    operator says what to do instead of starting."""
    import kopf

    monkeypatch.setattr(kopf, "run", lambda **_: pytest.fail("kopf must not start"))
    monkeypatch.delenv("VERTUMNUS_ADMIN_KEY_FILE", raising=False)
    assert main(["run", "--standalone"]) == 2
    assert "--admin-key-file" in capsys.readouterr().err
    short = tmp_path / "short"
    short.write_text("abc")
    assert main(["run", "--standalone", "--admin-key-file", str(short)]) == 2
    assert f"admin key file {short}: 3 bytes" in capsys.readouterr().err
    monkeypatch.setenv("VERTUMNUS_ADMIN_KEY_FILE", str(tmp_path / "missing"))
    assert main(["run", "--standalone"]) == 2
    assert "missing" in capsys.readouterr().err


def test_record_looks_every_comes_from_the_flag_or_the_environment(monkeypatch, tmp_path, capsys):
    """How often a look that decides nothing is written into the status: seconds >= 0
    from ``--record-looks-every`` or $VERTUMNUS_RECORD_LOOKS_EVERY (also under ``kopf
    run``), 30 by default; anything else stops the operator, naming the value."""
    import asyncio

    import kopf

    import vertumnus.gcfreeze
    from vertumnus.operator.pool import RECORD_LOOKS_S

    memos = []
    monkeypatch.setattr(kopf, "run", lambda memo, **_: memos.append(memo))
    monkeypatch.setattr(vertumnus.gcfreeze, "freeze_startup", lambda: None)
    monkeypatch.delenv("VERTUMNUS_RECORD_LOOKS_EVERY", raising=False)
    key = tmp_path / "admin.key"
    key.write_text("k" * 32)
    run = ["run", "--standalone", "--admin-key-file", str(key)]
    assert main(run) == 0 and memos[-1]["record_looks_s"] == RECORD_LOOKS_S == 30.0
    assert main([*run, "--record-looks-every", "0"]) == 0 and memos[-1]["record_looks_s"] == 0.0
    monkeypatch.setenv("VERTUMNUS_RECORD_LOOKS_EVERY", "7.5")
    assert main(run) == 0 and memos[-1]["record_looks_s"] == 7.5
    for bad in ("-1", "soon", "inf", "nan"):
        assert main([*run, "--record-looks-every", bad]) == 2
        err = capsys.readouterr().err
        assert f"($VERTUMNUS_RECORD_LOOKS_EVERY): expected seconds >= 0, got {bad!r}" in err

    registry = kopf.OperatorRegistry()
    handlers.register(registry)
    (startup,) = [h for h in registry._activities.get_all_handlers() if h.id == "startup"]
    monkeypatch.setattr(handlers, "connection_info", lambda: None)
    monkeypatch.setattr(handlers, "KubeClient", lambda info: object())
    monkeypatch.setenv(envnames.ADMIN_KEY_FILE, str(key))
    for var in (envnames.ADMIN_CA_FILE, envnames.ADMIN_CA_KEY_FILE):
        monkeypatch.delenv(var, raising=False)
    memo = kopf.Memo()
    asyncio.run(startup.fn(settings=kopf.OperatorSettings(), memo=memo))
    assert memo["record_looks_s"] == 7.5
    monkeypatch.setenv("VERTUMNUS_RECORD_LOOKS_EVERY", "-3")
    with pytest.raises(kopf.PermanentError, match="expected seconds >= 0, got '-3'"):
        asyncio.run(startup.fn(settings=kopf.OperatorSettings(), memo=kopf.Memo()))
