#!/usr/bin/env bash
# The GPU check: the gpu test tier, then training steps of a Qwen2.5-0.5B-shaped model (random
# weights) with their time and memory per phase, and one summary at the end.
#
#   bash benchmarks/gpu_check.sh              # after make setup on a CUDA machine
#   PY=python3 bash benchmarks/gpu_check.sh   # a bare machine with torch + transformers (no Ray, no vLLM)
#
# With Ray and vLLM installed the steps run through main_ppo.py with the vLLM engine; without them,
# in-process over one rank with the HF engine (benchmarks/step_time.py --in-process), and the tests
# that need vLLM skip and say so. Every part runs even when an earlier one fails; the exit status
# is the tests' (0 when they all passed or skipped).
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
LOG=${GPU_CHECK_LOG:-$(mktemp -d)}
STEPS=${GPU_CHECK_STEPS:-3}
export PYTHONUNBUFFERED=1

echo "== device"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "nvidia-smi: none"
$PY -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda,
'available', torch.cuda.is_available(), '| transformers', transformers.__version__)"

echo "== gpu tests"
$PY -m pytest -m gpu tests/gpu -q -rA -p no:cacheprovider --timeout="${GPU_TEST_TIMEOUT:-240}" 2>&1 | tee "$LOG/tests.txt"
tests_rc=${PIPESTATUS[0]}

echo "== training steps (Qwen2.5-0.5B shape, random weights)"
if $PY -c "import ray, vllm" 2>/dev/null; then
  steps=(--qwen05b --steps "$STEPS" trainer.device=cuda data.max_response_length=256)
else
  steps=(--in-process --qwen05b --steps "$STEPS" trainer.device=cuda actor_rollout_ref.rollout.name=hf
         data.max_response_length=256)
fi
$PY benchmarks/step_time.py "${steps[@]}" 2>&1 | tee "$LOG/steps.txt"
steps_rc=${PIPESTATUS[0]}

echo "== summary"
grep -E "^(PASSED|FAILED|ERROR|SKIPPED)" "$LOG/tests.txt" | sed 's/ - .*//' | sort | uniq -c | sort -rn | head -40
tail -n 1 "$LOG/tests.txt"
echo "steps: $( [ "$steps_rc" = 0 ] && echo ok || echo "failed ($steps_rc)" ) (${steps[*]})"
grep -E "^(generate|old_log_prob|ref|update_actor|update_weights|step) " "$LOG/steps.txt" || true
echo "logs in $LOG"
exit "$tests_rc"
