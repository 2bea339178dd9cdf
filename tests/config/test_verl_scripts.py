"""A run script written for current verl works with only the entry point and paths changed.

The override lists are verl's examples/grpo_trainer/run_qwen2-7b.sh (and keys from its other
current examples), verbatim but for the data and model paths: this repo's kk_role parquet files
and the embedded tiny model. verl's examples/ppo_trainer/run_qwen2-7b_rm.sh (PPO with a reward
model) runs as a bash script, changed the same way (VERL_RM_SCRIPT).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

from logicrl.config import ConfigError, check_overrides, compose, validate
from logicrl.config.cli import for_hydra
from logicrl.config.phases import ARR
from logicrl.config.schema import all_keys
from logicrl.config.verl_keys import VERL_KEYS, take_verl_keys, verl_rule_key
from tests.conftest import ROOT, check_main, need_data, run_main, tail

TRAIN, VAL = ROOT / "data/kk_role/train.parquet", ROOT / "data/kk_role/test.parquet"


def grpo_script() -> list[str]:
    """verl's examples/grpo_trainer/run_qwen2-7b.sh."""
    return [
        "algorithm.adv_estimator=grpo",
        f"data.train_files={TRAIN}", f"data.val_files={VAL}",
        "data.train_batch_size=1024", "data.max_prompt_length=512", "data.max_response_length=1024",
        "data.filter_overlong_prompts=True", "data.truncation='error'",
        f"{ARR}.model.path=embedded:tiny",
        f"{ARR}.actor.optim.lr=1e-6",
        f"{ARR}.model.use_remove_padding=True",
        f"{ARR}.actor.ppo_mini_batch_size=256", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=40",
        f"{ARR}.actor.use_kl_loss=True", f"{ARR}.actor.kl_loss_coef=0.001", f"{ARR}.actor.kl_loss_type=low_var_kl",
        f"{ARR}.actor.entropy_coeff=0",
        f"{ARR}.model.enable_gradient_checkpointing=True",
        f"{ARR}.actor.fsdp_config.param_offload=False", f"{ARR}.actor.fsdp_config.optimizer_offload=False",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=40",
        f"{ARR}.rollout.tensor_model_parallel_size=2",
        f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.gpu_memory_utilization=0.6", f"{ARR}.rollout.n=5",
        f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=40", f"{ARR}.ref.fsdp_config.param_offload=True",
        "algorithm.use_kl_in_reward=False",
        "trainer.critic_warmup=0",
        """trainer.logger=["console","wandb"]""",
        "trainer.project_name='verl_grpo_example_gsm8k'", "trainer.experiment_name='qwen2_7b_function_rm'",
        "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
        "trainer.save_freq=20", "trainer.test_freq=5", "trainer.total_epochs=15",
    ]


def rollout_corr_script() -> list[str]:
    """verl's examples/rollout_correction/run_with_rollout_corr.sh, with rollout_is=token (was sequence)."""
    corr = "algorithm.rollout_correction"
    return [
        f"data.train_files={TRAIN}", f"data.val_files={VAL}",
        "data.max_prompt_length=2048", "data.max_response_length=4096", "data.train_batch_size=128",
        "data.truncation='left'", "algorithm.adv_estimator=rloo", "algorithm.gamma=1.0",
        f"{corr}.rollout_is=token", f"{corr}.rollout_is_threshold=2.0", f"{corr}.rollout_is_batch_normalize=true",
        f"{corr}.rollout_rs=null", f"{corr}.rollout_rs_threshold=null", f"{corr}.bypass_mode=true",
        f"{corr}.loss_type=reinforce",
        f"{ARR}.model.path=embedded:tiny", f"{ARR}.actor.optim.lr=5e-7",
        f"{ARR}.actor.ppo_mini_batch_size=32", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8",
        f"{ARR}.actor.ppo_epochs=1", f"{ARR}.rollout.calculate_log_probs=True",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=8", f"{ARR}.rollout.name=vllm",
        """trainer.logger=["console","wandb"]""", "trainer.project_name=rollout_corr_rloo_example",
        "trainer.experiment_name=rloo_seq_is_pure", "trainer.total_epochs=10",
    ]


