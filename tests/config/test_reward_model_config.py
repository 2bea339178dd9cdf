"""The reward_model group and reward.combine: a verl PPO script with a reward model validates, and
each refusal is one line naming the key and the fix. Checkpoints here are config.json only: the
checks read no weights for a sequence classifier."""

from __future__ import annotations

import logging

import pytest

from logicrl.config import ConfigError, check_overrides, compose, validate
from logicrl.config.phases import ARR
from logicrl.config.summary import summarize
from tests.config.conftest import write_checkpoint
from tests.conftest import ROOT

TRAIN, VAL = ROOT / "data/kk_role/train.parquet", ROOT / "data/kk_role/test.parquet"


@pytest.fixture
def rm_path(tmp_path):
    return write_checkpoint(tmp_path / "rm")


def refusal(overrides) -> str:
    with pytest.raises(ConfigError) as err:
        check_overrides(overrides)  # as main_ppo does first: unknown keys are named here
        validate(compose(overrides))
    message = str(err.value)
    assert "\n" not in message, message
    return message


def test_off_by_default_and_nothing_changes(data_files):
    cfg, _, _ = validate(compose(data_files))
    assert cfg.reward_model.enable is False and cfg.reward_model.model.path is None
    assert cfg.reward.combine.mode == "model"


def test_a_reward_model_validates_with_its_lengths_and_rule(data_files, rm_path):
    cfg, _, _ = validate(compose([*data_files, "reward_model.enable=true", f"reward_model.model.path={rm_path}",
                                  "reward.combine.mode=weighted", "reward.combine.weights.rule=0.5",
                                  "reward.combine.by_data_source={kk_role: rule}"]))
    assert cfg.reward_model.model.input_tokenizer == cfg[ARR].model.path  # verl's default: the actor's
    assert cfg.reward_model.max_length is None


@pytest.mark.parametrize("overrides, needles", [
    (["reward_model.enable=true"], ["reward_model.enable=true needs reward_model.model.path", "or embedded:tiny_rm"]),
    # The embedded model named is the reward model, not the policy (embedded:tiny cannot score).
    (["reward_model.enable=true", "reward_model.model.path=/no/such/rm"],
     ["reward_model.model.path=/no/such/rm is not a local directory", "or use embedded:tiny_rm"]),
    (["reward_model.max_length=100"], ["reward_model.max_length=100 is shorter than data.max_prompt_length=",
                                       "set it >= "]),
    (["reward_model.model.input_tokenizer=/no/such/tok"], ["reward_model.model.input_tokenizer=/no/such/tok",
                                                           "null to score the actor's tokens"]),
    (["reward.combine.mode=weightd"], ["reward.combine.mode=weightd is not one of: model, rule, weighted"]),
    (["reward.combine.weights.modle=1"],
     ["`reward.combine.weights.modle`", "did you mean `reward.combine.weights.model`"]),
    (["reward.combine.by_data_source={kk_rol: rule}"],
     ["reward.combine.by_data_source.kk_rol", "did you mean kk_role?"]),
    (["reward.combine.by_data_source={kk_role: {modle: 1}}"],
     ["reward.combine.by_data_source.kk_role.modle is not a weight",
      "did you mean reward.combine.by_data_source.kk_role.model?"]),
    (["reward.combine.by_data_source={kk_role: rules}"], ["reward.combine.by_data_source.kk_role=rules is not one of",
                                                          "did you mean rule?"]),
    (["reward.combine.by_data_source=kk_role"], ["reward.combine.by_data_source must map data_source names"]),
    (["reward.combine.weights.rule=0.5"], ["reward.combine.weights (model=1.0, rule=0.5) are read only by",
                                           "set reward.combine.mode=weighted"]),
    (["reward.combine.mode=weighted", "reward.combine.weights.model=0", "reward.combine.weights.rule=0"],
     ["reward.combine.weights: model=0 and rule=0"]),
])
def test_refusals_name_key_and_fix(data_files, rm_path, overrides, needles):
    enabled = [] if overrides == ["reward_model.enable=true"] or "reward_model.model.path=/no/such/rm" in overrides \
        else ["reward_model.enable=true", f"reward_model.model.path={rm_path}"]
    message = refusal([*data_files, *enabled, *overrides])
    for needle in needles:
        assert needle in message, message


