"""The placement flags shared by ``vertumnus simulate`` and ``vertumnus router``."""

from __future__ import annotations

import argparse

import pytest

from vertumnus.core.placement import PlacementParams
from vertumnus.flags import add_placement_flags, placement_from


def _parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    add_placement_flags(p)
    return p.parse_args(argv)


def test_only_the_flags_given_change_the_base():
    base = PlacementParams(beta=1.5, beta_busy=7.5, lam=0.25)
    assert placement_from(_parse(), base) is base
    assert placement_from(_parse("--beta-busy", "9"), base) == PlacementParams(
        beta=1.5, beta_busy=9.0, lam=0.25
    )
    assert placement_from(_parse("--beta", "2", "--lambda", "0"), base) == PlacementParams(
        beta=2.0, beta_busy=7.5, lam=0.0
    )


def test_a_bad_value_names_the_field():
    with pytest.raises(ValueError, match="beta must be >= 1, got 0.5"):
        placement_from(_parse("--beta", "0.5"), PlacementParams())


def test_simulate_and_the_router_take_the_same_flags():
    from vertumnus.cli import build_parser

    top = build_parser()
    subs = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    for command in ("simulate", "router"):
        options = {o for a in subs.choices[command]._actions for o in a.option_strings}
        assert {"--beta", "--beta-busy", "--lambda"} <= options, command
