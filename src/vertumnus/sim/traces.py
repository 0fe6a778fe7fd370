"""Workload traces: what the simulator replays.

A :class:`Trace` is an immutable, arrival-ordered tuple of
:class:`~vertumnus.core.types.Request` objects plus the block size their
prefix keys were cut at. Everything that produces traffic for the simulator
ends up as one:

- :func:`load_mooncake` reads the Mooncake FAST'25 JSON Lines format
  (``timestamp`` in ms, ``input_length``, ``output_length``, ``hash_ids`` of
  512-token blocks). Its ``hash_ids`` are per-block content ids; we chain them
  with :func:`~vertumnus.core.keys.chain_block_hashes` so that a key names a
  whole prefix, exactly like an engine's block hash.
- :func:`load_azure` reads the Azure LLM inference trace 2023 CSV. That trace
  has no prefix information, so every request gets block keys of its own and
  no prefix can ever be reused: use it for arrival and length patterns only.
- :mod:`vertumnus.sim.synthetic` generates the built-in default workload.
- :func:`load_trace` turns a ``--trace`` argument into one of the above.

Loaders validate every field and fail with a :class:`TraceError` naming the
file, the 1-based line number and the problem, because a simulator that
silently skips a bad line produces numbers nobody can trust.

Ordering rule: files must already be sorted by time (both public traces are).
A timestamp smaller than the previous one is reported as an error rather than
silently re-sorted: it almost always means two files were concatenated or a
column was mangled, and re-sorting would hide that.
"""

from __future__ import annotations

import csv
import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, fields, replace
from datetime import datetime
from pathlib import Path
from typing import TextIO

from vertumnus.core.keys import chain_many
from vertumnus.core.types import Request

__all__ = [
    "MOONCAKE_BLOCK_SIZE",
    "Trace",
    "TraceError",
    "load_azure",
    "load_mooncake",
    "load_trace",
    "scale_lengths",
    "scale_rate",
]

#: Block size of the public Mooncake traces' ``hash_ids`` (tokens per block).
MOONCAKE_BLOCK_SIZE = 512


class TraceError(ValueError):
    """A trace that cannot be read: names the file, the line and the problem.

    ``str(err)`` reads like a compiler diagnostic,
    ``trace.jsonl:17: "input_length" must be a positive integer, got -3``,
    so the CLI can print it as is. ``path`` and ``line`` are kept as
    attributes for callers that want them separately.
    """

    def __init__(self, problem: str, path: str | Path | None = None, line: int | None = None):
        self.problem = problem
        self.path = None if path is None else str(path)
        self.line = line
        if self.path is not None and line is not None:
            message = f"{self.path}:{line}: {problem}"
        elif self.path is not None:
            message = f"{self.path}: {problem}"
        else:
            message = problem
        super().__init__(message)


