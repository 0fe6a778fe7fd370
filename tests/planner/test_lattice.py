"""The lattice of topology-compatible compositions and buddy layouts."""

from __future__ import annotations

import pytest

from vertumnus.core.planner import (
    Slot,
    domain_partitions,
    enumerate_lattice,
    layout_for,
    neighbours,
)
from vertumnus.core.types import Composition


def comps(*texts: str) -> set[Composition]:
    return {Composition.parse(t) for t in texts}


def test_8_gpus_all_profile_degrees_is_the_binary_partitions_of_8() -> None:
    got = set(enumerate_lattice(8, (1, 2, 4, 8)))
    assert got == comps(
        "CP8",
        "2xCP4",
        "CP4+2xCP2",
        "CP4+CP2+2xCP1",
        "CP4+4xCP1",
        "4xCP2",
        "3xCP2+2xCP1",
        "2xCP2+4xCP1",
        "CP2+6xCP1",
        "8xCP1",
    )


def test_8_and_16_gpus_cp4_cp8() -> None:
    assert enumerate_lattice(8, (4, 8)) == [Composition.parse("CP8"), Composition.parse("2xCP4")]
    assert enumerate_lattice(16, (4, 8)) == [
        Composition.parse("2xCP8"),
        Composition.parse("CP8+2xCP4"),
        Composition.parse("4xCP4"),
    ]


def test_16_gpus_cp2_cp4_cp8() -> None:
    # Per domain: CP8 | 2xCP4 | CP4+2xCP2 | 4xCP2. Ten pairs, nine pools:
    # 2xCP4 + 4xCP2 and (CP4+2xCP2) twice are the same multiset.
    assert set(enumerate_lattice(16, (2, 4, 8))) == comps(
        "2xCP8",
        "CP8+2xCP4",
        "CP8+CP4+2xCP2",
        "CP8+4xCP2",
        "4xCP4",
        "3xCP4+2xCP2",
        "2xCP4+4xCP2",
        "CP4+6xCP2",
        "8xCP2",
    )


def test_40_gpus_cp4_cp8_in_large_first_order() -> None:
    assert [str(c) for c in enumerate_lattice(40, (4, 8))] == [
        "5xCP8",
        "2xCP4+4xCP8",
        "4xCP4+3xCP8",
        "6xCP4+2xCP8",
        "8xCP4+1xCP8",
        "10xCP4",
    ]


def test_every_lattice_member_keeps_the_gpu_count() -> None:
    for gpus in (8, 16, 40):
        for c in enumerate_lattice(gpus, (1, 2, 4, 8)):
            assert c.gpus == gpus


def test_gpus_must_fill_whole_domains() -> None:
    with pytest.raises(ValueError, match="whole number"):
        enumerate_lattice(12, (4, 8))


def test_domain_partitions_respects_allowed_degrees() -> None:
    assert domain_partitions(8, (8,)) == [(8,)]
    assert domain_partitions(8, (2, 8)) == [(2, 2, 2, 2), (8,)]
    assert domain_partitions(8, (4,)) == [(4, 4)]


def test_layout_packs_buddy_aligned_with_ids_in_ascending_degree_order() -> None:
    layout = layout_for(Composition.parse("4xCP4+3xCP8"))
    assert layout.slots == (
        Slot(4, 8, 0, 0),
        Slot(5, 8, 1, 0),
        Slot(6, 8, 2, 0),
        Slot(0, 4, 3, 0),
        Slot(1, 4, 3, 4),
        Slot(2, 4, 4, 0),
        Slot(3, 4, 4, 4),
    )
    assert layout.composition == Composition.parse("4xCP4+3xCP8")


def test_layout_rejects_degrees_that_do_not_fit_a_domain() -> None:
    with pytest.raises(ValueError, match="power of two"):
        layout_for(Composition.parse("CP16"))
    with pytest.raises(ValueError, match="power of two"):
        layout_for(Composition.parse("CP3+CP5"))


def test_neighbours_are_one_split_or_merge_away() -> None:
    got = neighbours(Composition.parse("4xCP4+3xCP8"), (4, 8))
    assert got == [Composition.parse("2xCP4+4xCP8"), Composition.parse("6xCP4+2xCP8")]
    assert neighbours(Composition.parse("5xCP8"), (4, 8)) == [Composition.parse("2xCP4+4xCP8")]
    assert neighbours(Composition.parse("10xCP4"), (4, 8)) == [Composition.parse("8xCP4+1xCP8")]


def test_planner_imports_nothing_but_math_dataclasses_and_the_core() -> None:
    import ast
    from pathlib import Path

    import vertumnus.core.planner as mod

    tree = ast.parse(Path(mod.__file__).read_text())
    top = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            top.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            top.add(node.module)
    allowed = {"__future__", "math", "dataclasses", "collections", "collections.abc"}
    assert {m for m in top if not m.startswith("vertumnus.core")} <= allowed, top
