"""``vertumnus router --config router.json``: the file's mapping onto the router's settings,
flags over the file, each error naming its key, and the contract with the operator (its
own ``router_config()`` output parses into the pool's settings)."""

from __future__ import annotations

import argparse
import copy
import json
import os
from dataclasses import replace
from typing import Any

import pytest

from vertumnus.cli import main
from vertumnus.core.cachesettings import CacheManagerSettings
from vertumnus.core.lattice import layout_for
from vertumnus.core.placement import PlacementParams
from vertumnus.core.planner import PlannerSettings
from vertumnus.core.types import Composition
from vertumnus.operator import resources as res
from vertumnus.operator.crd import parse_spec
from vertumnus.router.cli import register, router_config_from_args
from vertumnus.router.config import (
    ConfigError,
    RouterConfig,
    load_router_config,
    parse_router_config,
)
from vertumnus.router.settings import RouterSettings

OWNER = res.Owner("pool-a", "team", "uid-1")

SPEC = {
    "gpus": 16,
    "gpusPerDomain": 8,
    "engine": {"image": "img:1", "blockSize": 32, "maxTokens": 65536, "basePort": 51000},
    "model": {"name": "m", "path": "/models/m", "profile": "qwen3-30b-a3b/h200"},
    "placement": {"beta": 1.5, "betaBusy": 7.5, "lambda": 0.25},
    "cacheManager": {
        "thetaInter": 0.05,
        "thetaIntra": 4.0,
        "thetaReclaim": 0.5,
        "decay": 0.7,
        "scanIntervalSeconds": 2.0,
    },
    "router": {"port": 50100, "adminPort": 50110, "metricsPort": 9100, "admissionLimit": 77},
    "controller": {"windowSeconds": 30, "hopSeconds": 10},
}
"""A CPPool spec with a non-default value in every field the router reads."""


def _operator_json(spec: dict[str, Any]) -> dict[str, Any]:
    """router.json exactly as the operator's ConfigMap carries it (text, then parsed)."""
    layout = layout_for(Composition.parse("2xCP8"), 8)
    text = res.configmap(parse_spec(spec), OWNER, layout, 3)["data"]["router.json"]
    return json.loads(text)


def _doc() -> dict[str, Any]:
    return _operator_json(copy.deepcopy(SPEC))


# -- the contract with the operator ---------------------------------------------------


def test_the_operators_router_json_gives_the_pools_settings():
    config = parse_router_config(_doc())
    s = config.settings
    assert s.pool == "pool-a"
    assert (s.listen, s.admin_listen, s.metrics_listen) == (
        "0.0.0.0:50100",
        "0.0.0.0:50110",
        "0.0.0.0:9100",
    )
    assert s.admission_limit == 77 and s.profile == "qwen3-30b-a3b/h200"
    # Admin needs the pool's token, from the Secret the pod mounts there.
    assert s.admin_token_file == res.ROUTER_ADMIN_TOKEN
    assert s.placement == PlacementParams(beta=1.5, beta_busy=7.5, lam=0.25)
    assert s.placement == parse_spec(SPEC).placement_params()
    assert s.cache_manager == CacheManagerSettings(
        theta_inter=0.05, theta_intra=4.0, theta_reclaim=0.5, decay=0.7, scan_interval_s=2.0
    )
    assert s.controller is None  # the operator runs it
    assert config.engines == (
        "pool-a-d0.pool-a-engines.team.svc:51000",
        "pool-a-d1.pool-a-engines.team.svc:51000",
    )
    # Managed Redis: the operator's Service, the password in the operator's variable.
    assert config.redis_url == "redis://pool-a-redis.team.svc:6379/0"
    assert config.redis_password_env == "VERTUMNUS_REDIS_PASSWORD"
    # The rest of RouterSettings is the router's own default.
    assert (s.index_source, s.request_timeout_s) == ("workers", RouterSettings().request_timeout_s)


def test_the_operators_redis_modes_and_a_disabled_cache_manager():
    external = parse_router_config(
        _operator_json(
            {
                **SPEC,
                "redis": {"mode": "external", "url": "rediss://cache.example:6380/2"},
                "cacheManager": {"enabled": False},
            }
        )
    )
    assert external.redis_url == "rediss://cache.example:6380/2"
    assert external.redis_password_env is None  # no secretRef: no password
    assert external.settings.cache_manager is None
    none = parse_router_config(_operator_json({**SPEC, "redis": {"mode": "none"}}))
    assert (none.redis_url, none.redis_password_env) == (None, None)