def test_a_reward_model_path_without_enable_is_said(data_files, rm_path, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl"):
        validate(compose([*data_files, f"reward_model.model.path={rm_path}"]))
    [record] = [r for r in caplog.records if "reward_model" in r.getMessage()]
    assert record.getMessage() == (f"reward_model.model.path={rm_path} is set but reward_model.enable=false: the "
                                   "reward model is not loaded and rules alone score; set reward_model.enable=true to "
                                   "use it")


def test_negative_combine_weights_are_said(data_files, rm_path, caplog):
    enabled = [*data_files, "reward_model.enable=true", f"reward_model.model.path={rm_path}"]
    with caplog.at_level(logging.WARNING, logger="logicrl"):
        validate(compose([*enabled, "reward.combine.mode=weighted", "reward.combine.weights.rule=-1",
                          "reward.combine.by_data_source={kk_role: {model: -0.5}}"]))
    [record] = [r for r in caplog.records if "reward.combine" in r.getMessage()]
    # kk_role's rule weight, inherited from reward.combine.weights, is said once.
    assert record.getMessage().startswith("reward.combine.weights.rule=-1, reward.combine.by_data_source.kk_role."
                                          "model=-0.5 < 0: a higher score then lowers the reward")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="logicrl"):
        validate(compose([*enabled, "reward.combine.mode=weighted", "reward.combine.weights.rule=0.5"]))
    assert "reward.combine" not in caplog.text


def test_a_combine_rule_without_a_reward_model_is_refused(data_files):
    message = refusal([*data_files, "reward.combine.mode=weighted"])
    assert message.startswith("reward.combine.mode=weighted mixes in a reward model's score, but "
                              "reward_model.enable=false: set reward_model.enable=true"), message


@pytest.mark.parametrize("architecture, labels, needle", [
    ("Qwen2ForCausalLM", 1, "Qwen2ForCausalLM is neither a sequence classifier with one label "
                            "(*ForSequenceClassification) nor a decoder with a trained value head"),
    ("Qwen2ForSequenceClassification", 2,
     "Qwen2ForSequenceClassification has 2 labels; a reward model scores with one"),
])
def test_a_checkpoint_that_cannot_score_is_refused(data_files, tmp_path, architecture, labels, needle):
    path = write_checkpoint(tmp_path / "not_rm", architecture, labels)
    message = refusal([*data_files, "reward_model.enable=true", f"reward_model.model.path={path}"])
    assert message.startswith(f"reward_model.model.path={path}: {needle}"), message


def test_a_reward_model_with_a_shorter_context_is_refused(data_files, tmp_path):
    path = write_checkpoint(tmp_path / "short_rm", max_positions=256)
    message = refusal([*data_files, "reward_model.enable=true", f"reward_model.model.path={path}",
                       "data.max_prompt_length=200", "data.max_response_length=100"])
    assert message.startswith("data.max_prompt_length + data.max_response_length = 300 (reward_model.max_length=null) "
                              "exceeds the reward model's max_position_embeddings=256"), message
    message = refusal([*data_files, "reward_model.enable=true", f"reward_model.model.path={path}",
                       "reward_model.max_length=4096"])
    assert message.startswith("reward_model.max_length=4096 exceeds the reward model's max_position_embeddings=256")


def test_verl_global_micro_batch_is_converted(data_files, rm_path):
    cfg, _, _ = validate(compose([*data_files, "trainer.n_gpus=4", "reward_model.enable=true",
                                  f"reward_model.model.path={rm_path}", "reward_model.micro_batch_size=64"]))
    assert cfg.reward_model.micro_batch_size_per_gpu == 16 and cfg.reward_model.micro_batch_size is None


