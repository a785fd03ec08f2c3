#!/usr/bin/env bash
# GPU benchmark. On a GPU, by default: benchmarks/gpu_compare.py, one run on that GPU of
# st5_jax's train step and the PyTorch path (transformers' T5EncoderModel, or a torch-only T5
# encoder without transformers) on the same shapes and model FLOPs, both sides' STS-B encode,
# then the st5_jax A/B variants (scan + remat, batch 512/1024, XLA GPU flags, fused attention,
# per-tower forward, host input) until ST5_GPU_BUDGET_S (default 450 s) is spent; one table
# (examples/s, TFLOP/s, MFU, st5_jax/torch) and $ST5_GPU_OUT/gpu_compare.json. Arguments after
# `--` go to gpu_compare.py (e.g. -- --torch_optimizer adafactor).
#
#     bash benchmarks/gpu.sh --jax-only            # the former run: `st5 bench` of each size only
#     bash benchmarks/gpu.sh --compare --cpu-tiny  # gpu_compare.py --tiny on this CPU
#
# `--jax-only`: `st5 bench` of T5.1.1 Base and Large, bf16, and MFU against the device's dense
# bf16 peak (analytic model FLOPs of st5_jax/flops.py / step time / peak).
#
# How to run it on a fresh GPU machine (Python 3.10+ and an NVIDIA driver; no jax; PyPI reachable),
# from the repository root:
#
#     ST5_GPU_INSTALL=1 bash benchmarks/gpu.sh
#
# ST5_GPU_INSTALL=1 creates the virtualenv .venv-gpu in the repository (once), runs
#     .venv-gpu/bin/pip install -e ".[gpu]"        # the project + jax[cuda12]==0.10.2 (pyproject's gpu extra)
# and runs the benchmark with it. Without ST5_GPU_INSTALL the script uses $ST5_PYTHON if set, else
# .venv-gpu if it exists, else the `python` on PATH (which must already have st5_jax's dependencies
# and a CUDA jax).
#
#     bash benchmarks/gpu.sh --cpu-tiny             # tiny shapes on this CPU (tests/test_benchmarks_speed.py)
#
# With no GPU (no nvidia-smi, or it lists none) the script switches to --cpu-tiny by itself, and
# --cpu-tiny is the `st5 bench` run of tiny sizes (tests/test_benchmarks_speed.py) unless --compare.
# Knobs (environment): ST5_GPU_SIZES (default "t5_1_1_base t5_1_1_large"), ST5_GPU_BATCH (256),
# ST5_GPU_LENGTH (128), ST5_GPU_STEPS (10), ST5_GPU_NEGATIVES (1: one hard-negative tower, stage 2),
# ST5_GPU_OUT (figures folder, default benchmarks/gpu_results). ST5_GPU_PEAK_TFLOPS overrides the
# peak table below (TFLOP/s, dense bf16) for a GPU it does not know.
# ST5_GPU_BUDGET_S (450): the compare run's wall-clock budget (it must end within 8 minutes on a
# lent GPU). The compare run needs torch (with CUDA) for its PyTorch side, and uses transformers
# if present; without torch it measures st5_jax alone (ST5_GPU_INSTALL does not install torch).
# Output: the compare run's table and gpu_compare.json; with --jax-only, one JSON per size from
# `st5 bench --json` in $ST5_GPU_OUT, and a table on stdout.
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$REPO"

TINY=0
MODE=auto  # auto: compare on a GPU, `st5 bench` only in --cpu-tiny; compare; jax-only
COMPARE_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --cpu-tiny) TINY=1 ;;
    --compare) MODE=compare ;;
    --jax-only) MODE=jax-only ;;
    --) shift; COMPARE_ARGS=("$@"); break ;;
    -h|--help) sed -n '2,39p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "gpu.sh: unknown argument $1 (known: --cpu-tiny, --compare, --jax-only, --help, -- ARGS)" >&2; exit 2 ;;
  esac
  shift
done

GPU_NAME=""
if [[ $TINY == 0 ]]; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    GPU_NAME="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1 || true)"
  fi
  if [[ -z "$GPU_NAME" ]]; then
    echo "gpu.sh: no NVIDIA GPU found (nvidia-smi); running --cpu-tiny instead." >&2
    TINY=1
  fi
fi

PY="${ST5_PYTHON:-python}"
if [[ "${ST5_GPU_INSTALL:-0}" == 1 ]]; then
  if [[ ! -x .venv-gpu/bin/python ]]; then
    python3 -m venv .venv-gpu
  fi
  .venv-gpu/bin/pip install --upgrade pip
  # jax[cuda12]==0.10.2 comes from pyproject's `gpu` extra: the jax version CI tests with.
  if [[ $TINY == 1 ]]; then
    .venv-gpu/bin/pip install -e .
  else
    .venv-gpu/bin/pip install -e ".[gpu]"
  fi
  PY=.venv-gpu/bin/python
elif [[ -z "${ST5_PYTHON:-}" && -x .venv-gpu/bin/python ]]; then
  PY=.venv-gpu/bin/python
fi

OUT="${ST5_GPU_OUT:-benchmarks/gpu_results}"
mkdir -p "$OUT"