def test_every_key_the_operator_writes_is_one_the_router_reads_or_ignores():
    doc = _doc()
    parse_router_config(doc)  # no unknown key
    for section in ("model", "engine", "placement", "cacheManager", "controller", "redis"):
        doc[section]["surprise"] = 1
        with pytest.raises(ConfigError, match=rf"^{section}\.surprise is not a known key"):
            parse_router_config(doc)
        del doc[section]["surprise"]


def test_the_informational_keys_change_nothing():
    doc = _doc()
    base = parse_router_config(doc)
    doc["namespace"] = "elsewhere"
    doc["model"].update(name="other", path="/x")
    doc["engine"].update(blockSize=64, maxTokens=1)
    doc["domainSize"] = 4
    doc["controller"].update(windowSeconds=5, hopSeconds=1)
    doc["engines"][0]["pod"] = "renamed"
    assert parse_router_config(doc) == base


def test_the_engine_kind_sets_how_long_a_regroup_may_take():
    doc = _doc()
    assert parse_router_config(doc).settings.switch_timeout_s == 60.0  # torch
    doc["engine"]["kind"] = "sglang"  # restarts servers: the weights load again
    assert parse_router_config(doc).settings.switch_timeout_s == 900.0
    doc["engine"]["kind"] = "vllm"
    with pytest.raises(ConfigError, match=r"^engine\.kind must be one of \['sglang', 'torch'\]"):
        parse_router_config(doc)


# -- the file alone ------------------------------------------------------------------


def test_an_empty_file_is_the_defaults_of_an_operator_pool():
    # A router.json comes from the operator, whose controller runs the transitions.
    operator_pool = RouterConfig(RouterSettings(external_controller=True))
    assert parse_router_config({}) == operator_pool
    assert parse_router_config({}).settings == RouterSettings(external_controller=True)


def test_engines_are_ordered_by_domain_and_ipv6_is_bracketed():
    config = parse_router_config(
        {
            "engines": [
                {"domain": 1, "host": "b", "basePort": 2},
                {"domain": 0, "host": "fd00::1", "basePort": 1},
            ]
        }
    )
    assert config.engines == ("[fd00::1]:1", "b:2")


def test_password_env_without_a_mode_and_a_url_alone_means_external():
    config = parse_router_config({"redis": {"url": "redis://r:6379/0", "passwordEnv": "MY_PW"}})
    assert (config.redis_url, config.redis_password_env) == ("redis://r:6379/0", "MY_PW")


def _with(path: str, value: Any) -> dict[str, Any]:
    """The operator's document with ``path`` (dotted; ``engines.0.host``) set, or deleted
    when ``value`` is ``...``."""
    doc = _doc()
    *parents, last = path.split(".")
    node: Any = doc
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    key: Any = int(last) if isinstance(node, list) else last
    if value is ...:
        del node[key]
    else:
        node[key] = value
    return doc


BAD = [
    ("surprise", 1, "surprise is not a known key (the top level takes pool, namespace,"),
    ("placement.gamma", 1, "placement.gamma is not a known key (placement takes beta,"),
    ("placement", [1], "placement must be an object, got a list"),
    ("placement.beta", 0.5, "placement.beta must be >= 1, got 0.5"),
    ("placement.beta", "2", "placement.beta must be a number, got '2'"),
    ("placement.beta", True, "placement.beta must be a number, got True"),
    ("placement.beta", float("nan"), "placement.beta must be finite, got nan"),
    ("placement.betaBusy", 1.2, "placement.betaBusy must be >= placement.beta (1.5), got 1.2"),
    ("placement.lambda", -0.1, "placement.lambda must be >= 0, got -0.1"),
    ("cacheManager.enabled", "yes", "cacheManager.enabled must be true or false, got 'yes'"),
    ("cacheManager.thetaInter", -1, "cacheManager.thetaInter must be >= 0, got -1"),
    (
        "cacheManager.thetaReclaim",
        4.0,
        "cacheManager.thetaReclaim must be below cacheManager.thetaIntra (4), got 4",
    ),
    ("cacheManager.decay", 1.0, "cacheManager.decay must be < 1, got 1"),
    ("cacheManager.decay", 0, "cacheManager.decay must be > 0, got 0"),
    ("cacheManager.scanIntervalSeconds", 0, "cacheManager.scanIntervalSeconds must be > 0, got 0"),
    ("port", 0, "port must be >= 1, got 0"),
    ("port", 70000, "port must be <= 65535, got 70000"),
    ("metricsPort", 9.5, "metricsPort must be an integer, got 9.5"),
    ("metricsPort", 50100, "metricsPort must differ from port (50100)"),
    ("adminPort", 50100, "adminPort must differ from port (50100)"),
    ("adminPort", "50110", "adminPort must be an integer, got '50110'"),
    ("admissionLimit", 0, "admissionLimit must be >= 1, got 0"),
    ("pool", 3, "pool must be a string, got 3"),
    ("pool", "a:b", "pool name 'a:b' must be non-empty without braces, colons or spaces"),
    ("model.profile", "", "model.profile must not be empty"),
    ("redis.mode", "cluster", "redis.mode must be one of managed, external, none, got 'cluster'"),
    ("redis.url", ..., "redis.url is required with redis.mode managed"),
    ("redis.mode", "none", "redis.url must be absent with redis.mode none"),
    ("redis.url", "http://r:1/0", "redis.url must be redis://host:port/db (or rediss://)"),
    ("redis.url", "redis://:hunter2@r:6379/0", "redis.url embeds a password: remove it"),
    ("redis.passwordEnv", "1BAD", "redis.passwordEnv must name an environment variable"),
    ("engines", {}, "engines must be a list, got a dict"),
    ("engines.0", "h:1", "engines[0] must be an object, got a string"),
    ("engines.0.host", ..., "engines[0].host is required"),
    ("engines.1.basePort", ..., "engines[1].basePort is required"),
    ("engines.1.basePort", 0, "engines[1].basePort must be >= 1, got 0"),
    ("engines.0.port", 1, "engines[0].port is not a known key"),
    ("engines.1.domain", 0, "engines[1].domain repeats domain 0"),
    ("engines.1.domain", 2, "engines must cover domains 0..1 once each, got [0, 2]"),
    ("controller.external", False, "controller.external must be true"),
    ("namespace", 3, "namespace must be a string, got 3"),
    ("adminTokenFile", 3, "adminTokenFile must be a string, got 3"),
    ("engine.blockSize", "16", "engine.blockSize must be an integer, got '16'"),
]


