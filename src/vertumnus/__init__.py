"""Vertumnus: the prefill pool of a prefill/decode-disaggregated LLM service.

Where things live:

- ``vertumnus.core`` — the pure policy core (cost model, placement, prefix
  trie, worker caches, metrics). No I/O, no clocks, no module state.
- ``vertumnus.sim`` — the trace-driven discrete-event simulator, a shell that
  runs the core against recorded or synthetic traffic.
- ``vertumnus.worker`` (built from the top-level ``worker/`` folder) — the CP
  prefill engine and its gRPC service.
- ``vertumnus.cli`` — the ``vertumnus`` command.
"""

__version__ = "0.1.0"