if [[ $MODE == compare || ( $MODE == auto && $TINY == 0 ) ]]; then
  ARGS=(--json "$OUT/gpu_compare.json")
  if [[ $TINY == 1 ]]; then
    export JAX_PLATFORMS=cpu
    ARGS+=(--tiny)
  else
    # Both sizes on both sides first, then the A/B variants of the first size while the budget lasts.
    ARGS+=(--ab --budget_s "${ST5_GPU_BUDGET_S:-450}")
    [[ -n "${ST5_GPU_SIZES:-}" ]] && ARGS+=(--sizes "$(echo "$ST5_GPU_SIZES" | tr ' ' ',')")
    [[ -n "${ST5_GPU_BATCH:-}" ]] && ARGS+=(--batch "$ST5_GPU_BATCH")
    [[ -n "${ST5_GPU_LENGTH:-}" ]] && ARGS+=(--length "$ST5_GPU_LENGTH")
    [[ -n "${ST5_GPU_STEPS:-}" ]] && ARGS+=(--steps "$ST5_GPU_STEPS")
  fi
  echo "# device: ${GPU_NAME:-cpu (tiny shapes)}; python: $PY; benchmarks/gpu_compare.py ${ARGS[*]} ${COMPARE_ARGS[*]:-}"
  exec "$PY" benchmarks/gpu_compare.py "${ARGS[@]}" "${COMPARE_ARGS[@]}"
fi
NEG_FLAG=""
[[ "${ST5_GPU_NEGATIVES:-1}" == 1 ]] && NEG_FLAG="--negatives"

if [[ $TINY == 1 ]]; then
  export JAX_PLATFORMS=cpu
  SIZES="t5_tiny t5_1_1_tiny"; BATCH=8; LENGTH=16; STEPS=2; NEG_FLAG="--negatives"; DEVICE="cpu (tiny shapes)"
  DTYPE=float32  # bf16 matmuls are emulated on CPU: slow and not what this mode checks
else
  SIZES="${ST5_GPU_SIZES:-t5_1_1_base t5_1_1_large}"; BATCH="${ST5_GPU_BATCH:-256}"; LENGTH="${ST5_GPU_LENGTH:-128}"
  STEPS="${ST5_GPU_STEPS:-10}"; DEVICE="$GPU_NAME"; DTYPE=bfloat16
fi
echo "# device: $DEVICE; python: $PY; $DTYPE, batch $BATCH, length $LENGTH, steps $STEPS ${NEG_FLAG}"
"$PY" -c "import jax; print('# jax', jax.__version__, jax.default_backend(), jax.devices())"

for size in $SIZES; do
  "$PY" -m st5_jax.cli bench --size "$size" --dtype "$DTYPE" --batch "$BATCH" --length "$LENGTH" \
    --steps "$STEPS" $NEG_FLAG --encode_sentences 0 --json "$OUT/bench_${size}.json"
done

# MFU = achieved model FLOP/s / dense bf16 peak of the device.
GPU_NAME="$GPU_NAME" TINY="$TINY" OUT="$OUT" SIZES="$SIZES" "$PY" - <<'EOF'
import json, os

# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, from the vendors' data sheets.
PEAKS = [("H200", 989.0), ("H100 SXM", 989.0), ("H100 80GB HBM3", 989.0), ("H100 NVL", 835.0),
         ("H100 PCIe", 756.0), ("H100", 989.0), ("GH200", 989.0), ("B200", 2250.0), ("A100", 312.0),
         ("A10G", 70.0), ("A10", 125.0), ("L40S", 362.0), ("L4", 121.0), ("V100", 125.0)]
name, tiny = os.environ["GPU_NAME"], os.environ["TINY"] == "1"
peak = None
if os.environ.get("ST5_GPU_PEAK_TFLOPS"):
  peak, source = float(os.environ["ST5_GPU_PEAK_TFLOPS"]) * 1e12, "ST5_GPU_PEAK_TFLOPS"
elif not tiny:
  for key, tflops in PEAKS:
    if key.lower() in name.lower():
      peak, source = tflops * 1e12, f"{key} data sheet, {tflops:g} TFLOP/s dense bf16"
      break
print(f"\n{'size':<14} {'step s':>8} {'examples/s':>11} {'TFLOP/s':>9} {'MFU':>7} {'of matmul peak':>15}")
for size in os.environ["SIZES"].split():
  r = json.load(open(os.path.join(os.environ["OUT"], f"bench_{size}.json")))
  ach = r["achieved_flops_per_sec"]
  p = peak if peak else r["matmul_peak_flops_per_sec"]
  print(f"{size:<14} {r['step_seconds']:8.4f} {r['examples_per_sec']:11.1f} {ach / 1e12:9.3f} {ach / p:7.1%} "
        f"{r['fraction_of_matmul_peak']:15.1%}")
if peak:
  print(f"# MFU against {source} ({name})")
else:
  print(f"# MFU against the matmul peak measured in the same process ({'cpu, tiny shapes' if tiny else name}: "
        "no data-sheet peak known; set ST5_GPU_PEAK_TFLOPS)")
EOF
