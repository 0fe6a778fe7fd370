"""The SGLang 0.5.23 server command line of one CP worker (pure: values in, argv out).

A Vertumnus worker of degree C on GPUs g..g+C−1 of a domain pod is one
``python -m sglang.launch_server`` process that sees exactly those GPUs
(``CUDA_VISIBLE_DEVICES``) and runs *pure* context parallelism: every rank
holds the whole model (tensor-parallel width 1 inside attention) and the
prompt is split over the C ranks in SGLang's zigzag layout. Every flag below
was checked in the SGLang 0.5.23 wheel (``pip download --no-deps
sglang==0.5.23``); flag names are the field names with ``_`` → ``-``
(``sglang/srt/arg_groups/arg_utils.py:288``), booleans are ``store_true``
(``arg_utils.py:393``):

=========================================  ===========================================
flag                                        where it is defined / why
=========================================  ===========================================
``--model-path``                            ``arg_groups/fields/model.py:51``
``--tp-size C``                             ``fields/parallel.py:45``; the world size of the server
``--attn-cp-size C``                        ``fields/parallel.py:104``; attention TP width is
                                            tp / (attn_dp · attn_cp) = 1 (``parallel.py:317``)
``--enable-prefill-cp``                     ``fields/parallel.py:153``
``--cp-strategy zigzag``                    ``fields/parallel.py:157``; required with the former
                                            (``arg_groups/parallel_hook.py:151``); 2C chunks, rank
                                            k holds k and 2C−1−k, only when every extend length
                                            is ≥ 2C (``layers/cp/zigzag.py:15-29, 109-119``)
``--attention-backend fa3``                 ``fields/exec_.py:207``; zigzag CP runs on the
                                            flash-attention or TRT-LLM MHA kernels only
                                            (``zigzag.py:356``), and TRT-LLM's CP prefill needs
                                            SM100 (``arg_groups/attention_hook.py:228``): on an
                                            H200 (SM90) that leaves fa3
``--page-size B``                           ``fields/schedule.py:143``; = our block size, so one
                                            SGLang page is one of our blocks (see events.py)
``--dtype``                                 ``fields/model.py:160`` (no float64)
``--disaggregation-mode prefill``           ``fields/disagg.py:55``
``--disaggregation-transfer-backend``       ``fields/disagg.py:65``; choices
                                            ``arg_groups/choices.py:122``
``--disaggregation-bootstrap-port``         ``fields/disagg.py:81``; one per server: each prefill
                                            server binds its own bootstrap server on
                                            ``--host`` (``managers/disagg_service.py:41-48``)
``--kv-events-config JSON``                 ``fields/observability.py:144``; keys of
                                            ``KVEventsConfig`` (``disaggregation/kv_events.py:684``)
``--host``, ``--port``                      ``fields/serving.py:65-66``
``--nccl-port``                             ``fields/parallel.py:25``; unset, SGLang picks a free
                                            port itself (``server_args.py:771``), which two
                                            servers starting together can both pick
``--mem-fraction-static``                   ``fields/schedule.py:27`` (optional)
``--served-model-name``                     ``fields/serving.py:168`` (optional)
``--trust-remote-code``                     ``fields/model.py:106`` (optional)
=========================================  ===========================================

A CP1 worker is a plain one-GPU server: the CP flags are left out (zigzag
never applies at ``cp_size <= 1``, ``zigzag.py:110``).

**Ports.** A server is named by its worker's first GPU ``offset`` in the pod,
as the torch engine names its endpoints by rank: its HTTP port is
``http_base + offset``, and so on for each kind (:class:`PortPlan`). Offsets
are unique within a grouping and bounded by the domain size, so the ports of
every grouping a pod can take are known in advance (the pod template declares
them) and a regroup never moves a surviving worker's ports.

**KV events** are published on ``127.0.0.1`` only (``"bind": true``: a
concrete host is connected to otherwise, ``kv_events.py:551-566, 695``): the only
subscriber is our adapter in the same container. Only CP rank 0 of a server
publishes (``kv_events.py:66-78``), so each server is one event stream.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "DTYPES",
    "SGLANG_VERSION",
    "TRANSFER_BACKENDS",
    "CommandError",
    "PortPlan",
    "ServerCommand",
    "SglangOptions",
    "kv_events_config",
    "pod_commands",
    "server_command",
]

SGLANG_VERSION = "0.5.23"
"""The SGLang release these flags were checked against (pinned by the ``sglang`` extra)."""

DTYPES = ("auto", "half", "float16", "bfloat16", "float", "float32")
"""``--dtype`` choices of SGLang 0.5.23 (``arg_groups/fields/model.py:160-176``)."""

TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")
"""``--disaggregation-transfer-backend`` choices (``arg_groups/choices.py:122-129``)."""

_MAX_DEGREE = 64  # the largest NVLink domain the CRD allows (spec.gpusPerDomain)


class CommandError(ValueError):
    """A worker that cannot be started as asked; the message names the bad field."""


@dataclass(frozen=True)
class PortPlan:
    """Port bases; the server of the worker whose first GPU is ``offset`` adds ``offset``.

    Defaults: SGLang's own for the bootstrap server (8998, ``fields/disagg.py:81``)
    and the KV-event publisher (5557, ``kv_events.py:691``); the others are ours.
    """

    http: int = 30000
    bootstrap: int = 8998
    events: int = 5557
    replay: int = 5657
    nccl: int = 31000

    def for_offset(self, offset: int) -> dict[str, int]:
        """Every port of the server at ``offset``, by kind."""
        return {
            "http": self.http + offset,
            "bootstrap": self.bootstrap + offset,
            "events": self.events + offset,
            "replay": self.replay + offset,
            "nccl": self.nccl + offset,
        }


@dataclass(frozen=True)
class SglangOptions:
    """What every server of a pod shares (the CRD's ``model`` and ``engine`` settings)."""

    model_path: str
    block_size: int = 16
    dtype: str = "bfloat16"
    transfer_backend: str = "mooncake"
    host: str = "127.0.0.1"
    ports: PortPlan = field(default_factory=PortPlan)
    attention_backend: str | None = "fa3"
    mem_fraction_static: float | None = None
    served_model_name: str | None = None
    trust_remote_code: bool = False
    events_buffer_steps: int = 10_000
    """Batches SGLang keeps for replay (its default, ``kv_events.py:704``)."""
    events_hwm: int = 100_000
    """The PUB socket's high-water mark (its default, ``kv_events.py:709``)."""
    python: str = "python3"
    extra_args: tuple[str, ...] = ()
    """Appended verbatim (e.g. ``("--context-length", "131072")``)."""

    def check(self) -> None:
        """Raise :class:`CommandError` naming the first bad field."""
        if not self.model_path:
            raise CommandError("model_path: required (the model directory the server loads)")
        if self.block_size < 1:
            raise CommandError(f"block_size: must be >= 1, got {self.block_size}")
        if self.dtype not in DTYPES:
            raise CommandError(
                f"dtype: SGLang {SGLANG_VERSION} has no {self.dtype!r}; its --dtype choices "
                f"are {', '.join(DTYPES)}"
            )
        if self.transfer_backend not in TRANSFER_BACKENDS:
            raise CommandError(
                f"transfer_backend: {self.transfer_backend!r} is not one of "
                f"{', '.join(TRANSFER_BACKENDS)}"
            )
        if not self.host:
            raise CommandError("host: required")
        for kind, base in vars(self.ports).items():
            if not 1 <= base <= 65535 - (_MAX_DEGREE - 1):
                raise CommandError(
                    f"ports.{kind}: base {base} leaves no room for {_MAX_DEGREE} servers "
                    f"below 65536"
                )
        if self.mem_fraction_static is not None and not 0 < self.mem_fraction_static < 1:
            raise CommandError(
                f"mem_fraction_static: must be in (0, 1), got {self.mem_fraction_static}"
            )
        if self.events_buffer_steps < 1 or self.events_hwm < 1:
            raise CommandError("events_buffer_steps, events_hwm: must be >= 1")


@dataclass(frozen=True)
class ServerCommand:
    """One SGLang server: argv, the environment it adds, and where it listens."""

    degree: int
    offset: int
    gpus: tuple[int, ...]
    argv: tuple[str, ...]
    env: Mapping[str, str]
    ports: Mapping[str, int]

    @property
    def events_endpoint(self) -> str:
        """Where the adapter subscribes (ZMQ SUB)."""
        return f"tcp://127.0.0.1:{self.ports['events']}"

    @property
    def replay_endpoint(self) -> str:
        """Where the adapter asks for missed batches (ZMQ DEALER)."""
        return f"tcp://127.0.0.1:{self.ports['replay']}"

    def shell(self) -> str:
        """The command as one shell line: ``VAR=value ... python3 -m sglang.launch_server ...``."""
        assignments = [f"{k}={shlex.quote(v)}" for k, v in sorted(self.env.items())]
        return " ".join([*assignments, shlex.join(self.argv)])

    def to_json(self) -> dict[str, object]:
        return {
            "degree": self.degree,
            "offset": self.offset,
            "gpus": list(self.gpus),
            "env": dict(self.env),
            "argv": list(self.argv),
            "ports": dict(self.ports),
        }


def kv_events_config(ports: Mapping[str, int], options: SglangOptions) -> str:
    """``--kv-events-config``: a ZMQ publisher on loopback with a replay socket beside it."""
    config = {
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{ports['events']}",
        # A concrete host is connected to unless bind is set (kv_events.py:551-566, 695).
        "bind": True,
        "replay_endpoint": f"tcp://127.0.0.1:{ports['replay']}",
        "buffer_steps": options.events_buffer_steps,
        "hwm": options.events_hwm,
        "topic": "",
    }
    return json.dumps(config, separators=(",", ":"))


def _is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def server_command(
    degree: int, options: SglangOptions, *, offset: int = 0, gpus: Sequence[int] | None = None
) -> ServerCommand:
    """The server of a degree-``degree`` worker whose first GPU in the pod is ``offset``.

    ``gpus``: the pod-local GPU indices it runs on (default ``offset .. offset+degree−1``,
    the lattice rule of :class:`vertumnus.core.lattice.Slot`). Raises :class:`CommandError`.
    """
    if isinstance(degree, bool) or not isinstance(degree, int) or not _is_pow2(degree):
        raise CommandError(f"degree: must be a power of two, got {degree!r}")
    if degree > _MAX_DEGREE:
        raise CommandError(f"degree: at most {_MAX_DEGREE} (one NVLink domain), got {degree}")
    if offset < 0 or offset % degree:
        raise CommandError(
            f"offset: a CP{degree} worker starts at a multiple of {degree}, got {offset}"
        )
    if offset + degree > _MAX_DEGREE:
        raise CommandError(f"offset: {offset} + degree {degree} is past a {_MAX_DEGREE}-GPU domain")
    devices = tuple(range(offset, offset + degree)) if gpus is None else tuple(gpus)
    if len(devices) != degree:
        raise CommandError(
            f"gpus: a CP{degree} worker runs on {degree} GPUs, got {len(devices)} {list(devices)}"
        )
    if len(set(devices)) != len(devices) or any(g < 0 for g in devices):
        raise CommandError(f"gpus: must be distinct non-negative indices, got {list(devices)}")
    options.check()
    ports = options.ports.for_offset(offset)
    argv = [options.python, "-m", "sglang.launch_server", "--model-path", options.model_path]
    argv += ["--tp-size", str(degree)]
    if degree > 1:
        argv += ["--attn-cp-size", str(degree), "--enable-prefill-cp", "--cp-strategy", "zigzag"]
    if options.attention_backend:
        argv += ["--attention-backend", options.attention_backend]
    argv += [
        "--page-size",
        str(options.block_size),
        "--dtype",
        options.dtype,
        "--disaggregation-mode",
        "prefill",
        "--disaggregation-transfer-backend",
        options.transfer_backend,
        "--disaggregation-bootstrap-port",
        str(ports["bootstrap"]),
        "--kv-events-config",
        kv_events_config(ports, options),
        "--host",
        options.host,
        "--port",
        str(ports["http"]),
        "--nccl-port",
        str(ports["nccl"]),
    ]
    if options.mem_fraction_static is not None:
        argv += ["--mem-fraction-static", repr(options.mem_fraction_static)]
    if options.served_model_name:
        argv += ["--served-model-name", options.served_model_name]
    if options.trust_remote_code:
        argv.append("--trust-remote-code")
    argv += list(options.extra_args)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))}
    return ServerCommand(degree, offset, devices, tuple(argv), env, ports)


def pod_commands(
    degrees: Sequence[int], options: SglangOptions, gpus_per_domain: int | None = None
) -> list[ServerCommand]:
    """One server per worker of a grouping given as degrees, left to right over the GPUs
    (``4,2,2`` = CP4 on GPUs 0-3, CP2 on 4-5, CP2 on 6-7). ``gpus_per_domain``, if given,
    must be covered exactly. Raises :class:`CommandError` naming the fault."""
    if not degrees:
        raise CommandError("degrees: a pod runs at least one worker")
    servers, offset = [], 0
    for i, d in enumerate(degrees):
        if isinstance(d, bool) or not isinstance(d, int) or not _is_pow2(d):
            raise CommandError(f"degrees[{i}]: must be a power of two, got {d!r}")
        if offset % d:
            raise CommandError(
                f"degrees[{i}]: a CP{d} worker cannot start at GPU {offset} (it starts at a "
                f"multiple of {d}; put larger degrees first)"
            )
        servers.append(server_command(d, options, offset=offset))
        offset += d
    if gpus_per_domain is not None and offset != gpus_per_domain:
        raise CommandError(
            f"degrees: {list(degrees)} cover {offset} GPUs, the pod has {gpus_per_domain}"
        )
    return servers
