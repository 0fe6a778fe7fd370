"""The environment variables the operator reads, named once.

The chart sets them on the operator's Deployment; ``python -m vertumnus.operator
run`` takes each as its flag's default, and ``kopf run -m
vertumnus.operator.kopf_entry`` reads them alone. Imports nothing, so the CLI's
``--help`` names them without loading the operator.
"""

from __future__ import annotations

ADMIN_KEY_FILE = "VERTUMNUS_ADMIN_KEY_FILE"
"""The file of the operator's key; the chart mounts its Secret
``<release>-vertumnus-operator-admin-key`` there."""
ADMIN_CA_FILE = "VERTUMNUS_ADMIN_CA_FILE"
ADMIN_CA_KEY_FILE = "VERTUMNUS_ADMIN_CA_KEY_FILE"
"""The files of the CA's certificate and key (the same Secret's ``ca.crt``, ``ca.key``)."""
RECORD_LOOKS_EVERY = "VERTUMNUS_RECORD_LOOKS_EVERY"
POOL_NETWORK_POLICIES = "VERTUMNUS_POOL_NETWORK_POLICIES"
POD_NAMESPACE = "POD_NAMESPACE"
POD_NAME = "POD_NAME"
OPERATOR_POD_LABELS = "VERTUMNUS_OPERATOR_POD_LABELS"
ROUTER_METRICS_FROM = "VERTUMNUS_ROUTER_METRICS_FROM"
ROUTER_ADDRESSES = "VERTUMNUS_ROUTER_ADDRESSES"
"""Router addresses to dial instead of each pool's Service (outside the cluster)."""
ROUTER_IMAGE = "VERTUMNUS_ROUTER_IMAGE"
REDIS_IMAGE = "VERTUMNUS_REDIS_IMAGE"
PEERING = "VERTUMNUS_PEERING"
PEERING_LIFETIME = "VERTUMNUS_PEERING_LIFETIME"
