"""The kopf wiring (handlers in a registry of our own, settings) and the CLI."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import kopf

from vertumnus.operator import handlers
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


def test_run_freezes_the_startup_heap_before_kopf_runs(monkeypatch):
    """The operator's process freezes what it imported (vertumnus.gcfreeze) once it is
    set up, before kopf runs its loop: a full collection would otherwise walk it in
    some decision tick."""
    import kopf

    import vertumnus.gcfreeze

    calls: list[str] = []
    # Stand-ins: freezing here would freeze the test runner's own objects.
    monkeypatch.setattr(vertumnus.gcfreeze, "freeze_startup", lambda: calls.append("freeze"))
    monkeypatch.setattr(kopf, "run", lambda **_: calls.append("kopf.run"))
    assert main(["run", "--standalone"]) == 0
    assert calls == ["freeze", "kopf.run"]