@dataclass(frozen=True)
class Trace:
    """An arrival-ordered workload.

    Invariants (checked on construction): requests are sorted by
    ``arrival_s`` and their ids are ``0..n-1`` in that order, so a request's
    id is also its index. Build one from unordered requests with
    :meth:`from_requests`, which sorts (stably) and renumbers.
    """

    name: str
    requests: tuple[Request, ...]
    block_size: int

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ValueError(f"trace {self.name!r}: block_size must be >= 1, got {self.block_size}")
        prev = -math.inf
        for i, r in enumerate(self.requests):
            if r.id != i:
                raise ValueError(
                    f"trace {self.name!r}: request at index {i} has id {r.id}; "
                    "ids must be 0..n-1 in arrival order (use Trace.from_requests)"
                )
            if r.arrival_s < prev:
                raise ValueError(
                    f"trace {self.name!r}: request {i} arrives at {r.arrival_s} s, before "
                    f"request {i - 1} at {prev} s (use Trace.from_requests to sort)"
                )
            prev = r.arrival_s

    @classmethod
    def from_requests(cls, name: str, requests: Iterable[Request], block_size: int) -> Trace:
        """Sort ``requests`` stably by arrival and renumber their ids 0..n-1."""
        ordered = sorted(requests, key=lambda r: r.arrival_s)
        renumbered = tuple(r if r.id == i else replace(r, id=i) for i, r in enumerate(ordered))
        return cls(name=name, requests=renumbered, block_size=block_size)

    def with_requests(self, requests: Iterable[Request], name: str | None = None) -> Trace:
        """A trace with the same block size (and name unless given) over ``requests``.

        The requests are sorted by arrival and renumbered, so callers can pass
        them in any order and with any ids.
        """
        return Trace.from_requests(self.name if name is None else name, requests, self.block_size)

    def __len__(self) -> int:
        return len(self.requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self.requests)

    @property
    def start_s(self) -> float:
        """Arrival time of the first request (0 for an empty trace)."""
        return self.requests[0].arrival_s if self.requests else 0.0

    @property
    def duration_s(self) -> float:
        """Time from the first to the last arrival (0 for fewer than two requests)."""
        if not self.requests:
            return 0.0
        return self.requests[-1].arrival_s - self.requests[0].arrival_s

    @property
    def period_s(self) -> float:
        """The trace's span plus its mean gap: the period it repeats with when cycled,
        so the gap across the wrap looks like any other (needs two requests or more)."""
        n = len(self.requests)
        return self.duration_s * n / (n - 1)

    @property
    def total_tokens(self) -> int:
        """Sum of input lengths."""
        return sum(r.length for r in self.requests)

    @property
    def mean_rate(self) -> float:
        """Requests per second over :attr:`duration_s` (0 if the trace spans no time)."""
        d = self.duration_s
        return len(self.requests) / d if d > 0 else 0.0


# --------------------------------------------------------------------------
# Mooncake JSON Lines.
# --------------------------------------------------------------------------


def _describe(value: object) -> str:
    text = json.dumps(value) if isinstance(value, str | int | float | bool | None) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _int_field(
    obj: dict[str, object], key: str, minimum: int, path: Path, lineno: int, required: bool = True
) -> int:
    """Read an integer field >= ``minimum``; bools and floats are rejected on purpose."""
    if key not in obj:
        if required:
            raise TraceError(f'"{key}" is missing', path, lineno)
        return 0
    v = obj[key]
    if type(v) is not int or v < minimum:
        what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
        raise TraceError(f'"{key}" must be {what}, got {_describe(v)}', path, lineno)
    return v


def _open_text(path: Path, encoding: str = "utf-8", newline: str | None = None) -> TextIO:
    """Open ``path`` for reading, turning OS errors into TraceErrors that name it."""
    try:
        return open(path, encoding=encoding, newline=newline)  # noqa: SIM115
    except FileNotFoundError:
        raise TraceError("no such file", path) from None
    except IsADirectoryError:
        raise TraceError("is a directory, not a trace file", path) from None
    except OSError as e:
        raise TraceError(f"cannot open: {e.strerror}", path) from None


