"""Each pool's NetworkPolicies (``vertumnus.operator.networkpolicy``): who gets in where.

The API server's own checks of these objects, and the operator applying them for a pool
in a namespace of a test's own, are in the e2e (``test_every_pool_gets_network_policies_of_its_own``).
"""

from __future__ import annotations

import pytest

from vertumnus.operator import networkpolicy as netpol
from vertumnus.operator import resources as res
from vertumnus.operator.crd import SpecError, parse_spec

OWNER = res.Owner("p", "team-a", "uid-1")
PEERS = netpol.Peers("vertumnus-system", {"app.kubernetes.io/name": "vertumnus"})


def _by_name(spec: dict, peers: netpol.Peers = PEERS) -> dict[str, dict]:
    return {p["metadata"]["name"]: p for p in netpol.pool_policies(parse_spec(spec), OWNER, peers)}


def _sglang(**transfer: object) -> dict:
    return {
        "gpus": 8,
        "engine": {"image": "img", "kind": "sglang", "transfer": transfer},
        "model": {"path": "/models/m"},
    }


def test_a_torch_pool_takes_clients_on_grpc_and_the_operator_on_admin():
    found = _by_name({"gpus": 8, "engine": {"image": "img"}, "redis": {"mode": "managed"}})
    assert set(found) == {"p-routers", "p-redis", "p-engines"}
    for policy in found.values():
        assert policy["metadata"]["namespace"] == "team-a"
        assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
        assert policy["spec"]["policyTypes"] == ["Ingress"]
    routers = found["p-routers"]["spec"]
    assert routers["podSelector"]["matchLabels"] == res.router_labels(OWNER)
    grpc, metrics, admin = routers["ingress"]
    assert grpc == {"ports": [{"protocol": "TCP", "port": "grpc"}]}  # any client
    assert metrics == {"ports": [{"protocol": "TCP", "port": "metrics"}]}  # any scraper
    assert admin["ports"] == [{"protocol": "TCP", "port": "admin"}]
    assert admin["from"] == [
        {
            "namespaceSelector": {
                "matchLabels": {"kubernetes.io/metadata.name": "vertumnus-system"}
            },
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "vertumnus"}},
        }
    ]
    # This pool's routers only: another pool's routers in the namespace get nothing.
    (redis,) = found["p-redis"]["spec"]["ingress"]
    assert redis == {
        "from": [{"podSelector": {"matchLabels": res.router_labels(OWNER)}}],
        "ports": [{"protocol": "TCP", "port": 6379}],
    }
    (engines,) = found["p-engines"]["spec"]["ingress"]
    assert engines == {
        "from": [
            {"podSelector": {"matchLabels": res.router_labels(OWNER)}},
            {"podSelector": {"matchLabels": res.engine_labels(OWNER)}},
        ]
    }


def test_no_managed_redis_no_redis_policy_and_metrics_scrapers_can_be_named():
    scrapers = ({"namespaceSelector": {"matchLabels": {"name": "monitoring"}}},)
    found = _by_name(
        {"gpus": 8, "engine": {"image": "img"}, "redis": {"mode": "none"}},
        netpol.Peers("ops", {"a": "b"}, scrapers),
    )
    assert set(found) == {"p-routers", "p-engines"}
    metrics = found["p-routers"]["spec"]["ingress"][1]
    assert metrics["from"] == list(scrapers)


def test_an_sglang_pools_engines_take_its_decode_servers():
    decode = [{"namespaceSelector": {"matchLabels": {"team": "decode"}}}]
    engines = _by_name(_sglang(**{"from": decode}))["p-engines"]["spec"]["ingress"]
    assert len(engines) == 2 and engines[1] == {"from": decode}
    # Unset: from anywhere (the decode pool must reach the bootstrap and transfer ports).
    engines = _by_name(_sglang())["p-engines"]["spec"]["ingress"]
    assert engines[1] == {}
    # []: no decode servers, and never an empty "from", which Kubernetes reads as everyone.
    engines = _by_name(_sglang(**{"from": []}))["p-engines"]["spec"]["ingress"]
    assert len(engines) == 1 and engines[0]["from"]


@pytest.mark.parametrize(
    ("transfer", "field", "text"),
    [
        ({"from": {"podSelector": {}}}, "spec.engine.transfer.from", "expected a list"),
        ({"from": [{}]}, "spec.engine.transfer.from[0]", "NetworkPolicyPeer"),
        ({"from": [{"pods": {}}]}, "spec.engine.transfer.from[0]", "NetworkPolicyPeer"),
        ({"from": [{"podSelector": "x"}]}, "spec.engine.transfer.from[0].podSelector", "object"),
    ],
)
def test_bad_decode_peers_are_refused_naming_the_field(transfer, field, text):
    with pytest.raises(SpecError) as e:
        parse_spec(_sglang(**transfer))
    assert e.value.field == field and text in str(e.value)


def test_decode_peers_are_for_sglang_pools():
    with pytest.raises(SpecError, match="SGLang engines only"):
        parse_spec({"gpus": 8, "engine": {"image": "img", "transfer": {"from": []}}})


def test_the_operator_needs_its_namespace_and_labels_to_make_policies():
    assert netpol.peers_from(False, "", "") is None
    peers = netpol.peers_from(True, "ops", "a=b, c=d")
    assert peers == netpol.Peers("ops", {"a": "b", "c": "d"})
    with pytest.raises(ValueError, match="namespace"):
        netpol.peers_from(True, "", "a=b")
    for bad in ("", "a", "a=", "=b", "a=b,c"):
        with pytest.raises(ValueError, match="--operator-pod-labels"):
            netpol.peers_from(True, "ops", bad)
    scrapers = netpol.peers_from(True, "ops", "a=b", '[{"podSelector": {}}]')
    assert scrapers is not None and scrapers.metrics_from == ({"podSelector": {}},)
    for bad in ("{", "{}", "[{}]", '["x"]'):
        with pytest.raises(ValueError, match="--router-metrics-from"):
            netpol.peers_from(True, "ops", "a=b", bad)
