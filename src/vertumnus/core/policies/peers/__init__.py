"""Peer routers re-implemented as placement policies, one module each.

Each module re-implements the routing rule of a system users would deploy
instead of Vertumnus, from its public source (cited in the module's
docstring), and keeps only the state that system keeps in reality. None of
them reads a worker's degree: they route over the same workers as
Vertumnus, blind to CP degrees. See ``README.md`` in this folder.
"""

from vertumnus.core.policies.peers.aibrix import AIBrixConductor
from vertumnus.core.policies.peers.dynamo import DynamoKV
from vertumnus.core.policies.peers.least_requests import LeastRequests
from vertumnus.core.policies.peers.llmd import LLMD
from vertumnus.core.policies.peers.preble import Preble
from vertumnus.core.policies.peers.sglang import SGLangCacheAware
from vertumnus.core.policies.peers.vllm_kvaware import VLLMKvaware

__all__ = [
    "AIBrixConductor",
    "DynamoKV",
    "LLMD",
    "LeastRequests",
    "Preble",
    "SGLangCacheAware",
    "VLLMKvaware",
]
