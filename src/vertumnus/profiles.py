"""Reading and writing profile files (a shell: this module does file I/O).

- A **prefill-time profile** (JSON) holds the coefficients of E_C(R, P);
  see :class:`vertumnus.core.costmodel.PrefillModel`. Bundled ones live in
  ``vertumnus/data/profiles/`` and are named like ``qwen3-30b-a3b/h200``.
- A **capacity profile** (JSON, ``<profile>.capacity.json`` beside it) holds
  κ_C per degree for the composition planner
  (:class:`vertumnus.core.planner.CapacityProfile`), measured by
  ``python -m vertumnus.sim.capacity``.
- A **measurement profile** (CSV) is what ``vertumnus profile`` writes and
  ``vertumnus fit`` reads: a header ``degree,uncached_tokens,cached_tokens,seconds``
  and one queue-free measurement per row.
"""

from __future__ import annotations

import csv
import json
from importlib import resources
from pathlib import Path
from typing import Any

from vertumnus.core.costmodel import PrefillModel
from vertumnus.core.fit import ProfileRow
from vertumnus.core.planner import CapacityProfile

DEFAULT_PROFILE = "qwen3-30b-a3b/h200"
PROFILE_COLUMNS = ("degree", "uncached_tokens", "cached_tokens", "seconds")


class ProfileError(ValueError):
    """A profile file is missing or malformed; the message names the file (and line)."""


def bundled_profiles() -> list[str]:
    folder = resources.files("vertumnus.data") / "profiles"
    return sorted(
        p.name[: -len(".json")].replace("_", "/")
        for p in folder.iterdir()
        if p.name.endswith(".json") and not p.name.endswith(".capacity.json")
    )


def load_model(name_or_path: str = DEFAULT_PROFILE) -> PrefillModel:
    """A bundled profile by name (``qwen3-30b-a3b/h200``) or a JSON file by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        try:
            text = path.read_text()
        except OSError as e:
            raise ProfileError(f"{path}: cannot read profile ({e.strerror})") from None
        source = str(path)
    else:
        res = (
            resources.files("vertumnus.data")
            / "profiles"
            / (name_or_path.replace("/", "_") + ".json")
        )
        if not res.is_file():
            raise ProfileError(
                f"unknown profile {name_or_path!r}; bundled: {', '.join(bundled_profiles())} "
                "(or give a path to a .json profile)"
            )
        text = res.read_text()
        source = name_or_path
    try:
        return PrefillModel.from_dict(json.loads(text))
    except json.JSONDecodeError as e:
        raise ProfileError(f"{source}:{e.lineno}: not valid JSON ({e.msg})") from None
    except ValueError as e:
        raise ProfileError(f"{source}: {e}") from None


def capacity_file(profile_name: str) -> Any:
    """Where the bundled capacity profile of ``profile_name`` lives (a resource path)."""
    return (
        resources.files("vertumnus.data")
        / "profiles"
        / (profile_name.replace("/", "_") + ".capacity.json")
    )


def load_capacity(name_or_path: str) -> CapacityProfile:
    """κ per degree: the bundled capacity profile of a prefill-time profile name
    (``qwen3-30b-a3b/h200``), or a ``.capacity.json`` file by path."""
    path = Path(name_or_path)
    if path.suffix == ".json" and path.exists():
        try:
            text = path.read_text()
        except OSError as e:
            raise ProfileError(f"{path}: cannot read capacity profile ({e.strerror})") from None
    else:
        res = capacity_file(name_or_path)
        if not res.is_file():
            raise ProfileError(
                f"no capacity profile for {name_or_path!r}; measure one with "
                "`python -m vertumnus.sim.capacity --trace TRACE.jsonl`"
            )
        text = res.read_text()
    try:
        return capacity_from_dict(json.loads(text))
    except json.JSONDecodeError as e:
        raise ProfileError(f"{name_or_path}:{e.lineno}: not valid JSON ({e.msg})") from None
    except ValueError as e:
        raise ProfileError(f"{name_or_path}: {e}") from None


def capacity_from_dict(data: dict[str, Any]) -> CapacityProfile:
    try:
        kappa = {int(k): float(v) for k, v in data["kappa_per_s"].items()}
        levels = {
            int(k): tuple((float(p["demand_per_s"]), float(p["attainment"])) for p in v)
            for k, v in (data.get("levels") or {}).items()
        }
        return CapacityProfile(kappa, float(data.get("target_attainment", 0.9)), levels)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise ValueError(f"malformed capacity profile ({e})") from None


def save_model(model: PrefillModel, path: str | Path) -> None:
    Path(path).write_text(json.dumps(model.to_dict(), indent=2) + "\n")


def read_profile_csv(path: str | Path) -> list[ProfileRow]:
    """Rows of a measurement profile; ProfileError names the file and line of a bad row."""
    path = Path(path)
    try:
        handle = path.open(newline="")
    except OSError as e:
        raise ProfileError(f"{path}: cannot read profile ({e.strerror})") from None
    rows: list[ProfileRow] = []
    with handle:
        reader = csv.reader(handle)
        header = next(reader, None)
        if header is None or tuple(h.strip() for h in header) != PROFILE_COLUMNS:
            raise ProfileError(
                f"{path}:1: expected header {','.join(PROFILE_COLUMNS)}, got {header}"
            )
        for lineno, rec in enumerate(reader, start=2):
            if not rec or all(not f.strip() for f in rec):
                continue
            if len(rec) != 4:
                raise ProfileError(f"{path}:{lineno}: expected 4 fields, got {len(rec)}")
            try:
                row = ProfileRow(int(rec[0]), int(rec[1]), int(rec[2]), float(rec[3]))
            except ValueError:
                raise ProfileError(f"{path}:{lineno}: not numbers: {','.join(rec)}") from None
            if row.degree < 1 or row.uncached < 1 or row.cached < 0 or not row.seconds > 0:
                raise ProfileError(
                    f"{path}:{lineno}: need degree >= 1, uncached_tokens >= 1, cached_tokens >= 0, seconds > 0"
                )
            rows.append(row)
    if not rows:
        raise ProfileError(f"{path}: no measurements")
    return rows


def write_profile_csv(rows: list[ProfileRow], path: str | Path) -> None:
    with Path(path).open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(PROFILE_COLUMNS)
        for r in rows:
            w.writerow([r.degree, r.uncached, r.cached, f"{r.seconds:.9g}"])
