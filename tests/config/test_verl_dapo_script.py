"""verl's DAPO script (dynamic sampling, the overlong penalty) through the entry point, run by bash as a
user would: a dry run with paths changed. The other verl scripts: test_verl_scripts.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, tail

# verl's tests/special_e2e/run_dapo.sh at volcengine/verl b178a3cd56f58b2d502255daba591e92833930a7 (the
# recipe/dapo minimal run: dynamic sampling on seq_reward, gen_batch_size 4x the train batch, the overlong
# penalty under reward_model.*), from its first variable to its last line. Changed: the entry point
# (`python3 -m recipe.dapo.main_dapo`), the data paths ($HOME/data/gsm8k -> $DATA/kk_role) and the model
# download (a config-only Qwen2.5-0.5B shape at $MODEL_PATH: a dry run reads no weights).
VERL_DAPO_SCRIPT = r"""
NUM_GPUS=${NUM_GPUS:-8}

adv_estimator=grpo

kl_coef=0.0
use_kl_in_reward=False
use_kl_loss=False
kl_loss_coef=0.0

clip_ratio_low=0.2
clip_ratio_high=0.28

max_prompt_length=1024
max_response_length=2048
enable_overlong_buffer=True
overlong_buffer_len=128
overlong_penalty_factor=1.0

loss_agg_mode="token-mean"

enable_filter_groups=True
filter_groups_metric=seq_reward
max_num_gen_batches=10

train_traj_micro_bsz_per_gpu=2 # b
n_resp_per_prompt=4 # g

train_traj_micro_bsz=$((train_traj_micro_bsz_per_gpu * NUM_GPUS)) # b * n
train_traj_mini_bsz=$((train_traj_micro_bsz * 2)) # 2 * b * n
train_prompt_mini_bsz=$((train_traj_mini_bsz * n_resp_per_prompt)) # 2 * b * n / g
train_prompt_bsz=$((train_prompt_mini_bsz * 2)) # 4 * b * n / g

gen_prompt_bsz=$((train_prompt_bsz * 4))

exp_name="$(basename "${MODEL_ID,,}")-dapo-minimal"

"$PYTHON" "$LOGICRL/main_ppo.py" \
    data.train_files="$DATA/kk_role/train.parquet" \
    data.val_files="$DATA/kk_role/test.parquet" \
    reward_model.reward_manager=dapo \
    algorithm.adv_estimator=${adv_estimator} \
    algorithm.use_kl_in_reward=${use_kl_in_reward} \
    algorithm.kl_ctrl.kl_coef=${kl_coef} \
    actor_rollout_ref.actor.use_kl_loss=${use_kl_loss} \
    actor_rollout_ref.actor.kl_loss_coef=${kl_loss_coef} \
    actor_rollout_ref.actor.clip_ratio_low=${clip_ratio_low} \
    actor_rollout_ref.actor.clip_ratio_high=${clip_ratio_high} \
    data.max_prompt_length=${max_prompt_length} \
    data.max_response_length=${max_response_length} \
    reward_model.overlong_buffer.enable=${enable_overlong_buffer} \
    reward_model.overlong_buffer.len=${overlong_buffer_len} \
    reward_model.overlong_buffer.penalty_factor=${overlong_penalty_factor} \
    actor_rollout_ref.actor.loss_agg_mode=${loss_agg_mode} \
    data.train_batch_size=${train_prompt_bsz} \
    data.gen_batch_size=${gen_prompt_bsz} \
    algorithm.filter_groups.enable=${enable_filter_groups} \
    algorithm.filter_groups.metric=${filter_groups_metric} \
    algorithm.filter_groups.max_num_gen_batches=${max_num_gen_batches} \
    actor_rollout_ref.model.path="${MODEL_PATH}" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.model.use_fused_kernels=True \
    actor_rollout_ref.rollout.n=${n_resp_per_prompt} \
    actor_rollout_ref.actor.ppo_mini_batch_size=${train_prompt_mini_bsz} \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=${train_traj_micro_bsz_per_gpu} \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=${train_traj_micro_bsz_per_gpu} \
    actor_rollout_ref.rollout.tensor_model_parallel_size=2 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.8 \
    actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=${train_traj_micro_bsz_per_gpu} \
    actor_rollout_ref.ref.fsdp_config.param_offload=True \
    trainer.logger=console \
    trainer.project_name='verl-test' \
    trainer.experiment_name="${exp_name}" \
    trainer.n_gpus_per_node=${NUM_GPUS} \
    trainer.nnodes=1 \
    trainer.save_freq=-1 \
    trainer.total_epochs=2 \
    trainer.resume_mode=disable \
    trainer.val_before_train=False \
    trainer.total_training_steps=1 $@
"""


@pytest.mark.integration
def test_entry_point_dry_runs_verl_dapo_script_with_dynamic_sampling(kk_role, tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHON": sys.executable, "LOGICRL": str(ROOT),
           "DATA": str(ROOT / "data"), "MODEL_ID": "Qwen/Qwen2.5-0.5B-Instruct",
           "MODEL_PATH": str(ROOT / "logicrl/memory/shapes/qwen2.5-0.5b")}
    extra = ["trainer.dry_run=true", "trainer.gpu_memory_gb=80", f"trainer.default_local_dir={tmp_path / 'ckpt'}"]
    result = subprocess.run(["bash", "-c", VERL_DAPO_SCRIPT, "run_dapo.sh", *extra], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, tail(result)
    out = result.stdout + result.stderr
    # 8 ranks; b=2, g=4: mini-batch 128 prompts, train batch 256, generation rounds of 1024 prompts.
    assert "256 prompts x n=4 = 1024 responses; 128 responses per rank" in out
    assert ("sampling   dynamic (algorithm.filter_groups, metric=seq_reward): up to 10 generation rounds of 1024 "
            "prompts x n=4 (512 responses per rank per round), at most 10240 prompts per step, until 256 groups "
            "with a spread are kept") in out
    for key in ("enable", "len", "penalty_factor"):  # DAPO's overlong penalty under its recipe's spelling
        assert f"reward_model.overlong_buffer.{key}=" in out and f"using reward.overlong_buffer.{key}=" in out
    # The memory plan's generate row holds a round's 512 responses per rank, not the step's 128.
    assert "this rank generates 512" in out
