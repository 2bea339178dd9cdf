"""The memory plan counts the real reward-model phase from the reward_model group: its shape read from
reward_model.model.path, held like the reference (resident unless param_offload), its forward split by
reward_model.micro_batch_size_per_gpu."""

import pytest

from logicrl.config import compose, validate
from logicrl.config.phases import ARR
from logicrl.memory.footprint import ModelBytes
from logicrl.memory.planner import plan_inputs
from logicrl.models.spec import load_model_spec
from logicrl.preflight.memory import plan_for
from tests.conftest import ROOT, write_jsonl
from tests.workers.conftest import write_tiny_reward_model

QWEN7B = ROOT / "logicrl/memory/shapes/qwen2.5-7b"
PPO_7B = [f"{ARR}.model.path={QWEN7B}", "algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true",
          "trainer.n_gpus=4", "trainer.device=cuda", "trainer.gpu_memory_gb=80", "data.train_batch_size=8",
          f"{ARR}.rollout.n=4", f"{ARR}.actor.ppo_mini_batch_size=4", "data.max_prompt_length=512",
          "data.max_response_length=1024", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
          "critic.ppo_micro_batch_size_per_gpu=4", f"{ARR}.rollout.name=hf", "trainer.memory_plan=worst_case",
          # Padded rows (the hand counts below), unless a test packs; no checkpointing.
          f"{ARR}.model.use_remove_padding=false", "critic.model.use_remove_padding=false",
          f"{ARR}.model.enable_gradient_checkpointing=false", "critic.model.enable_gradient_checkpointing=false"]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm-plan")
    data = write_jsonl(root / "train.jsonl", 16)
    return [f"data.train_files={data}", f"data.val_files={data}"], write_tiny_reward_model(root / "rm")


def validated(files, *overrides):
    """The 7B PPO config with the tiny reward model on: (cfg, spec, plan)."""
    data, rm = files
    return validate(compose([*data, *PPO_7B, "reward_model.enable=true", f"reward_model.model.path={rm}", *overrides]))


def planned(files, *overrides):
    x, cap, _ = plan_for(*validated(files, *overrides))
    return x, plan_inputs(x, cap)


def auto_picked(files, *overrides):
    """What auto_micro_batch picks for that config, and its step plan."""
    from logicrl.memory.fit import auto_micro_batch

    cfg, spec, plan = validated(files, *overrides)
    x, cap, _ = plan_for(cfg, spec, plan)
    return auto_micro_batch(x, cap), plan


def test_the_phase_runs_with_its_own_micro_batch_and_shape(files):
    x, memory = planned(files, "reward_model.micro_batch_size_per_gpu=2")
    assert x.skipped("reward_model") is None and x.split("reward_model") == (2, None)
    assert x.models["reward_model"].spec == load_model_spec(str(files[1]))
    rm = memory.phase("reward_model")
    assert not rm.skipped and rm.total > 0
    # The reward model's bf16 shard (a value head, no lm_head) is resident in every phase, as the reference's.
    shard = ModelBytes.build(x.models["reward_model"].spec, dtype_bytes=2, world=4, head="value").total_shard
    without = plan_inputs(x.with_model("reward_model", spec=None), memory.capacity)
    assert without.phase("reward_model").skipped
    for phase in ("generate", "update_actor", "update_weights"):
        assert memory.phase(phase).parts["params"] - without.phase(phase).parts["params"] == shard, phase
    # Twice the rows per forward: more activations, the same resident state.
    _, bigger = planned(files, "reward_model.micro_batch_size_per_gpu=4")
    assert bigger.phase("reward_model").parts["activations"] > rm.parts["activations"]
    assert bigger.phase("reward_model").parts["params"] == rm.parts["params"]


def test_param_offload_keeps_it_off_the_device_between_phases(files):
    x, memory = planned(files, "reward_model.model.fsdp_config.param_offload=true")
    assert x.models["reward_model"].offload
    _, resident = planned(files)
    shard = ModelBytes.build(x.models["reward_model"].spec, dtype_bytes=2, world=4, head="value").total_shard
    assert resident.phase("generate").parts["params"] - memory.phase("generate").parts["params"] == shard


