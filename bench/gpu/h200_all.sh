#!/usr/bin/env bash
# Every GPU check of this repository in one run on one lent GPU (at most 10 minutes, the sum of its time boxes),
# each step time-boxed and writing its own files under OUT, so a step that fails or
# runs long costs only itself:
#
#   1. machine.txt  - the GPU, Python, torch, and whether SGLang and its kernels are
#                     installed (bench/gpu/sglang_check.py needs them; it runs only
#                     when `import sglang` works and SGLANG_MODEL names a local model)
#   2. h200.json    - bench/gpu/zigzag_h200.py: per-rank zigzag compute for a
#                     Qwen3-30B-A3B-shaped layer, the alpha / c fit, and the engine's
#                     one-rank NCCL check against the CPU reference
#   3. profile.csv, profile-fit.json - `vertumnus profile --device cuda` through the
#                     CLI on a one-layer Qwen3-30B-A3B-shaped checkpoint written here
#                     (random weights), CP1 (one GPU: NCCL takes one GPU per rank)
#
# Needs only python3 with torch and safetensors: like zigzag_h200.py it runs the
# package from the checkout (symlinks on PYTHONPATH), without an install.
#
#   bash bench/gpu/h200_all.sh results/h200          # on the GPU machine
#   VERTUMNUS_CPU_SMOKE=1 bash bench/gpu/h200_all.sh /tmp/h200-smoke   # tiny, on CPU
#   VERTUMNUS_GPU_STEPS=profile bash bench/gpu/h200_all.sh OUT   # step 1 and only the profile
set -u
out=${1:?usage: bench/gpu/h200_all.sh OUT_DIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
export PYTHONUNBUFFERED=1
smoke=${VERTUMNUS_CPU_SMOKE:-0}
steps=" ${VERTUMNUS_GPU_STEPS:-zigzag profile} "  # step 1 (machine) always runs

farm=$(mktemp -d)
trap 'rm -rf "$farm"' EXIT
mkdir "$farm/vertumnus"
for entry in src/vertumnus/*; do ln -s "$root/$entry" "$farm/vertumnus/"; done
ln -s "$root/worker" "$farm/vertumnus/worker"  # as pyproject.toml's package-dir maps them
ln -s "$root/router" "$farm/vertumnus/router"
ln -s "$root/operator/vertumnus_operator" "$farm/vertumnus/operator"
export PYTHONPATH="$farm${PYTHONPATH:+:$PYTHONPATH}"

step() { echo "== $(date -u +%T) $*" | tee -a "$out/steps.log"; }

step "1 machine"
{
  nvidia-smi || echo "no nvidia-smi"
  python3 -c 'import sys, torch; print(sys.version); print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available())'
  python3 -m pip show sglang sglang-kernel sgl-kernel flashinfer-python 2>&1
  python3 -c 'import sglang; print("sglang", sglang.__version__)' 2>&1
} >"$out/machine.txt" 2>&1
if python3 -c 'import sglang' 2>/dev/null && [ -n "${SGLANG_MODEL:-}" ]; then
  step "1b sglang_check"
  timeout 420 python3 bench/gpu/sglang_check.py --model "$SGLANG_MODEL" \
    --out "$out/sglang.json" >"$out/sglang.log" 2>&1
  echo "sglang_check exit $?" | tee -a "$out/steps.log"
fi

if [[ $steps == *" zigzag "* ]]; then
step "2 zigzag_h200"
if [ "$smoke" = 1 ]; then zz=(--cpu-tiny); else zz=(--budget-s 120); fi
timeout 220 python3 bench/gpu/zigzag_h200.py "${zz[@]}" --out "$out/h200.json" \
  >"$out/zigzag.log" 2>&1
echo "zigzag_h200 exit $?" | tee -a "$out/steps.log"
fi

if [[ $steps == *" profile "* ]]; then
step "3 profile"
if [ "$smoke" = 1 ]; then
  device=cpu dtype=float32 grid=(--uncached 64,128 --cached 0,64 --repeats 1)
else
  device=cuda dtype=bfloat16 grid=(--uncached 1024,4096,16384 --cached 0,4096,16384 --repeats 3)
fi
timeout 120 python3 - "$farm/model" "$smoke" <<'EOF' >"$out/profile.log" 2>&1
import sys, torch
from vertumnus.worker.config import ModelConfig
from vertumnus.worker.model import Model
path, smoke = sys.argv[1], sys.argv[2] == "1"
# One layer of Qwen3-30B-A3B (as zigzag_h200.py's real_shape, with its vocabulary).
cfg = ModelConfig.tiny() if smoke else ModelConfig(
    model_type="qwen3_moe", vocab_size=151936, hidden_size=2048, num_hidden_layers=1,
    num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
    num_experts_per_tok=8, moe_intermediate_size=768, intermediate_size=6144,
    max_position_embeddings=131072, rope_theta=1000000.0)
device = "cpu" if smoke else "cuda"
Model.random(cfg, seed=0, dtype=torch.bfloat16 if not smoke else torch.float32, device=device).save(path)
print("wrote", path)
EOF
timeout 240 python3 -m vertumnus profile --model "$farm/model" --device "$device" \
  --dtype "$dtype" --degrees 1 "${grid[@]}" --out "$out/profile.csv" \
  --fit-json "$out/profile-fit.json" >>"$out/profile.log" 2>&1
echo "profile exit $?" | tee -a "$out/steps.log"
fi
step "done"