@pytest.mark.parametrize(("path", "value", "message"), BAD, ids=[f"{p}={v!r}" for p, v, _ in BAD])
def test_a_bad_value_is_refused_naming_its_key(path, value, message):
    with pytest.raises(ConfigError) as info:
        parse_router_config(_with(path, value))
    assert str(info.value).startswith(message), str(info.value)


def test_a_document_that_is_not_an_object_is_refused():
    with pytest.raises(ConfigError, match="must be an object, got a list"):
        parse_router_config([])


# -- the command line --------------------------------------------------------------------


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="vertumnus")
    register(parser.add_subparsers(dest="command"))
    return parser.parse_args(["router", *argv])


@pytest.fixture
def router_json(tmp_path):
    path = tmp_path / "router.json"
    path.write_text(json.dumps(_doc()))
    return str(path)


def test_flags_given_override_the_file_and_the_rest_keep_it(router_json):
    config = router_config_from_args(_args("--config", router_json, "--beta-busy", "9"))
    from_file = parse_router_config(_doc())
    busier = PlacementParams(beta=1.5, beta_busy=9.0, lam=0.25)
    # Only beta_busy moved; beta, lambda and everything else are the file's.
    assert config == replace(from_file, settings=replace(from_file.settings, placement=busier))
    everything = router_config_from_args(
        _args(
            "--config",
            router_json,
            "--engine",
            "h:1",
            "--listen",
            "127.0.0.1:6000",
            "--metrics-listen",
            "",
            "--admin-listen",
            "",
            "--pool",
            "other",
            "--profile",
            "cpu-tiny",
            "--admission-limit",
            "5",
            "--beta",
            "2",
            "--beta-busy",
            "3",
            "--lambda",
            "0",
            "--redis-url",
            "redis://elsewhere:1/0",
            "--index-source",
            "store",
            "--no-cache-manager",
            "--controller",
        )
    )
    s = everything.settings
    assert everything.engines == ("h:1",)
    assert (s.listen, s.metrics_listen, s.pool, s.profile, s.admission_limit) == (
        "127.0.0.1:6000",
        "",
        "other",
        "cpu-tiny",
        5,
    )
    assert s.admin_listen == ""  # empty: Admin on --listen, whatever the file's adminPort
    assert s.placement == PlacementParams(beta=2.0, beta_busy=3.0, lam=0.0)
    assert s.cache_manager is None and s.controller is not None
    # The controller's defaults, its what-if replays on up to two threads.
    threads = min(2, os.cpu_count() or 1)
    assert s.controller == PlannerSettings(whatif_threads=threads)
    assert s.index_source == "store" and everything.redis_url == "redis://elsewhere:1/0"
    # The file's password variable still names where the password is.
    assert everything.redis_password_env == "VERTUMNUS_REDIS_PASSWORD"


