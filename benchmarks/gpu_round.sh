#!/usr/bin/env bash
# This round's GPU checks in one run, on a bare CUDA machine (torch + transformers + peft, no Ray/vLLM):
# the packed-attention kernel against padded log-probs and the planner's packed term, QLoRA's
# NF4 path and its plan, the update's MFU, the tensor-peak memory metric, then the rest of
# the GPU tier. Wheels for what the machine lacks travel in .whl (hydra, omegaconf, antlr, tensordict,
# torchao); see the device notes in docs/testing.md.
#   bash benchmarks/gpu_round.sh [OUTDIR]
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-${OUT:-$(mktemp -d)}}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD || exit 1
fi
export TORCHAO_FORCE_SKIP_LOADING_SO_FILES=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
echo "== this round's checks"
python3 -m pytest -m gpu -q -rA -s -p no:cacheprovider --timeout=240 tests/gpu/test_packed_attention_cuda.py \
  tests/gpu/test_qlora_cuda.py tests/gpu/test_step_perf_cuda.py 2>&1 | tee "$OUT/round.txt"
echo "== the rest of the GPU tier"
python3 -m pytest -m gpu -q -rA -p no:cacheprovider --timeout=150 tests/gpu --deselect tests/gpu/test_packed_attention_cuda.py \
  --deselect tests/gpu/test_qlora_cuda.py --deselect tests/gpu/test_step_perf_cuda.py \
  --deselect tests/gpu/test_mismatch_cuda.py 2>&1 | tee "$OUT/tier.txt" | tail -40
