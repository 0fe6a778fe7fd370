"""Trace loading: exact parsing, every validated malformed case, the real public traces."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.conftest import AZURE_CODE, AZURE_CONV, MOONCAKE, needs
from vertumnus.core.keys import chain_block_hashes, chain_many
from vertumnus.core.types import Request
from vertumnus.sim.traces import (
    Trace,
    TraceError,
    load_azure,
    load_mooncake,
    load_trace,
    scale_rate,
)


def _write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def _line(**fields: object) -> str:
    return json.dumps(fields)


# ---------------------------------------------------------------- Mooncake


def test_mooncake_exact(tmp_path: Path) -> None:
    text = "\n".join(
        [
            _line(timestamp=0, input_length=5, output_length=7, hash_ids=[1, 2]),
            "",  # blank lines are skipped
            _line(timestamp=1500, input_length=8, output_length=0, hash_ids=[1, 2]),
            "   ",
            _line(timestamp=1500, input_length=3, hash_ids=[9], extra="ignored"),
        ]
    )
    tr = load_mooncake(_write(tmp_path, "t.jsonl", text + "\n"), block_size=4)
    assert tr.name == "t.jsonl"
    assert tr.block_size == 4
    assert [r.id for r in tr] == [0, 1, 2]
    assert [r.arrival_s for r in tr] == [0.0, 1.5, 1.5]
    assert [r.length for r in tr] == [5, 8, 3]
    assert [r.output_length for r in tr] == [7, 0, 0]  # absent output_length -> 0
    assert tr.requests[0].block_keys == chain_block_hashes([1, 2])
    assert tr.requests[2].block_keys == chain_block_hashes([9])
    # Same hash ids -> same chained keys: the second request reuses the first's prefix.
    assert tr.requests[1].block_keys == tr.requests[0].block_keys
    assert tr.duration_s == 1.5
    assert tr.total_tokens == 16


GOOD = _line(timestamp=10, input_length=600, output_length=1, hash_ids=[0, 1])


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ('{"timestamp": 20, "input_length": 600,', "not valid JSON"),
        ("[1, 2, 3]", "expected a JSON object"),
        (_line(input_length=600, hash_ids=[0, 1]), '"timestamp" is missing'),
        (_line(timestamp=20, hash_ids=[0, 1]), '"input_length" is missing'),
        (_line(timestamp=20, input_length=600), '"hash_ids" is missing'),
        (
            _line(timestamp=20, input_length=-3, hash_ids=[]),
            '"input_length" must be a positive integer, got -3',
        ),
        (
            _line(timestamp=20, input_length=0, hash_ids=[]),
            '"input_length" must be a positive integer, got 0',
        ),
        (
            _line(timestamp=20, input_length=600.5, hash_ids=[0, 1]),
            '"input_length" must be a positive integer, got 600.5',
        ),
        (
            _line(timestamp=20, input_length="600", hash_ids=[0, 1]),
            '"input_length" must be a positive integer, got "600"',
        ),
        (
            _line(timestamp=20, input_length=True, hash_ids=[0]),
            '"input_length" must be a positive integer, got true',
        ),
        (
            _line(timestamp=-1, input_length=600, hash_ids=[0, 1]),
            '"timestamp" must be an integer >= 0, got -1',
        ),
        (
            _line(timestamp=20.5, input_length=600, hash_ids=[0, 1]),
            '"timestamp" must be an integer >= 0',
        ),
        (
            _line(timestamp=20, input_length=600, output_length=-2, hash_ids=[0, 1]),
            '"output_length" must be an integer >= 0, got -2',
        ),
        (
            _line(timestamp=20, input_length=600, hash_ids=[0]),
            '"hash_ids" has 1 entries but "input_length" 600 needs ceil(600/512) = 2',
        ),
        (_line(timestamp=20, input_length=600, hash_ids=[0, 1, 2]), '"hash_ids" has 3 entries'),
        (
            _line(timestamp=20, input_length=600, hash_ids=[0, "x"]),
            '"hash_ids"[1] must be an integer >= 0, got "x"',
        ),
        (
            _line(timestamp=20, input_length=600, hash_ids=[-5, 1]),
            '"hash_ids"[0] must be an integer >= 0, got -5',
        ),
        (
            _line(timestamp=20, input_length=600, hash_ids="0,1"),
            '"hash_ids" must be a list of integers',
        ),
        (
            _line(timestamp=5, input_length=600, hash_ids=[0, 1]),
            '"timestamp" 5 is earlier than 10 on line 1',
        ),
    ],
)
def test_mooncake_malformed_names_file_and_line(tmp_path: Path, bad: str, expected: str) -> None:
    # The bad record is on physical line 3 (line 2 is blank).
    path = _write(tmp_path, "trace.jsonl", f"{GOOD}\n\n{bad}\n{GOOD}\n")
    with pytest.raises(TraceError) as info:
        load_mooncake(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:3: "), msg
    assert expected in msg, msg
    assert info.value.line == 3 and info.value.path == str(path)


def test_mooncake_missing_empty_and_directory(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(TraceError, match=r"nope\.jsonl: no such file"):
        load_mooncake(missing)
    with pytest.raises(TraceError, match=r"empty\.jsonl: no requests"):
        load_mooncake(_write(tmp_path, "empty.jsonl", "\n\n"))
    (tmp_path / "d.jsonl").mkdir()
    with pytest.raises(TraceError, match=r"d\.jsonl: is a directory"):
        load_mooncake(tmp_path / "d.jsonl")


def test_mooncake_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "bin.jsonl"
    p.write_bytes(GOOD.encode() + b"\n\xff\xfe\n")
    with pytest.raises(TraceError, match=r"bin\.jsonl:\d+: not valid UTF-8"):
        load_mooncake(p)


# ---------------------------------------------------------------- Azure


AZURE_HEAD = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def test_azure_exact(tmp_path: Path) -> None:
    text = (
        AZURE_HEAD
        + "2023-11-16 18:17:03.9799600,4808,10\n"
        + "2023-11-16 18:17:04.0319600,512,8\n"
        + "\n"
        + "2023-11-16 18:17:05,1,0\n"  # no fraction
        + "2023-11-17 00:00:00.5,1025,3\n"  # crosses midnight, 1 digit
    )
    tr = load_azure(_write(tmp_path, "a.csv", text), block_size=512)
    assert [r.length for r in tr] == [4808, 512, 1, 1025]
    assert [r.output_length for r in tr] == [10, 8, 0, 3]
    arr = [r.arrival_s for r in tr]
    assert arr[0] == 0.0
    assert arr[1] == pytest.approx(0.052, abs=1e-12)
    assert arr[2] == pytest.approx(1.02004, abs=1e-12)
    assert arr[3] == pytest.approx(5 * 3600 + 42 * 60 + 56.02004 - 0.5 + 1.0, abs=1e-9)
    assert [len(r.block_keys) for r in tr] == [10, 1, 1, 3]
    # No prefix information: no block key is shared between requests.
    all_keys = [k for r in tr for k in r.block_keys]
    assert len(set(all_keys)) == len(all_keys)


def test_azure_tolerates_bom_and_header_spaces(tmp_path: Path) -> None:
    p = tmp_path / "bom.csv"
    p.write_bytes(
        b"\xef\xbb\xbfTIMESTAMP, ContextTokens ,GeneratedTokens\n2023-11-16 18:17:03.97,5,1\n"
    )
    assert len(load_azure(p)) == 1


GOOD_ROW = "2023-11-16 18:17:03.9799600,4808,10"


@pytest.mark.parametrize(
    ("bad", "expected"),
    [
        ("yesterday,10,1", "bad TIMESTAMP 'yesterday'"),
        (
            "2023-13-16 18:17:03.97,10,1",
            "bad TIMESTAMP '2023-13-16 18:17:03.97': month must be in 1..12",
        ),
        ("2023-11-16 18:17:03.9799600123,10,1", "bad TIMESTAMP"),
        ("2023-11-16 18:17:04,0,1", "ContextTokens must be a positive integer, got '0'"),
        ("2023-11-16 18:17:04,-4,1", "ContextTokens must be a positive integer, got '-4'"),
        ("2023-11-16 18:17:04,12.5,1", "ContextTokens must be a positive integer, got '12.5'"),
        ("2023-11-16 18:17:04,12,x", "GeneratedTokens must be an integer >= 0, got 'x'"),
        ("2023-11-16 18:17:04,12", "expected 3 columns, got 2"),
        ("2023-11-16 18:17:03.0,12,1", "is earlier than the one on line 2"),
    ],
)
def test_azure_malformed_names_file_and_line(tmp_path: Path, bad: str, expected: str) -> None:
    path = _write(tmp_path, "az.csv", f"{AZURE_HEAD}{GOOD_ROW}\n{bad}\n{GOOD_ROW}\n")
    with pytest.raises(TraceError) as info:
        load_azure(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}:3: "), msg
    assert expected in msg, msg


def test_azure_bad_header_and_empty(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"h\.csv:1: bad header 'time,ctx,gen'"):
        load_azure(_write(tmp_path, "h.csv", f"time,ctx,gen\n{GOOD_ROW}\n"))
    with pytest.raises(TraceError, match=r"e\.csv:1: empty file"):
        load_azure(_write(tmp_path, "e.csv", ""))
    with pytest.raises(TraceError, match=r"o\.csv: no requests"):
        load_azure(_write(tmp_path, "o.csv", AZURE_HEAD))
    with pytest.raises(TraceError, match=r"x\.csv: no such file"):
        load_azure(tmp_path / "x.csv")


# ---------------------------------------------------------------- load_trace / scale_rate


def test_load_trace_dispatch(tmp_path: Path) -> None:
    j = _write(tmp_path, "m.jsonl", GOOD + "\n")
    c = _write(tmp_path, "a.CSV", AZURE_HEAD + GOOD_ROW + "\n")
    assert load_trace(str(j)).requests[0].length == 600
    assert load_trace(str(c)).requests[0].length == 4808
    assert load_trace(str(c), block_size=1024).requests[0].block_keys.__len__() == 5
    syn = load_trace("synthetic:duration_s=30,mean_rate=2", seed=3)
    assert syn.name == "synthetic(seed=3)"
    assert 0 < len(syn) < 200 and syn.requests[-1].arrival_s < 30
    assert load_trace("synthetic:duration_s=30", seed=3, block_size=256).block_size == 256
    assert load_trace("synthetic:duration_s=30,mean_rate=2", seed=3) == syn


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("trace.parquet", "trace.parquet: unrecognized trace; expected 'synthetic'"),
        ("synth", "synth: unrecognized trace"),
        ("synthetic:speed=3", "unknown synthetic option 'speed'"),
        ("synthetic:duration_s", "bad synthetic option 'duration_s': expected KEY=VALUE"),
        ("synthetic:mean_rate=fast", "synthetic option mean_rate='fast': expected a number"),
        ("synthetic:block_size=1.5", "synthetic option block_size='1.5': expected an integer"),
        ("synthetic:mean_rate=-1", "mean_rate must be > 0"),
        ("/no/such/dir/t.jsonl", "/no/such/dir/t.jsonl: no such file"),
    ],
)
def test_load_trace_errors(spec: str, expected: str) -> None:
    with pytest.raises(TraceError) as info:
        load_trace(spec)
    assert expected in str(info.value)


def _tiny() -> Trace:
    reqs = [Request(i, float(i), 10 + i, (i,)) for i in range(5)]
    return Trace("tiny", tuple(reqs), 16)


def test_scale_rate() -> None:
    tr = _tiny()
    fast = scale_rate(tr, 4)
    assert [r.arrival_s for r in fast] == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert [r.block_keys for r in fast] == [r.block_keys for r in tr]
    assert scale_rate(tr, 0.5).duration_s == 8.0
    assert scale_rate(tr, 1) is tr
    for bad in (0, -1, math.inf, math.nan):
        with pytest.raises(ValueError, match="rate scale"):
            scale_rate(tr, bad)


def test_trace_invariants_and_from_requests() -> None:
    a, b = Request(0, 2.0, 5, ()), Request(1, 1.0, 6, ())
    with pytest.raises(ValueError, match="before"):
        Trace("x", (a, b), 16)
    with pytest.raises(ValueError, match="ids must be 0..n-1"):
        Trace("x", (Request(3, 0.0, 5, ()),), 16)
    tr = Trace.from_requests("x", [a, b, Request(7, 1.0, 7, ())], 16)
    assert [(r.id, r.arrival_s, r.length) for r in tr] == [(0, 1.0, 6), (1, 1.0, 7), (2, 2.0, 5)]
    assert _tiny().with_requests(reversed(_tiny().requests)).requests == _tiny().requests
    assert Trace("e", (), 16).duration_s == 0.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=12), max_size=12)
)
def test_chain_many_matches_chain_block_hashes(lists: list[list[int]]) -> None:
    assert chain_many(lists) == [chain_block_hashes(h) for h in lists]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.floats(min_value=0, max_value=1e4), min_size=1, max_size=30),
    st.floats(min_value=1e-3, max_value=1e3),
)
def test_scale_rate_property(arrivals: list[float], x: float) -> None:
    tr = Trace.from_requests("p", [Request(0, a, 1, (7,)) for a in arrivals], 4)
    out = scale_rate(tr, x)
    assert [r.arrival_s for r in out] == [r.arrival_s / x for r in tr]
    assert [r.id for r in out] == list(range(len(tr)))


# ---------------------------------------------------------------- the real traces


@needs(MOONCAKE)
def test_real_mooncake_conversation_trace() -> None:
    tr = load_mooncake(MOONCAKE)
    assert len(tr) == 12031
    assert tr.block_size == 512
    assert tr.requests[0].length == 6758 and tr.requests[0].output_length == 500
    assert tr.duration_s == pytest.approx(3536.999)
    with MOONCAKE.open() as f:
        for i, line in enumerate(f):
            if i % 997 == 0:
                assert tr.requests[i].block_keys == chain_block_hashes(json.loads(line)["hash_ids"])
    from vertumnus.sim.synthetic import trace_stats

    s = trace_stats(tr)
    assert s["long_fraction"] == pytest.approx(0.0688, abs=1e-3)
    assert s["token_hit_rate"] == pytest.approx(0.3736, abs=1e-3)


@pytest.mark.parametrize(
    ("path", "n"),
    [
        pytest.param(AZURE_CODE, 8819, marks=needs(AZURE_CODE)),
        pytest.param(AZURE_CONV, 19366, marks=needs(AZURE_CONV)),
    ],
)
def test_real_azure_traces(path: Path, n: int) -> None:
    tr = load_azure(path)
    assert len(tr) == n
    assert tr.requests[0].arrival_s == 0.0
    assert 3000 < tr.duration_s < 3700  # about one hour
    seen: set[int] = set()
    for r in tr:
        assert seen.isdisjoint(r.block_keys)
        seen.update(r.block_keys)