def test_without_a_file_the_flags_over_the_defaults():
    config = router_config_from_args(_args("--engine", "a:1", "--engine", "b:2"))
    assert config == RouterConfig(engines=("a:1", "b:2"))
    tuned = router_config_from_args(
        _args("--engine", "a:1", "--beta", "2", "--beta-busy", "4", "--lambda", "0.3")
    )
    assert tuned.settings.placement == PlacementParams(beta=2.0, beta_busy=4.0, lam=0.3)
    plain = router_config_from_args(_args("--engine", "a:1", "--controller", "--no-shadow"))
    assert plain.settings.controller is not None and not plain.settings.controller.shadow
    with pytest.raises(ValueError, match="--no-shadow needs --controller"):
        router_config_from_args(_args("--engine", "a:1", "--no-shadow"))


def test_the_command_line_has_no_password_flag():
    parser = argparse.ArgumentParser(prog="vertumnus")
    sub = parser.add_subparsers(dest="command")
    register(sub)
    options = [o for a in sub.choices["router"]._actions for o in a.option_strings]
    assert "--config" in options and not [o for o in options if "pass" in o or "secret" in o]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--beta", "0.5"], "--beta/--beta-busy/--lambda: beta must be >= 1, got 0.5"),
        (["--lambda", "-1"], "--beta/--beta-busy/--lambda: lambda must be >= 0, got -1.0"),
        (["--beta", "20"], "beta_busy must be >= beta, got 10.0 < 20.0"),
    ],
)
def test_bad_placement_flags_exit_2_with_one_line(capsys, argv, message):
    assert main(["router", "--engine", "h:1", *argv]) == 2
    err = capsys.readouterr().err
    assert err == f"vertumnus: error: {err.removeprefix('vertumnus: error: ')}"
    assert message in err and err.count("\n") == 1


def test_a_flag_that_contradicts_the_file_names_the_file(capsys, router_json):
    # The file's beta is 1.5: a busy beta below it is refused, and the file is named.
    assert main(["router", "--config", router_json, "--beta-busy", "1.2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"vertumnus: error: --beta/--beta-busy/--lambda over {router_json}'s")
    assert "beta_busy must be >= beta" in err


def test_a_bad_file_exits_2_with_one_line_naming_the_file_and_key(capsys, tmp_path):
    bad = tmp_path / "router.json"
    bad.write_text(json.dumps(_with("placement.beta", 0.5)))
    assert main(["router", "--config", str(bad)]) == 2
    assert capsys.readouterr().err == (
        f"vertumnus: error: {bad}: placement.beta must be >= 1, got 0.5\n"
    )
    bad.write_text("{not json")
    assert main(["router", "--config", str(bad)]) == 2
    assert capsys.readouterr().err.startswith(f"vertumnus: error: {bad}: not valid JSON:")
    missing = tmp_path / "absent.json"
    assert main(["router", "--config", str(missing)]) == 2
    assert capsys.readouterr().err == (
        f"vertumnus: error: {missing}: cannot read the router config: No such file or directory\n"
    )


def test_no_engines_anywhere_exits_2(capsys, tmp_path):
    empty = tmp_path / "router.json"
    empty.write_text("{}")
    for argv in (["router"], ["router", "--config", str(empty)]):
        assert main(argv) == 2
        assert capsys.readouterr().err == (
            "vertumnus: error: no engines: give --engine HOST:PORT once per domain, "
            "or --config with engines\n"
        )


def test_load_router_config_reads_the_file(router_json):
    assert load_router_config(router_json) == parse_router_config(_doc())


# -- the Redis password -------------------------------------------------------------------


def test_the_password_comes_from_the_variable_the_file_names(monkeypatch):
    pytest.importorskip("redis")
    from vertumnus.router.cli import _store

    monkeypatch.delenv("VERTUMNUS_REDIS_PASSWORD", raising=False)
    monkeypatch.delenv("VERTUMNUS_REDIS_PASSWORD_FILE", raising=False)
    monkeypatch.setenv("POOL_REDIS_SECRET", "s3cret")
    config = parse_router_config(
        {
            "redis": {
                "mode": "external",
                "url": "redis://r:6379/0",
                "passwordEnv": "POOL_REDIS_SECRET",
            }
        }
    )
    store = _store(config)  # nothing is dialled yet
    assert store.client.connection_pool.connection_kwargs["password"] == "s3cret"
    # Without passwordEnv the router's own variable is read (what the operator sets).
    monkeypatch.setenv("VERTUMNUS_REDIS_PASSWORD", "default")
    plain = _store(parse_router_config({"redis": {"url": "redis://r:6379/0"}}))
    assert plain.client.connection_pool.connection_kwargs["password"] == "default"
    assert _store(RouterConfig()) is None
