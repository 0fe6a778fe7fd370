"""The vertumnus command: happy paths and clear errors (exit code 2)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import MOONCAKE, needs
from vertumnus.cli import main


def run(*argv):
    return subprocess.run(
        [sys.executable, "-m", "vertumnus", *argv], capture_output=True, text=True, timeout=300
    )


def test_simulate_writes_json_and_plot(tmp_path):
    out, png = tmp_path / "o.json", tmp_path / "o.png"
    rc = main(
        [
            "simulate",
            "--trace",
            "synthetic:duration_s=60",
            "--compare",
            "vertumnus:4xCP4+3xCP8,round-robin:4xCP4+3xCP8",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data["policies"]) == {"vertumnus:4xCP4+3xCP8", "round-robin:4xCP4+3xCP8"}
    for v in data["policies"].values():
        assert {
            "requests",
            "mean_ttft_s",
            "p90_ttft_s",
            "p99_ttft_s",
            "slo_attainment",
            "token_hit_rate",
        } <= set(v)
        assert v["requests"] == data["trace"]["requests"]
    assert png.stat().st_size > 1000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--compare", "vertumnus:4xCP4+3xCQ8"], "bad composition term '3xCQ8'"),
        (["--compare", "vertumnus:8xCP8"], "uses 64 GPUs, more than --gpus 40"),
        (["--compare", "nonsense:CP4"], "unknown policy 'nonsense'"),
        (["--compare", "vertumnus"], "needs a composition"),
        (["--trace", "/nonexistent/t.jsonl"], "t.jsonl"),
        (["--trace", "foo.txt"], "unrecognized trace"),
        (["--profile", "no-such-profile"], "unknown profile"),
        (["--planner", "window=30"], "unknown planner setting 'window' (known: window_s,"),
        (["--planner", "window_s=abc"], "planner setting window_s: expected a number, got 'abc'"),
        (["--planner", "multi_step=maybe"], "planner setting multi_step: expected true or false"),
        (["--planner", "persist_windows"], "expected NAME=VALUE"),
        (["--planner", "lower=0.95"], "lower"),  # PlannerSettings' own range check
        (["--compare", "vertumnus-adaptive:4xCP4"], "keeps all --gpus 40 GPUs, but 4xCP4 uses 16"),
        (["--prefixes", "n=0"], "--prefixes: n must be >= 1, got 0"),
        (["--prefixes", "size=3"], "--prefixes: bad item 'size=3'"),
    ],
)
def test_simulate_errors_are_one_clear_line(args, message):
    p = (
        run("simulate", "--trace", "synthetic:duration_s=5", *args)
        if "--trace" not in args
        else run("simulate", *args)
    )
    assert p.returncode == 2, p.stderr
    assert message in p.stderr
    assert "Traceback" not in p.stderr


def test_bad_trace_line_names_file_and_line(tmp_path):
    t = tmp_path / "bad.jsonl"
    t.write_text(
        '{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}\n{"timestamp": 1, "input_length": 10\n'
    )
    p = run("simulate", "--trace", str(t))
    assert p.returncode == 2
    assert "bad.jsonl:2" in p.stderr


def test_azure_trace_with_synthetic_prefixes_gets_hits(tmp_path):
    csv = tmp_path / "azure.csv"
    rows = [f"2023-11-16 18:17:{i // 10:02d}.{i % 10}000000,{3000 + 37 * i},10" for i in range(200)]
    csv.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    hit = {}
    for label, extra in (("plain", []), ("prefixes", ["--prefixes", "n=2,median=2048"])):
        out = tmp_path / f"{label}.json"
        argv = ["simulate", "--trace", str(csv), "--compare", "vertumnus:2xCP4", "--gpus", "8"]
        assert main([*argv, "--json", str(out), *extra]) == 0
        policies = json.loads(out.read_text())["policies"]
        hit[label] = policies["vertumnus:2xCP4"]["token_hit_rate"]
    assert hit["plain"] == 0.0 < hit["prefixes"]


def test_an_adaptive_pool_can_start_from_a_composition(tmp_path):
    out = tmp_path / "a.json"
    rc = main(
        [
            "simulate",
            "--trace",
            "synthetic:duration_s=30",
            "--gpus",
            "16",
            "--compare",
            "vertumnus-adaptive:2xCP8",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    timeline = json.loads(out.read_text())["policies"]["vertumnus-adaptive:2xCP8"][
        "composition_timeline"
    ]
    assert timeline[0]["composition"] == "2xCP8"


def test_a_missing_optional_dependency_is_one_clear_line():
    # As if torch were not installed: the worker commands say which extra to install.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from vertumnus.cli import main\n"
        "sys.exit(main(['engine', 'verify', '--json', '-']))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert "needs torch" in p.stderr and "vertumnus[worker]" in p.stderr
    assert "Traceback" not in p.stderr


def test_bad_flag_value_exits_2():
    p = run("simulate", "--rate-scale", "-1")
    assert p.returncode == 2 and "must be > 0" in p.stderr


def test_fit_prints_coefficients_and_errors(tmp_path, model):
    import numpy as np

    from vertumnus.core.fit import synthesize_profile
    from vertumnus.profiles import load_model, write_profile_csv

    rows = synthesize_profile(model, [1024, 8192, 65536], [0, 8192], 0.05, np.random.default_rng(0))
    csv_path = tmp_path / "p.csv"
    write_profile_csv(rows, csv_path)
    out = tmp_path / "fitted.json"
    p = run("fit", str(csv_path), "--out", str(out))
    assert p.returncode == 0, p.stderr
    assert "MAPE" in p.stdout and "alpha" in p.stdout
    assert load_model(str(out)).degrees == model.degrees


def test_fit_bad_csv_names_line(tmp_path):
    f = tmp_path / "p.csv"
    f.write_text("degree,uncached_tokens,cached_tokens,seconds\n1,100,0,0.1\n1,abc,0,0.2\n")
    p = run("fit", str(f))
    assert p.returncode == 2 and "p.csv:3" in p.stderr


@needs(MOONCAKE)
def test_mooncake_runs_through_the_cli(tmp_path):
    out = tmp_path / "m.json"
    p = run(
        "simulate",
        "--trace",
        str(MOONCAKE),
        "--compare",
        "least-work:4xCP4+3xCP8",
        "--rate-scale",
        "4",
        "--json",
        str(out),
    )
    assert p.returncode == 0, p.stderr
    assert json.loads(out.read_text())["policies"]["least-work:4xCP4+3xCP8"]["requests"] == 12031


def test_populations_multiply_the_users_through_the_cli(tmp_path):
    runs = {}
    for n in (1, 3):
        out = tmp_path / f"p{n}.json"
        argv = ["simulate", "--trace", "synthetic:duration_s=60", "--populations", str(n)]
        assert main([*argv, "--compare", "vertumnus:4xCP4+3xCP8", "--json", str(out)]) == 0
        runs[n] = json.loads(out.read_text())
    assert runs[3]["trace"]["requests"] == 3 * runs[1]["trace"]["requests"]
    assert runs[3]["trace"]["populations"] == 3
    p = run("simulate", "--populations", "0")
    assert p.returncode == 2 and "--populations" in p.stderr


def test_adaptive_and_phases_through_the_cli(tmp_path):
    out = tmp_path / "a.json"
    rc = main(
        [
            "simulate",
            "--trace",
            "synthetic:duration_s=240",
            "--phases",
            "60s:rate=3,long=0.3;60s:rate=0.5,long=4;repeat=2",
            "--compare",
            "vertumnus-adaptive,vertumnus-nocm:4xCP4+3xCP8",
            "--json",
            str(out),
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    adaptive = data["policies"]["vertumnus-adaptive"]
    fixed = data["policies"]["vertumnus-nocm:4xCP4+3xCP8"]
    assert adaptive["requests"] == fixed["requests"] == data["trace"]["requests"]
    assert adaptive["composition_timeline"][0]["t_s"] == 0.0
    assert fixed["reconfigurations"] == 0 and len(fixed["composition_timeline"]) == 1
    assert [p["label"] for p in adaptive["phases"]] == [p["label"] for p in fixed["phases"]]
    assert len(adaptive["phases"]) == 4
    assert sum(p["requests"] for p in fixed["phases"]) == fixed["requests"]


def test_planner_settings_reach_the_adaptive_controller(tmp_path):
    """--planner changes what vertumnus-adaptive does: with one-operation-per-window
    stepping and no follow-through it cannot move faster than the window clock."""
    from vertumnus.sim.runner import parse_planner_settings

    s = parse_planner_settings("window_s=30, persist_windows=3,multi_step=false,degrees=2/4/8")
    assert (s.window_s, s.persist_windows, s.multi_step, s.degrees) == (30.0, 3, False, (2, 4, 8))
    assert parse_planner_settings(None) == parse_planner_settings("")

    runs = {}
    # The rules alone (whatif=false): their windows and persistence set the pace.
    for label, planner in (
        ("default", "whatif=false"),
        ("slow", "whatif=false,window_s=60,persist_windows=4"),
    ):
        out = tmp_path / f"{label}.json"
        argv = [
            "simulate",
            "--trace",
            "synthetic:duration_s=240",
            "--phases",
            "60s:rate=3,long=0.3;60s:rate=0.5,long=4;repeat=2",
            "--compare",
            "vertumnus-adaptive",
            "--json",
            str(out),
        ]
        assert main(argv + (["--planner", planner] if planner else [])) == 0
        runs[label] = json.loads(out.read_text())["policies"]["vertumnus-adaptive"]
    # Four 60 s windows of persistence cannot confirm anything in a 240 s run.
    assert runs["slow"]["reconfigurations"] == 0
    assert runs["default"]["reconfigurations"] > 0


def test_help_lists_every_policy_kind():
    from vertumnus.sim.registry import KINDS

    p = run("simulate", "--help")
    assert p.returncode == 0
    for kind in KINDS:
        assert kind in p.stdout