def test_by_tokens_with_use_dynamic_bsz(files):
    x, _ = planned(files, "reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=3072")
    assert x.split("reward_model") == (None, 3072)


def test_auto_micro_batch_sizes_its_forward_and_the_plan_takes_the_key(files):
    picked, plan = auto_picked(files, "reward_model.micro_batch_size_per_gpu=1")
    # 8 responses per rank, a 64-wide reward model on 80 GB: all 8 in one forward.
    assert picked["reward_model.micro_batch_size_per_gpu"] == 8
    assert plan.with_micro(picked).micro("reward_model").value == 8


# The reward model's rows. The tiny reward model: H = 64, one 64-wide head (q = 64), I = 128, bf16 (b = 2).
# 8 responses per rank, the actor's rows 512 + 1024 = 1536 wide. One forward's transient per token
# (footprint.forward_transient_per_token) is 2bH + 4H + max(3bI, 4bq + bT) = 256 + 256 + max(768, 512 + 2T),
# and the decoder moment holds the batch, the 8 fp32 scores (and their cat), the re-rendered rows, the
# bool mask (tokens x T) and that transient: batch = 8 x 1536 x 24 + 8 x 1024 x 36 = 589,824 bytes.
BATCH, SCORES = 589_824, 2 * 8 * 4


def rm_activations(files, *overrides):
    x, memory = planned(files, "reward_model.max_length=4096", *overrides)
    phase = memory.phase("reward_model")
    assert phase.moment == "decoder"
    return x, phase.parts["activations"]


def test_rows_re_rendered_with_another_tokenizer_are_planned_at_max_length(files, tmp_path):
    # The actor's tokenizer (input_tokenizer) and the reward model's differ in their chat template only:
    # the worker re-renders every row, up to reward_model.max_length = 4096 of the reward model's tokens.
    other = write_tiny_reward_model(tmp_path / "other",
                                    chat_template="{% for m in messages %}{{ m.content }}{% endfor %}")
    x, activations = rm_activations(files, f"reward_model.model.input_tokenizer={other}",
                                    "reward_model.micro_batch_size_per_gpu=2")
    assert (x.reward_rerender_len, x.reward_width, x.width) == (4096, 4096, 1536)
    # 2 rows x 4096 = 8192 tokens; transient 512 + 512 + 8192 = 9216 per token; mask 8192 x 4096;
    # the re-rendered ids, mask and positions 3 x 8 bytes x 8 rows x 4096.
    assert activations == BATCH + SCORES + 3 * 8 * 8 * 4096 + 8192 * 4096 + 8192 * 9216 == 110_428_224


def test_the_same_tokenizer_scores_the_actors_rows(files):
    data, rm = files
    for same in (f"reward_model.model.input_tokenizer={rm}", "reward_model.model.input_tokenizer=null"):
        x, activations = rm_activations(files, same, "reward_model.micro_batch_size_per_gpu=2")
        assert (x.reward_rerender_len, x.reward_width) == (0, 1536), same
        # 2 x 1536 = 3072 tokens; transient 512 + 512 + 3072 = 4096 per token; mask 3072 x 1536; no new rows.
        assert activations == BATCH + SCORES + 3072 * 1536 + 3072 * 4096 == 17_891_392, same


def test_a_token_budget_counts_re_rendered_rows(files, tmp_path):
    other = write_tiny_reward_model(tmp_path / "other", chat_template="{{ messages[0].content }}")
    budget = ["reward_model.use_dynamic_bsz=true", f"reward_model.model.input_tokenizer={other}"]
    # A budget under one re-rendered row still holds one whole row: 4096 tokens.
    x, one = rm_activations(files, *budget, "reward_model.forward_max_token_len_per_gpu=1536")
    assert x.split("reward_model") == (None, 1536)
    assert one == BATCH + SCORES + 3 * 8 * 8 * 4096 + 4096 * 4096 + 4096 * (1024 + 8192)
    # Two rows' worth is the two-row micro-batch above.
    _, two = rm_activations(files, *budget, "reward_model.forward_max_token_len_per_gpu=8192")
    assert two == 110_428_224


