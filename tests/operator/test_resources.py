"""Rendering: domain pods, gang backends, the router's objects, managed Redis."""

from __future__ import annotations

import base64
import json

import pytest

from vertumnus.core.lattice import Slot, layout_for
from vertumnus.core.types import Composition
from vertumnus.operator import gang as gangs
from vertumnus.operator import resources as res
from vertumnus.operator.crd import parse_spec
from vertumnus.operator.reconcile import pool_objects

OWNER = res.Owner("pool", "ns", "uid-1")
TOL = {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"}


def _spec(**extra):
    return parse_spec({"gpus": 16, "engine": {"image": "img:1"}, **extra})


def test_a_domain_pod_holds_the_domain_and_its_grouping_as_annotations():
    spec = _spec(
        scheduling={
            "tolerations": [TOL],
            "nodeSelector": {"gpu": "h200"},
            "priorityClassName": "high",
        },
        model={"path": "/m/Qwen 3"},
    )
    slots = (Slot(3, 4, 1, 0), Slot(4, 4, 1, 4))
    pod = res.domain_pod(spec, OWNER, 1, slots, 7, gangs.NativeGang())
    meta, body = pod["metadata"], pod["spec"]
    assert meta["name"] == "pool-d1"
    assert meta["labels"][res.LABEL_POOL] == "pool" and meta["labels"][res.LABEL_DOMAIN] == "1"
    assert meta["annotations"][res.ANN_GROUPING] == "3:CP4@0,4:CP4@4"
    assert meta["annotations"][res.ANN_EPOCH] == "7"
    assert meta["annotations"][res.ANN_DEGREES] == "4,4"
    assert meta["annotations"][res.ANN_WORKERS] == "3,4"
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "vertumnus.io/v1alpha1",
            "kind": "CPPool",
            "name": "pool",
            "uid": "uid-1",
            "controller": True,
        }
    ]
    (c,) = body["containers"]
    assert c["resources"]["limits"] == {"nvidia.com/gpu": "8"}
    assert len(c["ports"]) == 8 and c["ports"][7]["containerPort"] == 50058
    cmd = c["command"][2]
    assert "vertumnus serve --ranks 8" in cmd and "$(cat /etc/vertumnus/pod/degrees)" in cmd
    # The ids too: a restarted engine (or domain 1's) must serve the pool-level ids the
    # routers and the status know, not ids counted from its own ranks.
    assert '--worker-ids "$(cat /etc/vertumnus/pod/workers)"' in cmd
    items = next(v for v in body["volumes"] if v["name"] == "podinfo")["downwardAPI"]["items"]
    files = {i["path"]: i["fieldRef"]["fieldPath"] for i in items}
    assert files["workers"] == "metadata.annotations['vertumnus.io/workers']"
    assert "--model '/m/Qwen 3'" in cmd
    assert body["schedulingGroup"] == {"podGroupName": "pool"}
    assert body["tolerations"] == [TOL] and body["nodeSelector"] == {"gpu": "h200"}
    assert body["priorityClassName"] == "high"
    assert body["hostname"] == "pool-d1" and body["subdomain"] == "pool-engines"


def test_the_pod_spec_does_not_depend_on_the_grouping():
    """A split rewrites annotations only: the spec (and its hash) must not move."""
    spec = _spec()
    a = res.domain_pod(spec, OWNER, 0, (Slot(0, 8, 0, 0),), 1, gangs.NativeGang())
    b = res.domain_pod(spec, OWNER, 0, (Slot(1, 4, 0, 0), Slot(2, 4, 0, 4)), 2, gangs.NativeGang())
    assert a["spec"] == b["spec"]
    assert (
        a["metadata"]["annotations"][res.ANN_SPEC_HASH]
        == b["metadata"]["annotations"][res.ANN_SPEC_HASH]
    )
    c = res.domain_pod(
        _spec(engine={"image": "img:2"}), OWNER, 0, (Slot(0, 8, 0, 0),), 1, gangs.NativeGang()
    )
    assert (
        c["metadata"]["annotations"][res.ANN_SPEC_HASH]
        != a["metadata"]["annotations"][res.ANN_SPEC_HASH]
    )


def test_grouping_round_trips_and_bad_terms_are_named():
    slots = (Slot(5, 2, 3, 4), Slot(1, 4, 3, 0), Slot(6, 2, 3, 6))
    text = res.format_grouping(slots)
    assert text == "1:CP4@0,5:CP2@4,6:CP2@6"
    assert sorted(res.parse_grouping(text, 3), key=lambda s: s.offset) == sorted(
        slots, key=lambda s: s.offset
    )
    with pytest.raises(ValueError, match="bad grouping term 'x'"):
        res.parse_grouping("1:CP4@0,x", 0)