def test_verls_rollout_correction_script_validates(kk_role, caplog):
    with caplog.at_level(logging.INFO, logger="logicrl.config"):
        check_overrides(rollout_corr_script() + [f"{ARR}.rollout.mode=async"])
        cfg, _, plan = validate(compose(rollout_corr_script() + [f"{ARR}.rollout.mode=async"]))
    corr = cfg.algorithm.rollout_correction
    assert (corr.rollout_is, corr.rollout_is_threshold, corr.bypass_mode, corr.loss_type) == ("token", 2.0, True,
                                                                                             "reinforce")
    assert not plan.runs("old_log_prob")  # bypass: the engine's log-probs stand in
    said = warnings_of(caplog)
    assert len([w for w in said if w.startswith(f"{ARR}.rollout.mode=async: ")]) == 1
    assert any(w.startswith(f"{ARR}.rollout.calculate_log_probs=True is ignored") for w in said)


# Keys from verl's other current example scripts that tune only verl's internals.
VERL_INTERNALS = [
    "data.return_raw_chat=True",
    f"{ARR}.model.use_shm=True",
    f"{ARR}.model.use_fused_kernels=True",
    f"{ARR}.model.fused_kernel_options.impl_backend=triton",
    f"{ARR}.actor.entropy_from_logits_with_chunking=True",
    f"{ARR}.actor.fsdp_config.fsdp_size=-1",
    f"+{ARR}.actor.fsdp_config.wrap_policy.min_num_params=0",
    f"{ARR}.rollout.load_format=safetensors",
    f"{ARR}.rollout.layered_summon=True",
    f"{ARR}.rollout.mode=sync",
    f"{ARR}.rollout.enable_chunked_prefill=False",
    f"+{ARR}.rollout.engine_kwargs.vllm.disable_mm_preprocessor_cache=True",
]


def warnings_of(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "logicrl.config"]