def load_mooncake(path: str | Path, block_size: int = MOONCAKE_BLOCK_SIZE) -> Trace:
    """Load a Mooncake JSON Lines trace.

    One object per line: ``timestamp`` (int ms, >= 0, non-decreasing),
    ``input_length`` (int > 0), ``hash_ids`` (list of ints >= 0, exactly
    ``ceil(input_length / block_size)`` of them) and ``output_length``
    (int >= 0; optional, 0 when absent, because only prefill is simulated).
    Unknown keys are ignored; blank lines are skipped. Arrivals are the
    timestamps in seconds, unchanged (the file's times are already relative).

    Raises :class:`TraceError` naming the file and line on the first problem.
    """
    p = Path(path)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    arrivals: list[float] = []
    lengths: list[int] = []
    outputs: list[int] = []
    hash_lists: list[list[int]] = []
    prev_ts = -1
    prev_line = 0
    lineno = 0
    f = _open_text(p)
    with f as fh:
        try:
            for lineno, raw in enumerate(fh, 1):
                if not raw.strip():
                    continue
                try:
                    obj = json.loads(raw)
                except json.JSONDecodeError as e:
                    raise TraceError(
                        f"not valid JSON ({e.msg} at column {e.colno})", p, lineno
                    ) from None
                if not isinstance(obj, dict):
                    raise TraceError(f"expected a JSON object, got {type(obj).__name__}", p, lineno)
                ts = _int_field(obj, "timestamp", 0, p, lineno)
                length = _int_field(obj, "input_length", 1, p, lineno)
                out = _int_field(obj, "output_length", 0, p, lineno, required=False)
                if "hash_ids" not in obj:
                    raise TraceError('"hash_ids" is missing', p, lineno)
                ids = obj["hash_ids"]
                if not isinstance(ids, list):
                    raise TraceError(
                        f'"hash_ids" must be a list of integers, got {_describe(ids)}', p, lineno
                    )
                for j, h in enumerate(ids):
                    if type(h) is not int or h < 0:
                        raise TraceError(
                            f'"hash_ids"[{j}] must be an integer >= 0, got {_describe(h)}',
                            p,
                            lineno,
                        )
                expected = -(-length // block_size)
                if len(ids) != expected:
                    raise TraceError(
                        f'"hash_ids" has {len(ids)} entries but "input_length" {length} needs '
                        f"ceil({length}/{block_size}) = {expected}",
                        p,
                        lineno,
                    )
                if ts < prev_ts:
                    raise TraceError(
                        f'"timestamp" {ts} is earlier than {prev_ts} on line {prev_line}; '
                        "the trace must be sorted by time",
                        p,
                        lineno,
                    )
                prev_ts, prev_line = ts, lineno
                arrivals.append(ts / 1000.0)
                lengths.append(length)
                outputs.append(out)
                hash_lists.append(ids)
        except UnicodeDecodeError:
            raise TraceError("not valid UTF-8 text", p, lineno + 1) from None
    if not arrivals:
        raise TraceError("no requests in the file", p)
    keys = chain_many(hash_lists)
    requests = tuple(
        Request(i, a, ln, k, o)
        for i, (a, ln, k, o) in enumerate(zip(arrivals, lengths, keys, outputs, strict=True))
    )
    return Trace(name=p.name, requests=requests, block_size=block_size)


# --------------------------------------------------------------------------
# Azure LLM inference trace (CSV).
# --------------------------------------------------------------------------

_AZURE_HEADER = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_AZURE_TS = re.compile(
    r"^\s*(\d{4})-(\d{1,2})-(\d{1,2})[ T](\d{1,2}):(\d{2}):(\d{2})(?:\.(\d{1,9}))?\s*$"
)
_INT = re.compile(r"^\s*[+]?\d+\s*$")


def _parse_azure_timestamp(text: str) -> int:
    """``2023-11-16 18:17:03.9799600`` -> integer nanoseconds since 0001-01-01.

    Integer nanoseconds rather than ``datetime`` (microseconds) or float
    seconds: the file has 7 fractional digits, and we want differences exact.
    Raises ValueError on anything else.
    """
    m = _AZURE_TS.match(text)
    if not m:
        raise ValueError("expected YYYY-MM-DD HH:MM:SS[.fffffff]")
    y, mo, d, hh, mi, ss = (int(g) for g in m.groups()[:6])
    day = datetime(y, mo, d, hh, mi, ss)  # validates ranges (month 13, hour 25, ...)
    frac = m.group(7) or ""
    seconds = day.toordinal() * 86400 + hh * 3600 + mi * 60 + ss
    return seconds * 1_000_000_000 + int(frac.ljust(9, "0") or "0")


def load_azure(path: str | Path, block_size: int = MOONCAKE_BLOCK_SIZE) -> Trace:
    """Load an Azure LLM inference trace (2023) CSV.

    Header ``TIMESTAMP,ContextTokens,GeneratedTokens``; timestamps absolute
    (``2023-11-16 18:17:03.9799600``, 0-9 fractional digits accepted),
    non-decreasing; arrivals are seconds after the first row's timestamp.
    ``ContextTokens`` must be > 0, ``GeneratedTokens`` >= 0.

    The trace carries no prefix information, so each request gets
    ``ceil(length / block_size)`` block keys that no other request shares:
    the hit rate on this trace is zero by construction, not by measurement.
    """
    p = Path(path)
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    stamps: list[int] = []
    lengths: list[int] = []
    outputs: list[int] = []
    # utf-8-sig: tolerate a byte-order mark written by spreadsheet tools.
    f = _open_text(p, encoding="utf-8-sig", newline="")
    with f as fh:
        reader = csv.reader(fh)
        try:
            header = next(reader, None)
            if header is None:
                raise TraceError("empty file; expected the header " + ",".join(_AZURE_HEADER), p, 1)
            if tuple(c.strip() for c in header) != _AZURE_HEADER:
                raise TraceError(
                    f"bad header {','.join(header)!r}; expected {','.join(_AZURE_HEADER)}",
                    p,
                    reader.line_num,
                )
            prev_ns, prev_line = -1, 0
            for row in reader:
                lineno = reader.line_num
                if not row or all(not c.strip() for c in row):
                    continue
                if len(row) != 3:
                    raise TraceError(f"expected 3 columns, got {len(row)}", p, lineno)
                try:
                    ns = _parse_azure_timestamp(row[0])
                except ValueError as e:
                    raise TraceError(f"bad TIMESTAMP {row[0]!r}: {e}", p, lineno) from None
                for col, value, minimum in ((1, row[1], 1), (2, row[2], 0)):
                    if not _INT.match(value) or int(value) < minimum:
                        what = "a positive integer" if minimum == 1 else "an integer >= 0"
                        raise TraceError(
                            f"{_AZURE_HEADER[col]} must be {what}, got {value!r}", p, lineno
                        )
                if ns < prev_ns:
                    raise TraceError(
                        f"TIMESTAMP {row[0].strip()} is earlier than the one on line "
                        f"{prev_line}; the trace must be sorted by time",
                        p,
                        lineno,
                    )
                prev_ns, prev_line = ns, lineno
                stamps.append(ns)
                lengths.append(int(row[1]))
                outputs.append(int(row[2]))
        except csv.Error as e:
            raise TraceError(f"malformed CSV: {e}", p, reader.line_num) from None
        except UnicodeDecodeError:
            raise TraceError("not valid UTF-8 text", p, reader.line_num + 1) from None
    if not stamps:
        raise TraceError("no requests in the file", p)
    # Fresh, never-repeated per-block ids: no two requests share a block.
    hash_lists: list[range] = []
    next_id = 0
    for ln in lengths:
        nb = -(-ln // block_size)
        hash_lists.append(range(next_id, next_id + nb))
        next_id += nb
    keys = chain_many(hash_lists)
    t0 = stamps[0]
    requests = tuple(
        Request(i, (s - t0) / 1e9, ln, k, o)
        for i, (s, ln, k, o) in enumerate(zip(stamps, lengths, keys, outputs, strict=True))
    )
    return Trace(name=p.name, requests=requests, block_size=block_size)


# --------------------------------------------------------------------------
# --trace argument and rate scaling.
# --------------------------------------------------------------------------

_ACCEPTED_FORMS = (
    "'synthetic', 'synthetic:KEY=VALUE,...', a Mooncake '.jsonl' file or an Azure '.csv' file"
)


def _parse_synthetic_options(spec: str, text: str) -> dict[str, object]:
    """``duration_s=120,mean_rate=2`` -> kwargs for SyntheticConfig, typed by its fields.

    ``preset=NAME`` starts from ``PRESETS[NAME]``; explicit keys override it.
    """
    from vertumnus.sim.synthetic import PRESETS, SyntheticConfig

    types = {f.name: f.type for f in fields(SyntheticConfig)}
    out: dict[str, object] = {}
    base: dict[str, object] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        key, sep, value = part.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise TraceError(f"bad synthetic option {part.strip()!r}: expected KEY=VALUE", spec)
        if key == "preset":
            if value not in PRESETS:
                known = ", ".join(sorted(PRESETS))
                raise TraceError(f"unknown synthetic preset {value!r}; known: {known}", spec)
            base = dict(PRESETS[value])
            continue
        if key not in types:
            raise TraceError(
                f"unknown synthetic option {key!r}; known: {', '.join(sorted(types))}", spec
            )
        is_int = str(types[key]) == "int"  # annotations are strings (postponed evaluation)
        try:
            out[key] = int(value) if is_int else float(value)
        except ValueError:
            what = "an integer" if is_int else "a number"
            raise TraceError(f"synthetic option {key}={value!r}: expected {what}", spec) from None
    return {**base, **out}


def load_trace(spec: str, *, seed: int = 0, block_size: int | None = None) -> Trace:
    """Turn a ``--trace`` argument into a Trace.

    - ``synthetic`` or ``synthetic:KEY=VALUE,...`` (fields of
      :class:`~vertumnus.sim.synthetic.SyntheticConfig`, e.g.
      ``synthetic:duration_s=120,mean_rate=2``; ``preset=NAME`` starts from
      :data:`~vertumnus.sim.synthetic.PRESETS`, e.g.
      ``synthetic:preset=toolagent``): the built-in generator with
      ``seed``; ``block_size`` overrides the config's.
    - ``*.jsonl``: :func:`load_mooncake`; ``*.csv``: :func:`load_azure`
      (``block_size`` defaults to 512, the Mooncake block size).

    ``seed`` only affects the synthetic generator. Anything else raises
    :class:`TraceError` naming the argument and the accepted forms.
    """
    text = spec.strip()
    head, sep, opts = text.partition(":")
    if head == "synthetic":
        from vertumnus.sim.synthetic import SyntheticConfig, generate

        kwargs = _parse_synthetic_options(spec, opts) if sep else {}
        if block_size is not None:
            kwargs["block_size"] = block_size
        try:
            config = SyntheticConfig(**kwargs)  # type: ignore[arg-type]
        except ValueError as e:
            raise TraceError(str(e), spec) from None
        return generate(config, seed)
    suffix = Path(text).suffix.lower()
    bs = MOONCAKE_BLOCK_SIZE if block_size is None else block_size
    if suffix == ".jsonl":
        return load_mooncake(text, bs)
    if suffix == ".csv":
        return load_azure(text, bs)
    raise TraceError(f"unrecognized trace; expected {_ACCEPTED_FORMS}", spec)


def scale_lengths(trace: Trace, x: float, max_tokens: int | None = None) -> Trace:
    """The trace at another prompt scale, as ``vertumnus load`` sends it to real engines.

    Lengths become ``max(1, min(max_tokens, round(length × x)))`` and blocks
    ``max(1, round(block_size × x))`` tokens, so a trace's 512-token blocks at
    ``x = 1/32`` are the torch engine's 16-token blocks and the prefix structure
    is kept. Only a request's *full* blocks keep their keys: an engine caches
    full blocks only, and the simulator must not find a cached partial tail
    that the engine could not have. ``vertumnus simulate --length-scale`` and
    ``vertumnus load --length-scale`` both apply this, which is what makes a
    simulation and a real run of the "same scaled trace" the same requests.
    """
    if not (isinstance(x, int | float) and math.isfinite(x) and x > 0):
        raise ValueError(f"length scale must be a finite number > 0, got {x!r}")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if x == 1 and max_tokens is None:
        return trace
    block = max(1, round(trace.block_size * x))
    cap = max_tokens if max_tokens is not None else math.inf
    requests = []
    for r in trace.requests:
        length = int(max(1, min(cap, round(r.length * x))))
        requests.append(replace(r, length=length, block_keys=r.block_keys[: length // block]))
    return Trace(name=trace.name, requests=tuple(requests), block_size=block)


def scale_rate(trace: Trace, x: float) -> Trace:
    """Compress arrivals by ``x``: every ``arrival_s`` becomes ``arrival_s / x``.

    ``x = 2`` doubles the request rate (same requests, half the time between
    them); ``x < 1`` stretches the trace. Order, ids and keys are unchanged.
    """
    if not (isinstance(x, int | float) and math.isfinite(x) and x > 0):
        raise ValueError(f"rate scale must be a finite number > 0, got {x!r}")
    if x == 1:
        return trace
    requests = tuple(replace(r, arrival_s=r.arrival_s / x) for r in trace.requests)
    return Trace(name=trace.name, requests=requests, block_size=trace.block_size)