TINY_ACTOR = [f"{ARR}.model.path=embedded:tiny", "algorithm.adv_estimator=grpo", "trainer.n_gpus=1",
              "trainer.device=cuda", "trainer.gpu_memory_gb=1.5", "data.train_batch_size=4", f"{ARR}.rollout.n=2",
              f"{ARR}.actor.ppo_mini_batch_size=4", "data.max_prompt_length=64", "data.max_response_length=64",
              f"{ARR}.actor.ppo_micro_batch_size_per_gpu=8", f"{ARR}.rollout.name=hf", "trainer.memory_plan=worst_case"]


def test_the_refusal_names_reward_model_keys(files, tmp_path):
    """A tiny actor, and a reward model reading re-rendered rows of 8192 tokens 8 at a time: only the
    reward_model phase is over the 0.5 GB usable (1.5 GB less 1 GB kept free), and every remedy is its own."""
    from logicrl.memory.fit import DoesNotFit, check_fit

    data, rm = files
    other = write_tiny_reward_model(tmp_path / "other", chat_template="{{ messages[0].content }}")
    cfg, spec, plan = validate(compose([*data, *TINY_ACTOR, "reward_model.enable=true", f"reward_model.model.path={rm}",
                                        f"reward_model.model.input_tokenizer={other}", "reward_model.max_length=8192",
                                        "reward_model.micro_batch_size_per_gpu=8",
                                        "reward_model.model.use_remove_padding=false"]))  # padded: the [T, T] mask
    x, cap, _ = plan_for(cfg, spec, plan)
    memory = plan_inputs(x, cap)
    over = [p.name for p in memory.running() if p.total > cap - 2**30]
    assert over == ["reward_model"] and x.reward_width == 8192
    with pytest.raises(DoesNotFit) as err:
        check_fit(memory)
    message = str(err.value)
    assert message.startswith("reward_model needs")
    # One 8192-token row per forward: 8192 x 8192 mask + 8192 x (1024 + 16384) transient + ... fits.
    assert "reward_model.micro_batch_size_per_gpu=" in message
    assert ("reward_model.use_dynamic_bsz=true reward_model.forward_max_token_len_per_gpu=" in message
            and "reward_model.model.use_remove_padding=true" in message)
    assert not any(k.startswith(ARR) for k in err.value.knobs), err.value.knobs
    # With 0.1 GB usable not even one row fits: the refusal names the reward model's length, not the actor's LoRA.
    with pytest.raises(DoesNotFit) as err:
        check_fit(memory, capacity_gb=1.1)
    assert "shorten reward_model.max_length" in str(err.value)
    assert "reward_model.max_length" in err.value.knobs and f"{ARR}.model.lora_rank" not in err.value.knobs


def test_plan_memory_reads_the_reward_models_shape_from_the_config(files):
    """plan_memory (the benchmark's entry) plans the phase as plan_for does: it read no shape before, so the
    reward model's phase was planned as skipped and its resident shard left out."""
    from logicrl.memory.planner import plan_memory

    cfg, spec, plan = validated(files)
    memory = plan_memory(plan, cfg, spec, device="cuda", capacity_gb=80)
    assert memory.inputs.models["reward_model"].spec == load_model_spec(str(files[1]))
    assert not memory.phase("reward_model").skipped


def test_packed_auto_micro_batch_gives_it_a_token_budget_under_its_own_key(files):
    picked, plan = auto_picked(files, "reward_model.model.use_remove_padding=true")
    # All 8 of the rank's 1536-token rows fit one packed forward.
    assert picked["reward_model.forward_max_token_len_per_gpu"] == 8 * 1536
    assert "reward_model.micro_batch_size_per_gpu" not in picked
    micro = plan.with_micro(picked).micro("reward_model")
    assert (micro.by_tokens, micro.value) == (True, 8 * 1536)