def test_current_verl_grpo_script_validates(kk_role, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        check_overrides(grpo_script())
        cfg, _, plan = validate(compose(grpo_script()))
    arr = cfg[ARR]
    assert cfg.data.truncation == "filter"  # filter_overlong_prompts wins over truncation='error', as in verl
    assert arr.rollout.tensor_model_parallel_size == 2 and arr.rollout.n == 5
    assert arr.actor.kl_loss_type == "low_var_kl" and cfg.trainer.n_gpus == 8
    assert list(cfg.trainer.logger) == ["console", "wandb"]
    # 1024 prompts x 5 = 5120 responses over 8 ranks; mini-batch 256 prompts = 160 responses per rank, micro 40.
    assert (plan.responses, plan.per_rank_responses, plan.actor.grad_accum) == (5120, 640, 4)
    warned = warnings_of(caplog)
    assert all("\n" not in w for w in warned)
    assert sorted(w.split(" ", 1)[0] for w in warned) == ["data.filter_overlong_prompts=True"]


def test_verl_internal_keys_are_ignored_one_warning_each(kk_role, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        check_overrides(grpo_script() + VERL_INTERNALS)
        validate(compose(grpo_script() + VERL_INTERNALS))
    warned = warnings_of(caplog)
    for override in VERL_INTERNALS:
        key, value = override.lstrip("+").split("=", 1)
        assert len([w for w in warned if w.startswith(f"{key}=")]) == 1, key
        assert f"{key}={value} is ignored: " in " ".join(warned), key


@pytest.mark.parametrize("override, needle", [
    (f"{ARR}.rollout.mode=agent", "set actor_rollout_ref.rollout.mode=sync"),
    (f"{ARR}.rollout.multi_turn.max_user_turns=2", "user turns"),
    ("reward_model.enable=True", "needs reward_model.model.path"),  # a learned reward model needs its checkpoint
    (f"{ARR}.actor.fsdp_config.model_dtype=bfloat16", f"set {ARR}.model.dtype"),
    ("critic.strategy=megatron", "FSDP2 only"),
])
def test_what_would_change_results_is_refused_in_one_line(kk_role, override, needle):
    with pytest.raises(ConfigError) as err:
        validate(compose(grpo_script() + [override]))
    message = str(err.value)
    assert "\n" not in message and message.startswith(override.split("=")[0]) and needle in message, message


@pytest.mark.parametrize("verl, logicrl_key, value", [
    ("critic.model.fsdp_config.param_offload=True", "critic.fsdp_config.param_offload", True),
    (f"{ARR}.rollout.checkpoint_engine.update_weights_bucket_megabytes=4096", f"{ARR}.rollout.update_weights_bucket_mb",
     4096),
    (f"{ARR}.actor.optim.clip_grad=0.5", f"{ARR}.actor.grad_clip", 0.5),
    ("trainer.resume_from_path=/tmp", "trainer.resume_mode", "/tmp"),
])
def test_renamed_keys_land_on_logicrl_keys(data_files, verl, logicrl_key, value, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        cfg, _, _ = validate(compose([*data_files, verl]))
    from omegaconf import OmegaConf

    assert OmegaConf.select(cfg, logicrl_key) == value
    assert any("is verl's spelling: using " + logicrl_key in w for w in warnings_of(caplog))


def test_verl_keys_are_not_schema_keys():
    # A rule shadowing a schema key (or a group) would hide that key from the schema's own checks.
    schema = set(all_keys())
    for key in VERL_KEYS:
        assert key not in schema and not any(s.startswith(key + ".") for s in schema), key


def test_only_verl_keys_are_rewritten_for_hydra():
    argv = ["-m", "data.return_raw_chat=True", "data.shuffle=false", f"+{ARR}.rollout.engine_kwargs.x=1",
            "-cn", "data.use_shm=True", f"{ARR}.rollout.mode=sync,async"]
    assert for_hydra(argv) == ["-m", "++data.return_raw_chat=True", "data.shuffle=false",
                               f"+{ARR}.rollout.engine_kwargs.x=1", "-cn", "data.use_shm=True",
                               f"++{ARR}.rollout.mode=sync,async"]
    assert verl_rule_key("global_profiler.global_tool_config.nsys.discrete") == "global_profiler"


def test_a_recipe_like_config_without_verl_keys_is_untouched(data_files):
    cfg = compose(data_files)
    assert take_verl_keys(cfg) is cfg


def deepseek_sp2_script() -> list[str]:
    """verl's examples/ppo_trainer/run_deepseek7b_llm_sp2.sh (GAE, Ulysses SP 2 for actor and critic, TP 4
    rollout on 8 GPUs), verbatim but for the paths: kk_role's data and Qwen2.5-7B's shape (deepseek-llm-7b-chat
    is not here; its 32 heads and 32 KV heads would split the same way)."""
    shape = ROOT / "logicrl/memory/shapes/qwen2.5-7b"
    return [
        "algorithm.adv_estimator=gae", f"data.train_files={TRAIN}", f"data.val_files={VAL}",
        "data.train_batch_size=1024", "data.max_prompt_length=512", "data.max_response_length=512",
        "data.filter_overlong_prompts=True", "data.truncation='error'", f"{ARR}.model.path={shape}",
        f"{ARR}.actor.optim.lr=1e-6", f"{ARR}.model.use_remove_padding=True", f"{ARR}.actor.ppo_mini_batch_size=256",
        f"{ARR}.actor.ppo_micro_batch_size_per_gpu=32", f"{ARR}.actor.ulysses_sequence_parallel_size=2",
        f"{ARR}.model.enable_gradient_checkpointing=True", f"{ARR}.actor.fsdp_config.param_offload=False",
        f"{ARR}.actor.fsdp_config.optimizer_offload=False", f"{ARR}.actor.use_kl_loss=False",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=64", f"{ARR}.rollout.tensor_model_parallel_size=4",
        f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.gpu_memory_utilization=0.6", "critic.optim.lr=1e-5",
        "critic.ulysses_sequence_parallel_size=2", "critic.model.use_remove_padding=True", f"critic.model.path={shape}",
        "critic.model.enable_gradient_checkpointing=True", "critic.ppo_micro_batch_size_per_gpu=64",
        "critic.model.fsdp_config.param_offload=False", "critic.model.fsdp_config.optimizer_offload=False",
        "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0", """trainer.logger=["console","wandb"]""",
        "trainer.project_name='verl_example_gsm8k'", "trainer.experiment_name='deepseek_llm_7b_function_rm_sp2'",
        "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
        "trainer.total_epochs=15",
    ]


def test_verl_sp2_script_plans_with_sequence_parallelism_honoured(kk_role):
    from logicrl.preflight.memory import check_memory

    overrides = [*deepseek_sp2_script(), "trainer.gpu_memory_gb=80", "trainer.device=cuda"]
    check_overrides(overrides)
    cfg, spec, plan = validate(compose(overrides))
    assert cfg[ARR].actor.ulysses_sequence_parallel_size == cfg.critic.ulysses_sequence_parallel_size == 2
    stage = check_memory(cfg, spec, plan)  # fits on 80 GB: raises otherwise
    assert dict(stage.memory.inputs.sequence_parallel) == {"old_log_prob": 2, "values": 2,  # no ref: no KL
                                                           "update_critic": 2, "update_actor": 2}
    assert "sequence parallelism (Ulysses): old_log_prob splits each row over 2 ranks" in stage.table


# ---------------------------------------------------------------- the entry point
# The two dry runs are main_ppo.py's in-process (check_main); the sweep launches it.
def test_entry_point_dry_runs_a_current_verl_script(kk_role, tmp_path):
    result = check_main(*grpo_script(), *VERL_INTERNALS, "trainer.dry_run=true", "trainer.gpu_memory_gb=80",
                        cwd=tmp_path)
    assert result.code == 0, result.line
    out = result.out + result.err
    assert "data.return_raw_chat=True is ignored" in out
    assert "data.filter_overlong_prompts=True is verl's spelling: using data.truncation=filter" in out
    assert "1024 prompts x n=5 = 5120 responses" in out


def test_entry_point_dry_runs_verls_rollout_correction_script_with_async_rollout(kk_role, tmp_path):
    result = check_main(*rollout_corr_script(), f"{ARR}.rollout.mode=async", "trainer.dry_run=true",
                        "trainer.gpu_memory_gb=80", cwd=tmp_path)
    assert result.code == 0, result.line
    out = result.out + result.err
    assert f"{ARR}.rollout.mode=async: single-turn rollout samples the same distribution" in out
    assert "bypass_mode: the engine's log-probs are the old log-probs" in out  # the plan skips old_log_prob


@pytest.mark.integration
def test_multirun_sweeps_with_verl_keys(kk_role, tmp_path):
    # A sweep over a verl-only key too: each of the 4 jobs composes with it and drops it.
    result = run_main("-m", *grpo_script(), "data.return_raw_chat=True,False", f"{ARR}.rollout.n=5,10",
                      "trainer.dry_run=true", "trainer.gpu_memory_gb=80", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("1024 prompts x n=5 = 5120 responses") == 2
    assert result.stdout.count("1024 prompts x n=10 = 10240 responses") == 2
    assert result.stdout.count("data.return_raw_chat=False is ignored") == 2


def test_verl_keys_in_a_yaml_overlay_are_handled_too(data_files, caplog):
    # A recipe or a curriculum stage may carry them: they reach validate like command-line ones.
    from logicrl.config.stages import build_stages

    stages = ("curriculum.stages=[{name: a, overrides: {data: {filter_overlong_prompts: true, return_raw_chat: true}}},"
              " {name: b, overrides: {}}]")
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        a, b = build_stages(compose([*data_files, stages]), [])
    assert (a.cfg.data.truncation, b.cfg.data.truncation) == ("filter", "error")
    assert len([w for w in warnings_of(caplog) if w.startswith("data.return_raw_chat=True is ignored")]) == 1


# ---------------------------------------------------------------- a verl PPO script with a reward model, run by bash
# verl's examples/ppo_trainer/run_qwen2-7b_rm.sh at volcengine/verl b178a3cd56f58b2d502255daba591e92833930a7
# (2026-01-29), from its data paths to its last line, run by bash as verl's users run it. Changed: the
# entry point (`python3 -m verl.trainer.main_ppo`), and $HOME/data/{gsm8k,math} and $HOME/models/* for
# local paths ($DATA, $SHAPES, $RM below). The huggingface-cli downloads above it are left out.
VERL_RM_SCRIPT = r"""
gsm8k_train_path=$DATA/kk_role/train.parquet
gsm8k_test_path=$DATA/kk_role/test.parquet
math_train_path=$DATA/kk_role_5ppl/train.parquet
math_test_path=$DATA/kk_role_5ppl/test.parquet

train_files="['$gsm8k_train_path', '$math_train_path']"
test_files="['$gsm8k_test_path', '$math_test_path']"

"$PYTHON" "$LOGICRL/main_ppo.py" \
    algorithm.adv_estimator=gae \
    data.train_files="$train_files" \
    data.val_files="$test_files" \
    data.train_batch_size=1024 \
    data.max_prompt_length=1024 \
    data.max_response_length=512 \
    data.filter_overlong_prompts=True \
    data.truncation='error' \
    data.return_raw_chat=True \
    actor_rollout_ref.model.path="$SHAPES/qwen2.5-7b" \
    actor_rollout_ref.actor.optim.lr=1e-6 \
    actor_rollout_ref.model.use_remove_padding=True \
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1 \
    actor_rollout_ref.actor.ppo_mini_batch_size=256 \
    actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.actor.use_kl_loss=False \
    actor_rollout_ref.model.enable_gradient_checkpointing=True \
    actor_rollout_ref.actor.fsdp_config.param_offload=False \
    actor_rollout_ref.actor.fsdp_config.optimizer_offload=False \
    actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16 \
    actor_rollout_ref.rollout.tensor_model_parallel_size=1 \
    actor_rollout_ref.rollout.name=vllm \
    actor_rollout_ref.rollout.gpu_memory_utilization=0.6 \
    critic.optim.lr=1e-5 \
    critic.model.use_remove_padding=True \
    critic.optim.lr_warmup_steps_ratio=0.05 \
    critic.model.path="$SHAPES/qwen2.5-7b" \
    critic.model.enable_gradient_checkpointing=True \
    critic.ppo_micro_batch_size_per_gpu=32 \
    critic.model.fsdp_config.param_offload=False \
    critic.model.fsdp_config.optimizer_offload=False \
    reward_model.enable=True \
    reward_model.model.path="$RM" \
    reward_model.use_reward_loop=True \
    reward_model.rollout.name=vllm \
    reward_model.rollout.gpu_memory_utilization=0.8 \
    reward_model.rollout.tensor_model_parallel_size=1 \
    reward_model.rollout.prompt_length=2048 \
    reward_model.rollout.response_length=1024 \
    reward_model.num_workers=8 \
    algorithm.use_kl_in_reward=False \
    trainer.critic_warmup=0 \
    trainer.logger='["console","wandb"]' \
    trainer.project_name='verl_example' \
    trainer.val_before_train=False \
    trainer.experiment_name='Qwen2-7B-Instruct_hybrid_rm' \
    trainer.n_gpus_per_node=8 \
    trainer.nnodes=1 \
    trainer.save_freq=20 \
    trainer.test_freq=5 \
    trainer.total_epochs=15 $@
"""


def llama3_rm_shape(path):
    """A config-only stand-in for sfairXC/FsfairX-LLaMA3-RM-v0.1, a Llama-3-8B-Instruct with a one-label
    head: logicrl/memory/shapes/llama-3.1-8b (the same layers) at Llama-3's 8k positions, as a
    LlamaForSequenceClassification. A dry run plans from its shape and reads no weights."""
    config = json.loads((ROOT / "logicrl/memory/shapes/llama-3.1-8b/config.json").read_text())
    config.pop("rope_scaling")
    config.update(architectures=["LlamaForSequenceClassification"], max_position_embeddings=8192,
                  id2label={"0": "LABEL_0"})
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.integration
def test_entry_point_dry_runs_verl_ppo_script_with_a_reward_model(kk_role, tmp_path):
    need_data("kk_role_5ppl")
    rm, ckpt = llama3_rm_shape(tmp_path / "rm"), tmp_path / "ckpt"
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "PYTHON": sys.executable, "LOGICRL": str(ROOT),
           "DATA": str(ROOT / "data"), "SHAPES": str(ROOT / "logicrl/memory/shapes"), "RM": str(rm)}
    # The script's trailing $@: what a user appends on the command line.
    extra = ["trainer.dry_run=true", "trainer.gpu_memory_gb=80", f"trainer.default_local_dir={ckpt}"]
    result = subprocess.run(["bash", "-c", VERL_RM_SCRIPT, "run_qwen2-7b_rm.sh", *extra], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, tail(result)
    out = result.stdout + result.stderr
    # verl's PPO with a reward model: a critic, no reference, the learned score as the reward.
    assert "algorithm  gae, rollout vllm, critic yes, reference no" in out
    assert f"reward     reward model {rm}, per rank 128 forwards of <= 8; reward.combine.mode=model" in out
    # The memory plan counts the reward model's own phase (not skipped) between generate and old_log_prob.
    table = out[out.index("memory plan per device"):].splitlines()
    # Below the attention line and the column header.
    phases = [line.split()[0] for line in table[3:] if line and not line.startswith("note:")]
    assert phases[:3] == ["generate", "reward_model", "old_log_prob"], table
    assert "skipped" not in next(line for line in table if line.startswith("reward_model")), table
    # verl's reward-loop serving keys are ignored, one line each (the reward_model.rollout.* subtree in one).
    ignored = [line for line in out.splitlines() if "is ignored: how verl serves the reward model" in line]
    assert len(ignored) == 3, ignored
    for key in ("reward_model.use_reward_loop=True", "reward_model.num_workers=8", "reward_model.rollout.name=vllm"):
        assert any(f"- {key}" in line for line in ignored), key
    assert not ckpt.exists()  # a dry run makes no directory
    # The script never sets rollout.n: verl's default is 1, logicrl's 8, and that is said once.
    said = [line for line in out.splitlines() if f"{ARR}.rollout.n=8 is logicrl's default (verl's is 1)" in line]
    assert len(said) == 1, said


@pytest.mark.parametrize("overrides, warned", [
    (["++reward_model.use_reward_loop=True"], True),  # a verl script that leaves rollout.n alone
    (["++reward_model.use_reward_loop=True", f"{ARR}.rollout.n=8"], False),  # chose 8 on the command line
    (["++reward_model.use_reward_loop=True", "+recipe=stage1"], False),  # a recipe chose it
    (["++reward_model.use_reward_loop=True", "curriculum.stages.0.overrides.actor_rollout_ref.rollout.n=4"], False),
    (None, False),  # not under Hydra (composed directly): the command line is unknown
])
def test_an_unset_rollout_n_in_a_verl_script_is_said(overrides, warned, caplog):
    from logicrl.config.verl_keys import warn_unset_rollout_n

    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        warn_unset_rollout_n(compose([]), overrides)
    assert (f"{ARR}.rollout.n=8 is logicrl's default (verl's is 1)" in " ".join(warnings_of(caplog))) == warned


def test_rollout_n_of_1_from_anywhere_is_verls_batch_already(caplog):
    from logicrl.config.verl_keys import warn_unset_rollout_n

    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        warn_unset_rollout_n(compose([f"{ARR}.rollout.n=1"]), ["++reward_model.use_reward_loop=True"])
    assert not warnings_of(caplog)


# ---------------------------------------------------------------- keys verl's current scripts set
def cispo_script() -> list[str]:
    """verl's examples/cispo_trainer/run_qwen3_8b_fsdp.sh at verl-project/verl 1dda039b, its defaults substituted
    and the paths changed (kk_role's data, the embedded tiny model); its last array, RAY, included."""
    return [
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=False",
        f"data.train_files={TRAIN}", f"data.val_files={VAL}",
        "data.train_batch_size=1024", "data.max_prompt_length=1024", "data.max_response_length=2048",
        "data.filter_overlong_prompts=True", "data.truncation='error'",
        f"{ARR}.model.path=embedded:tiny", f"{ARR}.model.use_remove_padding=True",
        f"{ARR}.model.enable_gradient_checkpointing=True",
        f"{ARR}.actor.policy_loss.loss_mode=cispo", f"{ARR}.actor.clip_ratio_low=10",
        f"{ARR}.actor.clip_ratio_high=0.2", f"{ARR}.actor.optim.lr=1e-6", f"{ARR}.actor.ppo_mini_batch_size=256",
        f"{ARR}.actor.use_dynamic_bsz=True", f"{ARR}.actor.ppo_max_token_len_per_gpu=24576",
        f"{ARR}.actor.use_kl_loss=True", f"{ARR}.actor.kl_loss_coef=0.001", f"{ARR}.actor.kl_loss_type=low_var_kl",
        f"{ARR}.actor.entropy_coeff=0", f"{ARR}.actor.fsdp_config.param_offload=False",
        f"{ARR}.actor.fsdp_config.optimizer_offload=False",
        f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.tensor_model_parallel_size=2",
        f"{ARR}.rollout.gpu_memory_utilization=0.6", f"{ARR}.rollout.n=5",
        f"{ARR}.rollout.log_prob_use_dynamic_bsz=True",
        f"{ARR}.rollout.log_prob_max_token_len_per_gpu=24576",
        f"{ARR}.ref.log_prob_use_dynamic_bsz=True", f"{ARR}.ref.log_prob_max_token_len_per_gpu=24576",
        f"{ARR}.ref.fsdp_config.param_offload=True",
        "trainer.balance_batch=True", "trainer.critic_warmup=0", """trainer.logger=["console","wandb"]""",
        "trainer.project_name=verl_cispo_gsm8k_math", "trainer.experiment_name=qwen3_8b_vllm_fsdp",
        "trainer.n_gpus_per_node=8", "trainer.nnodes=1", "trainer.save_freq=20", "trainer.test_freq=5",
        "trainer.total_epochs=15",
        "ray_kwargs.ray_init.runtime_env.py_executable=uv -v run --frozen --all-packages --extra vllm --extra fsdp",
    ]


def test_verls_cispo_script_validates_with_no_lower_clip(kk_role, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        check_overrides(cispo_script())
        cfg, _, _ = validate(compose(cispo_script()))
    actor = cfg[ARR].actor
    assert (actor.policy_loss.loss_mode, actor.clip_ratio_low, actor.clip_ratio_high) == ("cispo", 10, 0.2)
    said = [w for w in warnings_of(caplog) if w.startswith("ray_kwargs.")]
    assert said == ["ray_kwargs.ray_init.runtime_env.py_executable=uv -v run --frozen --all-packages --extra vllm "
                    "--extra fsdp is ignored: how verl's launcher starts Ray (runtime env, interpreter, CPUs, GPUs); "
                    "logicrl starts its own Ray for trainer.n_gpus ranks, or joins trainer.ray_address"]


def test_a_lower_clip_of_one_or_more_is_refused_outside_cispo(data_files):
    with pytest.raises(ConfigError, match=r"clip_ratio_low=10.0 must be below 1 .*only policy_loss.loss_mode=cispo"):
        validate(compose([*data_files, f"{ARR}.actor.clip_ratio_low=10"]))


@pytest.mark.parametrize("override", [
    "ray_kwargs.ray_init.runtime_env.py_executable=null",
    "+ray_kwargs.ray_init.num_gpus=4",
    "+ray_kwargs.ray_init.runtime_env.env_vars.TRANSFER_QUEUE_ENABLE=1",
])
def test_ray_kwargs_are_ignored_in_one_line(data_files, override, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        check_overrides([*data_files, override])
        cfg = validate(compose([*data_files, override]))[0]
    assert "ray_kwargs" not in cfg
    said = [w for w in warnings_of(caplog) if w.startswith("ray_kwargs.")]
    assert len(said) == 1 and said[0].startswith(override.lstrip("+").replace("=null", "=None") + " is ignored: ")


@pytest.mark.parametrize("verl, logicrl_key, value", [
    ("critic.fsdp.param_offload=True", "critic.fsdp_config.param_offload", True),
    ("critic.fsdp.optimizer_offload=True", "critic.fsdp_config.optimizer_offload", True),
    (f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size=2", f"{ARR}.actor.ulysses_sequence_parallel_size", 2),
    (f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size=2", f"{ARR}.ref.ulysses_sequence_parallel_size", 2),
    ("critic.fsdp.ulysses_sequence_parallel_size=2", "critic.ulysses_sequence_parallel_size", 2),
    (f"+{ARR}.actor.policy_loss.tau_pos=1.5", f"{ARR}.actor.tau_pos", 1.5),
    (f"+{ARR}.actor.policy_loss.tau_neg=2.0", f"{ARR}.actor.tau_neg", 2.0),
])
def test_verls_current_spellings_land_on_logicrl_keys(data_files, verl, logicrl_key, value, caplog):
    from omegaconf import OmegaConf

    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        check_overrides([*data_files, verl])
        cfg = take_verl_keys(compose([*data_files, verl]))
    assert OmegaConf.select(cfg, logicrl_key) == value
    assert any("is verl's spelling: using " + logicrl_key in w for w in warnings_of(caplog))


def test_the_sp2_script_in_verls_current_spelling_plans_as_before(kk_role):
    # run_qwen3_8b_fsdp.sh's NPU branch spells the group size under fsdp_config (the role-level key is deprecated).
    current = [o.replace(f"{ARR}.actor.ulysses_sequence_parallel_size",
                         f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size")
               .replace("critic.ulysses_sequence_parallel_size", "critic.fsdp.ulysses_sequence_parallel_size")
               .replace("critic.model.fsdp_config.", "critic.fsdp.") for o in deepseek_sp2_script()]
    assert current != deepseek_sp2_script()
    check_overrides(current)
    cfg, _, _ = validate(compose(current))
    assert cfg[ARR].actor.ulysses_sequence_parallel_size == cfg.critic.ulysses_sequence_parallel_size == 2
    assert not cfg.critic.fsdp_config.param_offload


def test_an_absolute_warm_up_is_verls_key_and_overrides_the_ratio(data_files):
    cfg = validate(compose([*data_files, f"{ARR}.actor.optim.lr_warmup_steps=10",
                            f"{ARR}.actor.optim.lr_warmup_steps_ratio=0.5", "critic.optim.lr_warmup_steps=0"]))[0]
    assert cfg[ARR].actor.optim.lr_warmup_steps == 10 and cfg.critic.optim.lr_warmup_steps == 0
    assert compose(data_files)[ARR].actor.optim.lr_warmup_steps == -1  # verl's default: the ratio decides
    with pytest.raises(ConfigError, match="lr_warmup_steps"):
        validate(compose([*data_files, f"{ARR}.actor.optim.lr_warmup_steps=-2"]))
