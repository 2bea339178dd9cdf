"""A Logic-RL / verl run script works with only the entry point changed."""

import logging

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR


def logic_rl_overrides(train, val):
    """Logic-RL's main_grpo.sh (3-person stage, 4 GPUs), verbatim but for the paths."""
    return [
        "algorithm.adv_estimator=reinforce_plus_plus",
        f"data.train_files={train}", f"data.val_files={val}",
        "data.train_batch_size=8", "data.val_batch_size=8",
        "data.max_prompt_length=400", "data.max_response_length=4096",
        f"{ARR}.actor.optim.lr=3e-7",
        f"{ARR}.model.use_remove_padding=True",
        f"{ARR}.actor.ppo_mini_batch_size=256",
        f"{ARR}.actor.ppo_micro_batch_size=64",
        f"{ARR}.actor.use_kl_loss=True", f"{ARR}.actor.kl_loss_coef=0.001", f"{ARR}.actor.kl_loss_type=low_var_kl",
        f"{ARR}.model.enable_gradient_checkpointing=True",
        f"{ARR}.actor.fsdp_config.param_offload=True",
        f"{ARR}.actor.fsdp_config.grad_offload=True",
        f"{ARR}.actor.fsdp_config.optimizer_offload=True",
        f"{ARR}.rollout.log_prob_micro_batch_size=160",
        f"{ARR}.rollout.tensor_model_parallel_size=1",
        f"{ARR}.rollout.name=vllm",
        f"{ARR}.rollout.gpu_memory_utilization=0.6",
        f"{ARR}.rollout.n=16",
        f"{ARR}.ref.log_prob_micro_batch_size=160",
        f"{ARR}.ref.fsdp_config.param_offload=True",
        "algorithm.kl_ctrl.kl_coef=0.001",
        "trainer.critic_warmup=0",
        "trainer.logger=['wandb']",
        "trainer.project_name=GRPO_logic_KK",
        "trainer.experiment_name=Qwen-7B",
        "trainer.n_gpus_per_node=4",
        "trainer.nnodes=1",
        "trainer.default_local_dir=checkpoints/kk",
        "trainer.default_hdfs_dir=null",
        "trainer.save_freq=10",
        "trainer.test_freq=10",
        "trainer.total_epochs=5",
    ]


@pytest.fixture
def paths(data_files):
    return [f.split("=", 1)[1] for f in data_files[:2]]


def test_logic_rl_script_composes_and_converts(paths, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        cfg, _, plan = validate(compose(logic_rl_overrides(*paths)))
    arr = cfg[ARR]
    assert cfg.trainer.n_gpus == 4
    # global micro-batches (responses over all ranks) become per-rank ones: 64/4, 160/4
    assert arr.actor.ppo_micro_batch_size_per_gpu == 16 and arr.actor.ppo_micro_batch_size is None
    assert arr.rollout.log_prob_micro_batch_size_per_gpu == 40
    assert arr.ref.log_prob_micro_batch_size_per_gpu == 40
    # FSDP2 offloads gradients with parameters: grad_offload is folded into param_offload
    assert arr.actor.fsdp_config.param_offload and arr.actor.fsdp_config.grad_offload is None
    assert list(cfg.trainer.logger) == ["wandb"]
    # Packed sequences are honoured now, and the critic follows the actor's setting.
    assert arr.model.use_remove_padding and cfg.critic.model.use_remove_padding
    assert arr.actor.ppo_mini_batch_size == 8  # 256 clamped to the batch of 8 prompts
    # 8 prompts x 16 = 128 responses, 32 per rank, 2 micro-batches of 16
    assert (plan.responses, plan.per_rank_responses, plan.actor.grad_accum) == (128, 32, 2)
    warned = " ".join(r.getMessage() for r in caplog.records)
    for key in ("ppo_micro_batch_size=64", "rollout.log_prob_micro_batch_size=160", "grad_offload",
                "ppo_mini_batch_size=256"):
        assert key in warned


def test_every_warning_is_one_line(paths, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        validate(compose(logic_rl_overrides(*paths) + ["trainer.default_hdfs_dir=hdfs://x"]))
    assert caplog.records and all("\n" not in r.getMessage() for r in caplog.records)
    assert any("default_hdfs_dir=hdfs://x is ignored" in r.getMessage() for r in caplog.records)


def test_logger_as_bare_string_becomes_a_list(data_files):
    cfg, _, _ = validate(compose([*data_files, "trainer.logger=console"]))
    assert list(cfg.trainer.logger) == ["console"]


def test_grad_offload_false_changes_nothing(data_files):
    cfg, _, _ = validate(compose([*data_files, f"{ARR}.actor.fsdp_config.grad_offload=false"]))
    assert cfg[ARR].actor.fsdp_config.param_offload is False


def test_verl_custom_reward_function_maps_to_reward_custom(data_files, tmp_path):
    fn = tmp_path / "my_reward.py"
    fn.write_text("def score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n")
    cfg, _, _ = validate(compose([*data_files, f"custom_reward_function.path={fn}",
                                  "custom_reward_function.name=score"]))
    assert (cfg.reward.custom.path, cfg.reward.custom.name) == (str(fn), "score")


def test_n_gpus_from_nodes(data_files):
    cfg, _, _ = validate(compose([*data_files, "trainer.n_gpus_per_node=2", "trainer.nnodes=2"]))
    assert cfg.trainer.n_gpus == 4
    cfg, _, _ = validate(compose([*data_files, "trainer.n_gpus=4", "trainer.nnodes=2"]))
    assert cfg.trainer.n_gpus_per_node == 2


def test_global_micro_batch_must_split(data_files):
    with pytest.raises(ConfigError, match="trainer.n_gpus=4"):
        validate(compose([*data_files, "trainer.n_gpus=4", f"{ARR}.rollout.log_prob_micro_batch_size=6"]))


def test_tensor_parallel_is_kept_and_checked_up_front(data_files):
    # vLLM engines spanning TP groups of consecutive ranks (workers/rollout/vllm_tp.py).
    cfg, _, _ = validate(compose([*data_files, "trainer.n_gpus=2", f"{ARR}.rollout.tensor_model_parallel_size=2"]))
    assert cfg[ARR].rollout.tensor_model_parallel_size == 2
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size=2 must divide trainer.n_gpus=3"):
        validate(compose([*data_files, "trainer.n_gpus=3", f"{ARR}.rollout.tensor_model_parallel_size=2"]))
    with pytest.raises(ConfigError, match=r"tensor_model_parallel_size=2 needs actor_rollout_ref.rollout.name=vllm"):
        validate(compose([*data_files, "trainer.n_gpus=2", f"{ARR}.rollout.name=hf",
                          f"{ARR}.rollout.tensor_model_parallel_size=2"]))
    # The embedded tiny model has 2 attention heads.
    with pytest.raises(ConfigError, match=r"must divide the model's num_attention_heads=2"):
        validate(compose([*data_files, "trainer.n_gpus=4", f"{ARR}.rollout.tensor_model_parallel_size=4"]))
