"""verl's one-step-off recipe script (rollout and trainer on separate device groups) through the entry point:
a dry run that plans each group on its own devices and estimates the async step against the colocated one.

The overrides are verl/experimental/one_step_off_policy/shell/grpo_0.6b_gsm8k_fsdp2_2_6.sh at volcengine/verl
b178a3cd56f58b2d502255daba591e92833930a7 (2026-01-29; it moved there from recipe/one_step_off_policy/),
verbatim, its variables at their defaults (NNODES=1, NGPUS_PER_NODE=8: 2 rollout and 6 trainer GPUs). Changed:
the entry point (`python3 -m verl.experimental.one_step_off_policy.main_ppo`), the paths (gsm8k's parquet ->
this repo's kk_role; $MODEL_PATH -> a config-only Qwen3-0.6B written here: a dry run reads no weights;
$CKPTS_DIR is never passed). What a user appends for `$@`: the GPUs planned for (trainer.gpu_memory_gb,
trainer.gpu_model). The script's rollout tensor parallelism 2 makes the rollout group one engine over its 2
devices.
"""

from __future__ import annotations

import json

import pytest

from logicrl.config.phases import ARR
from tests.conftest import ROOT, check_main

TRAIN, VAL = ROOT / "data/kk_role/train.parquet", ROOT / "data/kk_role/test.parquet"
# Qwen/Qwen3-0.6B's config.json figures (28 layers, hidden 1024, 16 heads / 8 KV heads of 128, tied embeddings).
QWEN3_06B = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
             "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16, "num_key_value_heads": 8,
             "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "tie_word_embeddings": True,
             "attention_bias": False, "rms_norm_eps": 1e-06, "rope_theta": 1000000, "torch_dtype": "bfloat16"}


def one_step_off_script(model_path) -> list[str]:
    """The script's python3 line, its shell variables substituted."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={TRAIN}", f"data.val_files={VAL}",
        "data.train_batch_size=1152", "data.max_prompt_length=512", "data.max_response_length=1024",
        "data.filter_overlong_prompts=True", "data.truncation='error'",
        f"{ARR}.actor.strategy=fsdp2", "critic.strategy=fsdp2",
        f"{ARR}.model.path={model_path}",
        f"{ARR}.actor.optim.lr=1e-6",
        f"{ARR}.hybrid_engine=False",
        f"{ARR}.model.use_remove_padding=True",
        f"{ARR}.actor.ppo_mini_batch_size=192", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=32",
        f"{ARR}.actor.use_kl_loss=True", f"{ARR}.actor.kl_loss_coef=0.001", f"{ARR}.actor.kl_loss_type=low_var_kl",
        f"{ARR}.actor.entropy_coeff=0",
        f"{ARR}.model.enable_gradient_checkpointing=True",
        f"{ARR}.actor.fsdp_config.param_offload=False", f"{ARR}.actor.fsdp_config.optimizer_offload=False",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=32",
        f"{ARR}.rollout.tensor_model_parallel_size=2",
        f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.gpu_memory_utilization=0.6", f"{ARR}.rollout.n=5",
        f"{ARR}.rollout.load_format=safetensors", f"{ARR}.rollout.layered_summon=True",
        f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=32", f"{ARR}.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        "trainer.val_before_train=True",
        "trainer.logger=['console','tensorboard']",
        "trainer.project_name=GRPO", "trainer.experiment_name=GRPO-Qwen3-0.6b-gsm8k-fsdp2-one-step-off-2-6",
        "trainer.save_freq=-1", "trainer.test_freq=5", "trainer.total_epochs=2",
        "trainer.nnodes=1", "trainer.n_gpus_per_node=6",
        "rollout.nnodes=1", "rollout.n_gpus_per_node=2",
    ]


APPENDED = ["trainer.gpu_memory_gb=80", "trainer.gpu_model=H100"]


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-0.6b")
    (path / "config.json").write_text(json.dumps(QWEN3_06B))
    return path


def test_entry_point_dry_runs_verls_one_step_off_script_with_both_groups_plans(kk_role, qwen3, tmp_path):
    result = check_main(*one_step_off_script(qwen3), *APPENDED, "trainer.dry_run=true", cwd=tmp_path)
    assert result.code == 0, result.line
    out = result.out
    assert ("two groups (actor_rollout_ref.hybrid_engine=false), device auto: trainer 6 (1 node(s) x 6) with the "
            "trained models, rollout 2 (1 node(s) x 2) with only the engine") in out
    assert "async_training.max_staleness=1: the next batch generates while this one trains" in out
    # 1152 prompts x 5 = 5760 responses: 960 per trainer rank, 2880 per rollout rank.
    assert "960 trained per trainer rank, 2880 generated per rollout rank" in out
    trainer = out[out.index("== trainer group, 6 device(s) (trainer.nnodes=1 x trainer.n_gpus_per_node=6)"):]
    rollout = trainer[trainer.index("== rollout group, 2 device(s) (rollout.nnodes=1 x rollout.n_gpus_per_node=2)"):]
    trainer = trainer[:trainer.index("== rollout group")]

    def row(table: str, phase: str) -> list[str]:
        return next(line for line in table.splitlines() if line.startswith(f"{phase} ")).split()

    assert row(trainer, "generate")[1:] == ["skipped:", "on", "the", "rollout", "group"]
    for phase in ("ref", "update_actor", "update_weights"):
        assert row(trainer, phase)[6:8] == ["0.00", "0.00"], trainer  # no KV cache, no engine
    for phase in ("ref", "update_actor"):
        assert row(rollout, phase)[1:] == ["skipped:", "on", "the", "trainer", "group"]
    # Staleness 1 trains in bypass mode, as verl's recipe config sets it: the engine's log-probs are the old ones.
    assert row(trainer, "old_log_prob")[1:3] == ["skipped:", "rollout_correction.bypass_mode:"], trainer
    # The engine alone: vLLM takes gpu_memory_utilization=0.6 of the whole 80 GB device, 48 GB, its weights,
    # KV cache and activation reserve (the activ column) together; no parameters, gradients or optimizer of a
    # trained model.
    generate = row(rollout, "generate")
    assert generate[1:4] == ["0.00"] * 3 and generate[8] == "48.00", rollout
    # The estimate, from the H100 table: generation on 2 of 8 devices against both groups' phases colocated.
    estimate = next(line for line in out.splitlines() if line.startswith("time plan, async step: max(generate "))
    assert "on 2 rollout device(s), scoring and update" in estimate and "on 6 trainer device(s))" in estimate
    assert "NCCL in one node" in estimate and "colocated on all 8 devices: " in estimate
    assert "colocated sync is expected to be faster" in estimate and "generation on 2 of 8 devices" in estimate


def test_the_scripts_rollout_tensor_parallelism_splits_the_engines_weights_over_the_rollout_group(kk_role, qwen3,
                                                                                                   tmp_path):
    """Its 2 rollout devices are one engine (TP 2, vLLM's external launcher over the rollout group's own
    process group): each holds half the weights, where TP 1 would put a whole engine on each."""
    engines = []
    for tp in (2, 1):
        result = check_main(*one_step_off_script(qwen3), *APPENDED, f"{ARR}.rollout.tensor_model_parallel_size={tp}",
                            "trainer.dry_run=true", cwd=tmp_path)
        assert result.code == 0, result.line
        rollout = result.out[result.out.index("== rollout group"):]
        generate = next(line for line in rollout.splitlines() if line.startswith("generate ")).split()
        engines.append(float(generate[7]))
    assert engines[0] == pytest.approx(engines[1] / 2, abs=0.01), engines