# ---------------------------------------------------------------- a verl PPO script with a reward model
def verl_rm_script(rm: str) -> list[str]:
    """verl's examples/ppo_trainer/run_qwen2-7b_rm.sh with the reward-model keys of
    run_qwen2.5-3b_rm_reward_loop_colocate.sh, verbatim but for the data and model paths."""
    return [
        "algorithm.adv_estimator=gae",
        f"data.train_files={TRAIN}", f"data.val_files={VAL}",
        "data.train_batch_size=1024", "data.max_prompt_length=1024", "data.max_response_length=512",
        "data.filter_overlong_prompts=True", "data.truncation='error'", "data.return_raw_chat=True",
        f"{ARR}.model.path=embedded:tiny",
        f"{ARR}.actor.optim.lr=1e-6", f"{ARR}.model.use_remove_padding=True",
        f"{ARR}.actor.optim.lr_warmup_steps_ratio=0.1",
        f"{ARR}.actor.ppo_mini_batch_size=256", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16",
        f"{ARR}.actor.use_kl_loss=False", f"{ARR}.model.enable_gradient_checkpointing=True",
        f"{ARR}.actor.fsdp_config.param_offload=False", f"{ARR}.actor.fsdp_config.optimizer_offload=False",
        f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=16", f"{ARR}.rollout.tensor_model_parallel_size=1",
        f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.gpu_memory_utilization=0.6",
        "critic.optim.lr=1e-5", "critic.model.use_remove_padding=True", "critic.optim.lr_warmup_steps_ratio=0.05",
        "critic.model.path=embedded:tiny", "critic.model.enable_gradient_checkpointing=True",
        "critic.ppo_micro_batch_size_per_gpu=32",
        "critic.model.fsdp_config.param_offload=False", "critic.model.fsdp_config.optimizer_offload=False",
        "reward_model.enable=True", f"reward_model.model.path={rm}",
        "reward_model.use_reward_loop=True", "reward_model.rollout.name=vllm",
        "reward_model.rollout.gpu_memory_utilization=0.8", "reward_model.rollout.tensor_model_parallel_size=1",
        "reward_model.rollout.prompt_length=4096", "reward_model.rollout.response_length=4096",
        "reward_model.num_workers=8",
        "reward_model.model.use_remove_padding=True", "reward_model.model.fsdp_config.param_offload=True",
        "reward_model.micro_batch_size_per_gpu=32",
        "algorithm.use_kl_in_reward=False", "trainer.critic_warmup=0",
        """trainer.logger=["console","wandb"]""", "trainer.project_name='verl_test_qwen25_rm'",
        "trainer.val_before_train=False", "trainer.experiment_name='reward_loop_colocate_reward_model'",
        "trainer.n_gpus_per_node=8", "trainer.nnodes=1",
        "trainer.save_freq=-1", "trainer.test_freq=10", "trainer.total_epochs=15",
    ]


def test_verl_ppo_script_with_a_reward_model_validates(kk_role, rm_path, caplog):
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        check_overrides(verl_rm_script(rm_path))
        cfg, spec, plan = validate(compose(verl_rm_script(rm_path)))
    rm = cfg.reward_model
    assert rm.enable and rm.model.path == rm_path and rm.micro_batch_size_per_gpu == 32
    assert rm.model.use_remove_padding and rm.model.fsdp_config.param_offload
    assert cfg.reward.combine.mode == "model"  # verl's: the learned score is the reward
    assert plan.critic is not None and cfg.trainer.n_gpus == 8
    # 1024 prompts x n=8 over 8 ranks = 1024 responses per rank, scored 32 at a time.
    assert (f"reward     reward model {rm_path}, per rank 32 forwards of <= 32; reward.combine.mode=model"
            in summarize(cfg, spec, plan, ""))
    warned = [r.getMessage() for r in caplog.records if r.name == "logicrl.config"]
    assert all("\n" not in w for w in warned)
    ignored = sorted(w.split("=", 1)[0] for w in warned if " is ignored: " in w)
    # The reward loop's engine settings (reward_model.rollout.*) are one subtree, warned about in one line.
    assert ignored == ["data.return_raw_chat", "reward_model.num_workers", "reward_model.rollout.name",
                       "reward_model.use_reward_loop"], ignored


@pytest.mark.parametrize("override, needle", [
    ("reward_model.enable_resource_pool=True", "not in a pool of its own: drop it"),
    ("reward_model.sandbox_fusion.url=http://x", "sandbox"),
    ("+reward_model.reward_kwargs.overlong_buffer_cfg.enable=True", "reward.overlong_buffer"),
    ("reward_model.model.external_lib=my_lib", "trust_remote_code=true"),
    ("reward_model.strategy=megatron", "FSDP2 only"),
])
def test_verl_reward_model_keys_that_would_change_results_are_refused(kk_role, rm_path, override, needle):
    message = refusal(verl_rm_script(rm_path) + [override])
    assert message.startswith(override.lstrip("+").split("=")[0]) and needle in message, message