def test_native_volcano_and_none_gangs():
    native = gangs.NativeGang().group("pool", "ns", 3, 24, "nvidia.com/gpu", {"a": "b"})
    assert native["apiVersion"] == "scheduling.k8s.io/v1beta1" and native["kind"] == "PodGroup"
    assert native["spec"] == {"schedulingPolicy": {"gang": {"minCount": 3}}}

    volcano = gangs.VolcanoGang("gpu-queue")
    group = volcano.group("pool", "ns", 3, 24, "nvidia.com/gpu", {})
    assert group["apiVersion"] == "scheduling.volcano.sh/v1beta1"
    assert group["spec"] == {
        "minMember": 3,
        "minResources": {"nvidia.com/gpu": "24"},
        "queue": "gpu-queue",
    }
    pod = res.domain_pod(
        _spec(gang={"backend": "volcano"}), OWNER, 0, (Slot(0, 8, 0, 0),), 1, volcano
    )
    assert pod["spec"]["schedulerName"] == "volcano" and "schedulingGroup" not in pod["spec"]
    assert pod["metadata"]["annotations"]["scheduling.k8s.io/group-name"] == "pool"
    assert volcano.dropped(pod, "pool") is None
    assert volcano.status({"status": {"phase": "Running"}}).scheduled is True
    assert volcano.status(
        {
            "status": {
                "phase": "Pending",
                "conditions": [
                    {
                        "type": "Unschedulable",
                        "status": "True",
                        "reason": "NotEnoughResources",
                        "message": "m",
                    }
                ],
            }
        }
    ) == gangs.GangStatus(False, "NotEnoughResources", "m")

    none = gangs.NoGang()
    assert none.group("pool", "ns", 3, 24, "nvidia.com/gpu", {}) is None
    plain = res.domain_pod(_spec(gang={"backend": "none"}), OWNER, 0, (Slot(0, 8, 0, 0),), 1, none)
    assert "schedulingGroup" not in plain["spec"] and "schedulerName" not in plain["spec"]
    assert none.status(None).scheduled is False


def test_a_dropped_scheduling_group_is_detected():
    native = gangs.NativeGang()
    pod = res.domain_pod(_spec(), OWNER, 0, (Slot(0, 8, 0, 0),), 1, native)
    assert native.dropped(pod, "pool") is None
    del pod["spec"]["schedulingGroup"]  # what an API server with the gate off returns
    assert "GenericWorkload" in (native.dropped(pod, "pool") or "")
    assert (
        native.status(
            {
                "status": {
                    "conditions": [
                        {
                            "type": "PodGroupInitiallyScheduled",
                            "status": "False",
                            "reason": "Unschedulable",
                            "message": "minCount (3) cannot be satisfied",
                        }
                    ]
                }
            }
        ).scheduled
        is False
    )
    assert native.status({}).scheduled is None


