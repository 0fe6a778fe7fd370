"""For ``kopf run -m vertumnus.operator.kopf_entry``: the handlers in kopf's default registry.

``kopf run`` only reads kopf's global registry, so importing this module registers the
operator's handlers there (the one place the operator touches module state). Prefer
``python -m vertumnus.operator run``, which keeps its own registry and sets up peering.
"""

from __future__ import annotations

import kopf

from vertumnus.operator.handlers import register

register(kopf.get_default_registry())
