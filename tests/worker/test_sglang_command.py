"""The SGLang 0.5.23 command line of a CP worker, and ``vertumnus worker --engine sglang``.

Every flag emitted is defined in SGLang 0.5.23 (``sglang/srt/arg_groups/fields/*.py``;
the source line of each is in :mod:`vertumnus.worker.sglang.command`). CI has no
SGLang; with ``VERTUMNUS_SGLANG_SRC`` pointing at an unpacked 0.5.23 wheel,
:func:`test_every_flag_exists_in_the_sglang_source` checks the names against it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
from pathlib import Path

import pytest

from vertumnus.cli import main
from vertumnus.worker.sglang.command import (
    CommandError,
    PortPlan,
    SglangOptions,
    pod_commands,
    server_command,
)

OPTS = SglangOptions(model_path="/models/qwen3-30b-a3b")


def flags(argv):
    """{flag: value or True} of an argv after ``-m sglang.launch_server``."""
    out, args = {}, list(argv[3:])
    while args:
        flag = args.pop(0)
        assert flag.startswith("--"), flag
        out[flag] = args.pop(0) if args and not args[0].startswith("--") else True
    return out


@pytest.mark.parametrize("degree", [1, 2, 4, 8])
def test_a_pure_cp_worker_of_each_degree(degree):
    s = server_command(degree, OPTS)
    assert s.argv[:3] == ("python3", "-m", "sglang.launch_server")
    f = flags(s.argv)
    assert f["--model-path"] == "/models/qwen3-30b-a3b"
    assert f["--tp-size"] == str(degree)
    if degree > 1:  # pure CP: attention TP width tp / attn_cp = 1
        assert f["--attn-cp-size"] == str(degree)
        assert f["--enable-prefill-cp"] is True and f["--cp-strategy"] == "zigzag"
    else:  # zigzag never applies at cp_size 1: a plain one-GPU server
        assert not {"--attn-cp-size", "--enable-prefill-cp", "--cp-strategy"} & set(f)
    assert f["--page-size"] == "16" and f["--dtype"] == "bfloat16"
    assert f["--attention-backend"] == "fa3"
    assert f["--disaggregation-mode"] == "prefill"
    assert f["--disaggregation-transfer-backend"] == "mooncake"
    assert f["--disaggregation-bootstrap-port"] == "8998"
    assert (f["--host"], f["--port"], f["--nccl-port"]) == ("127.0.0.1", "30000", "31000")
    assert s.env == {"CUDA_VISIBLE_DEVICES": ",".join(map(str, range(degree)))}
    events = json.loads(f["--kv-events-config"])
    assert events == {
        "publisher": "zmq",
        "endpoint": "tcp://127.0.0.1:5557",
        "bind": True,
        "replay_endpoint": "tcp://127.0.0.1:5657",
        "buffer_steps": 10000,
        "hwm": 100000,
        "topic": "",
    }
    assert (s.events_endpoint, s.replay_endpoint) == (events["endpoint"], events["replay_endpoint"])


def test_ports_and_gpus_follow_the_workers_first_gpu():
    s = server_command(4, OPTS, offset=4)
    assert s.gpus == (4, 5, 6, 7) and s.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    assert s.ports == {
        "http": 30004,
        "bootstrap": 9002,
        "events": 5561,
        "replay": 5661,
        "nccl": 31004,
    }
    explicit = server_command(2, OPTS, offset=2, gpus=[6, 3])
    assert explicit.env["CUDA_VISIBLE_DEVICES"] == "6,3" and explicit.ports["http"] == 30002


def test_options_reach_the_command_line():
    opts = SglangOptions(
        model_path="/m/with space",
        block_size=64,
        dtype="float16",
        transfer_backend="nixl",
        host="0.0.0.0",
        ports=PortPlan(http=40000, bootstrap=41000, events=42000, replay=43000, nccl=44000),
        attention_backend=None,
        mem_fraction_static=0.85,
        served_model_name="qwen3",
        trust_remote_code=True,
        events_buffer_steps=50,
        python="/venv/bin/python",
        extra_args=("--context-length", "131072"),
    )
    s = server_command(2, opts, offset=6)
    f = flags(s.argv)
    assert s.argv[0] == "/venv/bin/python" and "--attention-backend" not in f
    assert (f["--page-size"], f["--dtype"], f["--disaggregation-transfer-backend"]) == (
        "64",
        "float16",
        "nixl",
    )
    assert (f["--host"], f["--port"], f["--disaggregation-bootstrap-port"]) == (
        "0.0.0.0",
        "40006",
        "41006",
    )
    assert f["--mem-fraction-static"] == "0.85" and f["--served-model-name"] == "qwen3"
    assert f["--trust-remote-code"] is True and f["--context-length"] == "131072"
    assert json.loads(f["--kv-events-config"])["buffer_steps"] == 50
    # The shell line is the same command: environment first, then argv, quoted.
    words = shlex.split(s.shell())
    assert words[0] == "CUDA_VISIBLE_DEVICES=6,7" and tuple(words[1:]) == s.argv


def test_a_pod_grouping_is_laid_out_left_to_right():
    servers = pod_commands([4, 2, 1, 1], OPTS, gpus_per_domain=8)
    assert [(s.degree, s.offset, s.gpus) for s in servers] == [
        (4, 0, (0, 1, 2, 3)),
        (2, 4, (4, 5)),
        (1, 6, (6,)),
        (1, 7, (7,)),
    ]
    assert [s.ports["http"] for s in servers] == [30000, 30004, 30006, 30007]
    every_port = [p for s in servers for p in s.ports.values()]
    assert len(every_port) == len(set(every_port))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: server_command(3, OPTS), "degree: must be a power of two, got 3"),
        (lambda: server_command(0, OPTS), "degree: must be a power of two"),
        (lambda: server_command(128, OPTS), "degree: at most 64"),
        (lambda: server_command(4, OPTS, gpus=[0, 1]), r"gpus: a CP4 worker runs on 4 GPUs, got 2"),
        (lambda: server_command(2, OPTS, gpus=[1, 1]), "gpus: must be distinct"),
        (lambda: server_command(4, OPTS, offset=2), "offset: a CP4 worker starts at a multiple"),
        (lambda: server_command(1, SglangOptions("")), "model_path: required"),
        (lambda: server_command(1, SglangOptions("/m", dtype="float64")), "dtype: SGLang 0.5.23"),
        (lambda: server_command(1, SglangOptions("/m", block_size=0)), "block_size: must be >= 1"),
        (
            lambda: server_command(1, SglangOptions("/m", transfer_backend="rdma")),
            "transfer_backend: 'rdma'",
        ),
        (
            lambda: server_command(1, SglangOptions("/m", ports=PortPlan(http=65500))),
            "ports.http: base 65500",
        ),
        (
            lambda: server_command(1, SglangOptions("/m", mem_fraction_static=1.5)),
            "mem_fraction_static",
        ),
        (lambda: pod_commands([], OPTS), "degrees: a pod runs at least one worker"),
        (
            lambda: pod_commands([2, 4, 2], OPTS),
            r"degrees\[1\]: a CP4 worker cannot start at GPU 2",
        ),
        (lambda: pod_commands([4, 3], OPTS), r"degrees\[1\]: must be a power of two"),
        (lambda: pod_commands([4, 2], OPTS, 8), "cover 6 GPUs, the pod has 8"),
    ],
)
def test_bad_input_names_the_field(call, match):
    with pytest.raises(CommandError, match=match):
        call()


def test_every_flag_exists_in_the_sglang_source():
    src = os.environ.get("VERTUMNUS_SGLANG_SRC")
    if not src:
        pytest.skip("set VERTUMNUS_SGLANG_SRC to an unpacked sglang 0.5.23 wheel to check")
    fields = Path(src) / "sglang" / "srt" / "arg_groups" / "fields"
    text = "".join(p.read_text() for p in fields.glob("*.py"))
    defined = set(re.findall(r"^    ([a-z_0-9]+): A\[", text, flags=re.M))
    opts = SglangOptions(
        "/m", mem_fraction_static=0.9, served_model_name="x", trust_remote_code=True
    )
    used = {a[2:].replace("-", "_") for a in server_command(2, opts).argv if a.startswith("--")}
    assert used <= defined, sorted(used - defined)


# -- the command line --------------------------------------------------------------------


def test_print_command_prints_the_environment_and_the_command(capsys):
    argv = ["worker", "--engine", "sglang", "--degree", "4", "--offset", "4"]
    assert main([*argv, "--model", "/models/q", "--print-command"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("# CP4 worker at GPU offset 4 (GPUs 4,5,6,7): HTTP port 30004")
    words = shlex.split(out[1])
    assert words[0] == "CUDA_VISIBLE_DEVICES=4,5,6,7"
    assert words[1:4] == ["python3", "-m", "sglang.launch_server"]
    assert tuple(words[1:]) == server_command(4, SglangOptions("/models/q"), offset=4).argv


def test_print_command_json_for_a_pods_grouping(capsys):
    argv = ["worker", "--engine", "sglang", "--degrees", "4,2,2", "--gpus-per-domain", "8"]
    assert main([*argv, "--model", "/m", "--host", "0.0.0.0", "--print-command", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["engine"] == "sglang" and doc["grpcBasePort"] == 50051
    assert [s["offset"] for s in doc["servers"]] == [0, 4, 6]
    assert doc["servers"][2]["env"] == {"CUDA_VISIBLE_DEVICES": "6,7"}
    assert "0.0.0.0" in doc["servers"][0]["argv"]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--degree", "3", "--print-command"], "degree: must be a power of two, got 3"),
        (["--degree", "4", "--gpus", "0,1", "--print-command"], "gpus: a CP4 worker runs on 4"),
        (["--degrees", "4,4", "--gpus-per-domain", "4", "--print-command"], "cover 8 GPUs"),
        (["--degrees", "2,2", "--offset", "2", "--print-command"], "go with --degree"),
        # Without --print-command the adapter runs a whole pod: one worker at an offset is not one.
        (["--degree", "2", "--offset", "2"], "the adapter runs a whole pod's grouping"),
    ],
)
def test_bad_worker_commands_exit_2_naming_the_problem(capsys, extra, message):
    assert main(["worker", "--engine", "sglang", "--model", "/m", *extra]) == 2
    assert message in capsys.readouterr().err
