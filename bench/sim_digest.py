"""A digest of every decision of 19 simulations: did a change move any result?

    python bench/sim_digest.py --json OUT.json          # ~5 min on 2 cores
    python bench/sim_digest.py --json B.json --against A.json

Runs fixed-pool simulations with every policy family (the Mooncake conversation trace at
rate scale 9, seed 1, with 14 policies on ``4xCP4+3xCP8``; ``synthetic:preset=toolagent``
at rate scale 10, seed 2; ``vertumnus-adaptive`` on the synthetic workload and on
Mooncake x9) and hashes, per run, every completion (request id, TTFT, worker, degree,
cached tokens) and the whole report but its wall time. Two trees that make the same
decisions give the same digests to the last bit; ``--against`` compares with an earlier
file and exits 1 naming every run that differs. Run it in each tree (each from its own
checkout) to compare them; issue 9's check of the serving core is this.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MOONCAKE = ROOT.parent / "shared" / "traces" / "mooncake" / "conversation_trace.jsonl"
POOL = "4xCP4+3xCP8"
_FIXED = [
    "vertumnus",
    "vertumnus-nocm",
    "llm-d",
    "dynamo-kv",
    "preble",
    "least-work",
    "sglang-cache-aware",
    "aibrix-conductor",
    "vllm-kvaware",
    "llm-d-precise",
    "round-robin",
    "cache-first",
    "length-only",
    "least-requests",
]


def runs() -> list[tuple[str, float, int, str]]:
    """(trace, rate scale, seed, policies) of the 19 runs."""
    return [
        (str(MOONCAKE), 9, 1, ",".join(f"{p}:{POOL}" for p in _FIXED)),
        (
            "synthetic:preset=toolagent",
            10,
            2,
            f"vertumnus:{POOL},vertumnus-nocm:{POOL},preble:{POOL}",
        ),
        ("synthetic", 1, 0, "vertumnus-adaptive"),
        (str(MOONCAKE), 9, 1, "vertumnus-adaptive"),
    ]


def digest() -> dict[str, dict[str, object]]:
    from vertumnus.profiles import DEFAULT_PROFILE, load_model
    from vertumnus.sim.runner import RunSettings, parse_policy_specs, run_policy
    from vertumnus.sim.traces import load_trace, scale_rate

    model = load_model(DEFAULT_PROFILE)
    out: dict[str, dict[str, object]] = {}
    for trace_spec, scale, seed, policies in runs():
        trace = load_trace(trace_spec, seed=seed)
        if scale != 1:
            trace = scale_rate(trace, scale)
        settings = RunSettings(model=model, seed=seed)
        for spec in parse_policy_specs(policies, 40):
            run = run_policy(spec, trace, settings)
            h = hashlib.sha256()
            for c in sorted(run.result.completions, key=lambda c: c.request_id):
                h.update(
                    repr((c.request_id, c.ttft_s, c.worker, c.degree, c.cached_tokens)).encode()
                )
            report = run.report()
            report.pop("wall_s")
            name = f"{Path(trace_spec).name}|x{scale}|seed {seed}|{spec.label}"
            out[name] = {
                "completions": h.hexdigest(),
                "report": hashlib.sha256(json.dumps(report, sort_keys=True).encode()).hexdigest(),
                "mean_ttft_s": report["mean_ttft_s"],
                "p90_ttft_s": report["p90_ttft_s"],
                "reconfigurations": report["reconfigurations"],
            }
            print(f"{name}: mean TTFT {report['mean_ttft_s']:.6f} s", file=sys.stderr, flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--json", type=Path, required=True, help="where to write the digests")
    ap.add_argument("--against", type=Path, default=None, help="an earlier digest file")
    args = ap.parse_args(argv)
    if not MOONCAKE.exists():
        print(f"error: needs {MOONCAKE} (../shared/traces beside the checkout)", file=sys.stderr)
        return 2
    out = digest()
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    if args.against is None:
        return 0
    before = json.loads(args.against.read_text())
    differ = [k for k in sorted(set(before) | set(out)) if before.get(k) != out.get(k)]
    print(f"{len(out) - len(differ)} of {len(out)} runs identical to {args.against}")
    for k in differ:
        print(f"  differs: {k}: {before.get(k)} -> {out.get(k)}")
    return 1 if differ else 0


if __name__ == "__main__":
    raise SystemExit(main())