def test_the_router_gets_its_settings_and_the_layout():
    spec = _spec(
        placement={"beta": 2.0, "betaBusy": 4.0, "lambda": 0.3},
        cacheManager={"thetaIntra": 6.0},
        router={"replicas": 3, "image": "r:9"},
        redis={
            "mode": "external",
            "url": "redis://r:6379/0",
            "secretRef": {"name": "s", "key": "k"},
        },
    )
    layout = layout_for(Composition.parse("2xCP4+1xCP8"), 8)
    cm = res.configmap(spec, OWNER, layout, 4)
    cfg = json.loads(cm["data"]["router.json"])
    assert cfg["placement"] == {"beta": 2.0, "betaBusy": 4.0, "lambda": 0.3}
    assert cfg["cacheManager"]["thetaIntra"] == 6.0
    assert cfg["redis"] == {
        "mode": "external",
        "url": "redis://r:6379/0",
        "passwordEnv": "VERTUMNUS_REDIS_PASSWORD",
    }
    assert cfg["engines"][1]["host"] == "pool-d1.pool-engines.ns.svc"
    lay = json.loads(cm["data"]["layout.json"])
    assert lay["epoch"] == 4 and [w["degree"] for w in lay["workers"]] == [8, 4, 4]
    dep = res.router_deployment(spec, OWNER)
    assert dep["spec"]["replicas"] == 3
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    assert c["image"] == "r:9"
    assert c["env"][1] == {
        "name": "VERTUMNUS_REDIS_PASSWORD",
        "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}},
    }
    # The router reads router.json from the mounted ConfigMap; only its name is a flag
    # (and its shutdown grace, the drain timeout).
    assert c["args"] == [
        "vertumnus",
        "router",
        "--config",
        "/etc/vertumnus/router/router.json",
        "--router-id",
        "$(POD_NAME)",
        "--shutdown-grace",
        "60",
    ]
    config, admin = c["volumeMounts"]
    assert config["mountPath"] + "/router.json" == c["args"][3]
    volumes = dep["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["configMap"]["name"] == "pool-router"
    # The Admin token: the pool's Secret, mounted where router.json says it is.
    assert admin["name"] == volumes[1]["name"] and admin["readOnly"]
    assert volumes[1]["secret"] == {"secretName": res.admin_secret_name(OWNER)}
    assert res.admin_secret_name(OWNER) == "pool-router-admin"
    router_json = json.loads(cm["data"]["router.json"])
    assert router_json["adminTokenFile"] == f"{admin['mountPath']}/token"
    assert "adminTlsCertFile" not in router_json  # no CA: Admin in plaintext
    secret = res.admin_secret(OWNER, "tok")
    assert {k: base64.b64decode(v) for k, v in secret["data"].items()} == {"token": b"tok"}
    # With the operator's CA: the certificate beside the token, where router.json says.
    secret = res.admin_secret(OWNER, "tok", (b"CERT", b"KEY"))
    files = {f"{admin['mountPath']}/{k}": base64.b64decode(v) for k, v in secret["data"].items()}
    tls_json = json.loads(res.configmap(spec, OWNER, layout, 4, True)["data"]["router.json"])
    assert files == {
        tls_json["adminTokenFile"]: b"tok",
        tls_json["adminTlsCertFile"]: b"CERT",
        tls_json["adminTlsKeyFile"]: b"KEY",
    }
    # Turning TLS on rolls the routers (they read router.json at start).
    hashes = {
        res.router_deployment(spec, OWNER, tls)["spec"]["template"]["metadata"]["annotations"][
            res.ANN_ROUTER_CONFIG_HASH
        ]
        for tls in (False, True)
    }
    assert len(hashes) == 2
    assert res.redis_objects(spec, OWNER) == []


def test_a_router_json_change_rolls_the_router_and_an_epoch_switch_does_not():
    """The router reads router.json only at start: its digest is on the pod template."""

    def template(spec):
        return res.router_deployment(spec, OWNER)["spec"]["template"]

    base = template(_spec())
    assert base == template(_spec())
    changed = template(_spec(placement={"beta": 2.0}))
    assert (
        changed["metadata"]["annotations"][res.ANN_ROUTER_CONFIG_HASH]
        != base["metadata"]["annotations"][res.ANN_ROUTER_CONFIG_HASH]
    )
    assert changed["spec"] == base["spec"]
    # The layout (layout.json, per epoch) is not part of the Deployment at all.
    spec = _spec()
    a = res.configmap(spec, OWNER, layout_for(Composition.parse("2xCP8"), 8), 1)
    b = res.configmap(spec, OWNER, layout_for(Composition.parse("4xCP4"), 8), 2)
    assert a["data"]["router.json"] == b["data"]["router.json"]
    assert a["data"]["layout.json"] != b["data"]["layout.json"]


def test_every_object_is_owned_and_labelled():
    spec = _spec(redis={"mode": "managed"})
    layout = layout_for(Composition.parse("2xCP8"), 8)
    objs = pool_objects(spec, OWNER, layout, 1) + [
        res.redis_secret(OWNER, "p"),
        res.admin_secret(OWNER, "tok"),
    ]
    assert sorted(o["kind"] for o in objs) == [
        "ConfigMap",
        "Deployment",
        "Deployment",
        "PodDisruptionBudget",
        "PodDisruptionBudget",
        "Secret",
        "Secret",
        "Service",
        "Service",
        "Service",
    ]
    for o in objs:
        assert o["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert o["metadata"]["labels"][res.LABEL_POOL] == "pool"
    pod = res.redis_objects(spec, OWNER)[0]["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    assert init["env"][0]["valueFrom"]["secretKeyRef"] == {"name": "pool-redis", "key": "password"}
    assert not any("PASSWORD" in a for a in pod["containers"][0]["args"])
    assert "env" not in pod["containers"][0]


def test_the_managed_redis_reads_its_password_from_a_file_not_its_command_line(tmp_path):
    """The rendered init script and redis-server arguments, run here (the config folder
    moved under tmp_path): a real redis-server that refuses a client without the password
    and whose command line does not hold it."""
    import os
    import subprocess
    import time

    import redis as redis_py
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    from tests.redis_server import free_port, redis_server_binary

    binary = redis_server_binary()
    pod = res.redis_objects(_spec(redis={"mode": "managed"}), OWNER)[0]["spec"]["template"]["spec"]
    (init,), (server,) = pod["initContainers"], pod["containers"]
    here = str(tmp_path)

    def local(args):
        return [a.replace(res.REDIS_CONF_DIR, here) for a in args]

    password = "s3cret-Token_xyz"
    env = {**os.environ, res.REDIS_PASSWORD_ENV: password}
    subprocess.run(local(init["command"]), env=env, check=True)
    conf = tmp_path / "redis.conf"
    assert conf.stat().st_mode & 0o777 == 0o600  # the redis user's alone
    port = free_port()
    args = local(server["args"])
    assert args[0] == "redis-server"
    proc = subprocess.Popen(
        [binary, *args[1:], "--port", str(port), "--bind", "127.0.0.1", "--dir", here],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                assert redis_py.Redis(port=port, password=password).ping()
                break
            except redis_py.ConnectionError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        with pytest.raises(redis_py.AuthenticationError):
            redis_py.Redis(port=port, retry=Retry(NoBackoff(), 0)).get("x")
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert password.encode() not in f.read()
    finally:
        proc.kill()
        proc.wait(10)


def test_the_router_command_line_parses_with_the_routers_own_parser(tmp_path):
    """The Deployment's args are what `vertumnus router` (router/cli.py) accepts, and with
    the ConfigMap's router.json at the mount path they give the pool's settings."""
    import argparse

    from vertumnus.router.cli import register, router_config_from_args

    parser = argparse.ArgumentParser(prog="vertumnus")
    register(parser.add_subparsers(dest="command"))
    spec = _spec(
        redis={"mode": "managed"},
        cacheManager={"enabled": False},
        placement={"beta": 1.5, "betaBusy": 6.0, "lambda": 0.2},
    )
    args = res.router_deployment(spec, OWNER)["spec"]["template"]["spec"]["containers"][0]["args"]
    layout = layout_for(Composition.parse("2xCP8"), 8)
    mounted = tmp_path / "router.json"
    mounted.write_text(res.configmap(spec, OWNER, layout, 1)["data"]["router.json"])
    argv = [a.replace("$(POD_NAME)", "pool-router-abc") for a in args[1:]]
    ns = parser.parse_args([str(mounted) if a == res.ROUTER_CONFIG_FILE else a for a in argv])
    assert ns.command == "router" and ns.router_id == "pool-router-abc" and not ns.controller
    assert ns.shutdown_grace == 60.0
    config = router_config_from_args(ns)
    assert config.engines == (
        "pool-d0.pool-engines.ns.svc:50051",
        "pool-d1.pool-engines.ns.svc:50051",
    )
    s = config.settings
    assert (s.listen, s.metrics_listen, s.pool) == ("0.0.0.0:50050", "0.0.0.0:9090", "pool")
    assert config.redis_url == "redis://pool-redis.ns.svc:6379/0"
    assert config.redis_password_env == "VERTUMNUS_REDIS_PASSWORD"
    assert s.cache_manager is None and s.controller is None
    assert s.profile == "qwen3-30b-a3b/h200" and s.admission_limit == 1024
    assert (s.placement.beta, s.placement.beta_busy, s.placement.lam) == (1.5, 6.0, 0.2)


def test_evictions_take_at_most_max_unavailable_domain_pods():
    spec = _spec(gpus=32, updateStrategy={"rollingUpdate": {"maxUnavailable": 2}})
    pdb = res.domains_pdb(OWNER, spec)
    assert pdb["spec"] == {
        "minAvailable": 2,  # 4 domains, 2 may go
        "selector": {"matchLabels": {res.LABEL_POOL: "pool", res.LABEL_COMPONENT: "engine"}},
    }
    layout = layout_for(Composition.parse("2xCP8"), 8)
    pod = res.domain_pod(_spec(), OWNER, 0, layout.domain(0), 1, gangs.backend_for("native"))
    labels = pod["metadata"]["labels"]
    assert all(labels[k] == v for k, v in pdb["spec"]["selector"]["matchLabels"].items())
    # One domain, or as many allowed as there are: no eviction is refused forever.
    assert res.domains_pdb(OWNER, _spec(gpus=8))["spec"]["minAvailable"] == 0


def test_the_router_serves_admin_on_its_own_port_through_the_service():
    spec = _spec(router={"port": 50100, "adminPort": 50111})
    (container,) = res.router_deployment(spec, OWNER)["spec"]["template"]["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["grpc"] == 50100 and ports["admin"] == 50111
    service = {p["name"]: p for p in res.router_service(spec, OWNER)["spec"]["ports"]}
    assert service["admin"] == {"name": "admin", "port": 50111, "targetPort": "admin"}
    assert res.router_config(spec, OWNER)["adminPort"] == 50111


def test_router_replicas_are_evicted_one_at_a_time_spread_and_rolled_with_a_surge():
    spec = _spec(router={"replicas": 3})
    pdb = res.router_pdb(OWNER)
    dep = res.router_deployment(spec, OWNER)
    labels = dep["spec"]["template"]["metadata"]["labels"]
    selector = pdb["spec"]["selector"]["matchLabels"]
    assert pdb["spec"]["maxUnavailable"] == 1 and selector.items() <= labels.items()
    assert selector == dep["spec"]["selector"]["matchLabels"]
    # Only the router pods: not the engines', not Redis's.
    assert selector[res.LABEL_COMPONENT] == "router"
    (spread,) = dep["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert spread["whenUnsatisfiable"] == "ScheduleAnyway"
    assert spread["labelSelector"]["matchLabels"] == selector
    assert dep["spec"]["strategy"]["rollingUpdate"] == {"maxUnavailable": 0, "maxSurge": 1}


def test_a_router_pod_being_deleted_answers_what_it_holds_before_it_is_killed():
    # A router waits for its requests in flight as long as a drain waits for a prefill.
    spec = _spec(controller={"drainTimeoutSeconds": 120})
    pod = res.router_deployment(spec, OWNER)["spec"]["template"]["spec"]
    (router,) = pod["containers"]
    assert router["args"][-2:] == ["--shutdown-grace", "120"]
    assert router["lifecycle"]["preStop"] == {"sleep": {"seconds": res.ROUTER_PRESTOP_S}}
    assert pod["terminationGracePeriodSeconds"] > res.ROUTER_PRESTOP_S + 120


def test_a_pool_with_a_tls_secret_serves_prefill_over_tls_and_is_probed_in_plaintext(tmp_path):
    """``spec.router.tls.secretName``: the Secret mounted, router.json naming its files and
    the health port, the kubelet's gRPC probe on that port (it speaks no TLS); and the
    router, given that router.json, serves TLS with them."""
    from vertumnus.router.config import load_router_config

    plain = _spec()
    (c,) = res.router_deployment(plain, OWNER)["spec"]["template"]["spec"]["containers"]
    assert c["readinessProbe"]["grpc"] == {"port": 50050}
    assert "tlsCertFile" not in res.router_config(plain, OWNER)
    assert "health" not in {p["name"] for p in c["ports"]}

    spec = _spec(router={"tls": {"secretName": "prefill-cert"}, "healthPort": 50071})
    pod = res.router_deployment(spec, OWNER)["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["readinessProbe"]["grpc"] == {"port": 50071}
    assert {"name": "health", "containerPort": 50071} in c["ports"]
    assert {"name": "tls", "mountPath": res.ROUTER_TLS, "readOnly": True} in c["volumeMounts"]
    assert {"name": "tls", "secret": {"secretName": "prefill-cert"}} in pod["volumes"]
    doc = res.router_config(spec, OWNER)
    assert doc["tlsCertFile"] == f"{res.ROUTER_TLS}/tls.crt"
    assert doc["tlsKeyFile"] == f"{res.ROUTER_TLS}/tls.key"
    assert doc["healthPort"] == 50071
    mounted = tmp_path / "router.json"
    layout = layout_for(Composition.parse("2xCP8"), 8)
    mounted.write_text(res.configmap(spec, OWNER, layout, 1)["data"]["router.json"])
    s = load_router_config(mounted).settings
    assert (s.tls_cert_file, s.health_listen) == (f"{res.ROUTER_TLS}/tls.crt", "0.0.0.0:50071")
    # The probe port is the pods' own: the Service exposes grpc, admin and metrics only.
    assert "health" not in {p["name"] for p in res.router_service(spec, OWNER)["spec"]["ports"]}


@pytest.mark.parametrize(
    ("router", "field", "text"),
    [
        ({"tls": {}}, "spec.router.tls.secretName", "Required"),
        ({"tls": {"secretName": "Bad_Name"}}, "spec.router.tls.secretName", "a Secret's name"),
        ({"tls": {"secretName": "c"}, "healthPort": 50060}, "spec.router.healthPort", "differ"),
    ],
)
def test_bad_router_tls_settings_are_refused_naming_the_field(router, field, text):
    from vertumnus.operator.crd import SpecError

    with pytest.raises(SpecError) as e:
        _spec(router=router)
    assert e.value.field == field and text in str(e.value)
