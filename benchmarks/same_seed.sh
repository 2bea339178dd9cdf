#!/usr/bin/env bash
# The runs a refactor that must change no result is checked on: the embedded default as `make train` runs it,
# PPO with all four models, a LoRA (QLoRA) run and a 2-rank sequence-parallel run, each writing its
# metrics.jsonl under OUT/<name>/. Run it on the tree before and after, then compare each pair:
#   benchmarks/same_seed.sh /path/to/old-tree /tmp/before      (the tree whose logicrl is imported)
#   benchmarks/same_seed.sh "$PWD" /tmp/after
#   for r in default ppo4 lora sp2; do python benchmarks/same_metrics.py /tmp/{before,after}/$r/metrics.jsonl; done
# RUNS="default lora" limits the set; STEPS sets the shorter runs' steps (default 4); the default run is
# make train's whole epoch unless DEFAULT_STEPS is set.
set -euo pipefail
TREE=$(cd "$1" && pwd); OUT=$2
PY=${PY:-$TREE/.venv/bin/python}
[ -x "$PY" ] || PY=python3
STEPS=${STEPS:-4}
ARR=actor_rollout_ref
declare -A ARGS=(
  [default]="${DEFAULT_STEPS:+trainer.total_training_steps=$DEFAULT_STEPS}"
  [ppo4]="+recipe=tiny_rm_ppo trainer.total_training_steps=$STEPS trainer.test_freq=2"
  [lora]="$ARR.model.lora_rank=4 $ARR.model.lora_alpha=8 $ARR.actor.use_kl_loss=true $ARR.model.quantization=nf4 \
$ARR.model.target_modules=[q_proj,v_proj] algorithm.adv_estimator=reinforce_plus_plus $ARR.actor.ppo_epochs=2 \
trainer.total_training_steps=$STEPS trainer.test_freq=2"
  [sp2]="trainer.n_gpus=2 $ARR.model.use_remove_padding=true $ARR.actor.ulysses_sequence_parallel_size=2 \
$ARR.actor.use_kl_loss=true $ARR.ref.ulysses_sequence_parallel_size=2 trainer.total_training_steps=$STEPS trainer.test_freq=2"
)
for run in ${RUNS:-default ppo4 lora sp2}; do
  dir=$OUT/$run; rm -rf "$dir"; mkdir -p "$dir"
  # The tree's own main_ppo.py and package (not an editable install elsewhere); data from this checkout.
  (cd "$TREE" && PYTHONPATH=$TREE OMP_NUM_THREADS=1 HYDRA_FULL_ERROR=0 "$PY" main_ppo.py ${ARGS[$run]} \
     trainer.logger=[console,jsonl] trainer.default_local_dir="$dir/ckpt" hydra.run.dir="$dir" trainer.save_freq=-1 \
     > "$dir/stdout.log" 2> "$dir/stderr.log") || { echo "$run failed: $dir/stderr.log"; tail -5 "$dir/stderr.log"; }
  echo "$run: $(wc -l < "$dir/metrics.jsonl" 2>/dev/null || echo 0) metric rows in $dir"
done
