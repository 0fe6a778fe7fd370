"""Command-line flags that more than one Vertumnus command takes, defined once.

``vertumnus simulate`` and ``vertumnus router`` both let a user override the
placement cost's β, β_busy and λ (design.md section 3); the flags, their help
and how they apply over a base :class:`~vertumnus.core.placement.PlacementParams`
are here so that the two commands cannot drift apart.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the CLI builds its parsers without importing the core
    from vertumnus.core.placement import PlacementParams

__all__ = ["add_placement_flags", "placement_from"]


def add_placement_flags(p: argparse.ArgumentParser) -> None:
    """``--beta``, ``--beta-busy`` and ``--lambda`` (each None when not given)."""
    p.add_argument(
        "--beta", type=float, default=None, help="placement beta when no worker has a queue (>= 1)"
    )
    p.add_argument(
        "--beta-busy",
        type=float,
        default=None,
        help="placement beta when every worker has a queue (>= beta; = beta for a fixed beta)",
    )
    p.add_argument("--lambda", dest="lam", type=float, default=None, help="placement lambda (>= 0)")


def placement_from(args: argparse.Namespace, base: PlacementParams) -> PlacementParams:
    """``base`` with the placement flags given in ``args``; a ValueError names a bad value."""
    given = {
        name: value
        for name, value in (("beta", args.beta), ("beta_busy", args.beta_busy), ("lam", args.lam))
        if value is not None
    }
    return replace(base, **given) if given else base
