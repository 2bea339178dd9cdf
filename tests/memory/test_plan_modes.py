"""trainer.memory_plan: worst_case refuses verl's Qwen2.5-7B LoRA GRPO tuning on one 80 GB H100 at 100
prompts; expected lengths fit it, and the plan says where each phase would stop fitting. Refusals name
the token budget that fits at any length; with packing auto_micro_batch prefers budgets.

The case is verl's examples/tuning/7b/qwen2-7b_grpo-lora_1_h100_fsdp_vllm.sh (its bisection: 100 prompts
fit, 101 fail, with real GSM8K lengths) on logicrl/memory/shapes/qwen2.5-7b, with the embedded tiny
model's tokenizer beside the shape (the shape has none) to measure this repo's kk_role prompts.
"""

import json
import shutil
from dataclasses import replace

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR
from logicrl.memory.fit import (
    any_length_budget,
    auto_micro_batch,
    by_budget,
    check_fit,
    stop_lengths,
)
from logicrl.memory.lengths import last_run_response_length, plan_lengths
from logicrl.memory.phases import GB
from logicrl.memory.planner import plan_inputs
from logicrl.memory.planner_inputs import PlanInputs
from logicrl.models.attention import PACKED_SDPA
from logicrl.models.tiny import tiny_checkpoint_dir
from tests.conftest import ROOT, assert_refused, check_main, need_data, write_jsonl
from tests.memory.conftest import planned

TRAIN, VAL = ROOT / "data/kk_role/train.parquet", ROOT / "data/kk_role/test.parquet"
CAP = 80 * GB
BUDGET = f"{ARR}.actor.ppo_max_token_len_per_gpu"
MICRO = f"{ARR}.actor.ppo_micro_batch_size_per_gpu"
# verl's script, nproc_per_gpu=100: 100 prompts x n=5, one mini-batch, micro-batches of 100 responses.
VERL_7B_LORA = [
    "algorithm.adv_estimator=grpo", f"data.train_files={TRAIN}", f"data.val_files={VAL}",
    "data.train_batch_size=100", "data.max_prompt_length=512", "data.max_response_length=1024",
    f"{ARR}.model.enable_gradient_checkpointing=True", f"{ARR}.model.lora_rank=32", f"{ARR}.model.lora_alpha=32",
    f"{ARR}.model.target_modules=all-linear", f"{ARR}.actor.ppo_mini_batch_size=100",
    f"{ARR}.actor.ppo_micro_batch_size_per_gpu=100", f"{ARR}.actor.use_kl_loss=True",
    f"{ARR}.actor.fsdp_config.param_offload=True", f"{ARR}.actor.fsdp_config.optimizer_offload=True",
    f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=100", f"{ARR}.rollout.name=vllm",
    f"{ARR}.rollout.gpu_memory_utilization=0.2", f"{ARR}.rollout.n=5", f"{ARR}.rollout.max_num_seqs=512",
    f"{ARR}.rollout.max_num_batched_tokens=1536", f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=100",
    f"{ARR}.ref.fsdp_config.param_offload=True", "trainer.n_gpus=1", "trainer.gpu_memory_gb=80",
    f"{ARR}.model.use_remove_padding=false",  # padded rows: the worst case and the measured lengths differ
]
# LoRA adapters compute in bf16 (their saved inputs are bf16) and roots reshard after forwards:
# verl's 100 prompts fit at full lengths (69.1 GB). The same script at 128 prompts is the case that
# full lengths refuse and measured lengths fit.
VERL_7B_LORA_128 = [o.replace("=100", "=128") if "=100" in o else o for o in VERL_7B_LORA]


@pytest.fixture(scope="module")
def qwen7b(tmp_path_factory):
    """The 7B shape's config.json with a tokenizer beside it, so prompts can be measured."""
    need_data("kk_role")
    path = tmp_path_factory.mktemp("qwen7b")
    shutil.copy(ROOT / "logicrl/memory/shapes/qwen2.5-7b/config.json", path)
    tiny = tiny_checkpoint_dir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tiny / name).is_file():
            shutil.copy(tiny / name, path)
    return path


def inputs(qwen7b, args) -> PlanInputs:
    return planned(*args, f"{ARR}.model.path={qwen7b}")[3]


@pytest.fixture(scope="module")
def worst(qwen7b) -> PlanInputs:
    return inputs(qwen7b, VERL_7B_LORA_128)


def test_verls_100_prompts_fit_at_full_lengths(qwen7b):
    plan = plan_inputs(inputs(qwen7b, VERL_7B_LORA), CAP)
    check_fit(plan)  # no error
    assert plan.phase("update_actor").total < 70 * GB


def test_worst_case_refuses_128_prompts_and_names_the_budget_beside_the_micro_batch(worst):
    plan = plan_inputs(worst, CAP)
    assert (worst.prompt_len, worst.response_len) == (512, 1024)
    with pytest.raises(ConfigError) as err:
        check_fit(plan)
    message = str(err.value)
    need = plan.phase("update_actor").total / GB
    assert need > 79 and message.startswith(f"update_actor needs {need:.1f} GB > 79.0 GB usable per device: set "
                                            f"{ARR}.actor.ppo_micro_batch_size_per_gpu="), message
    micro = int(message.split("ppo_micro_batch_size_per_gpu=")[1].split(";")[0].split()[0])
    assert plan_inputs(worst.with_micro({MICRO: micro}), CAP).phase("update_actor").total <= plan.usable
    # The budget is whole full-length rows of 1536 tokens: the largest that fits, and one row more does not.
    budget = int(message.split(f"{BUDGET}=")[1].split()[0])
    assert budget % 1536 == 0
    assert f"{ARR}.actor.use_dynamic_bsz=true {BUDGET}={budget}" in message
    phase = lambda b: plan_inputs(by_budget(worst, "update_actor", b), CAP).phase("update_actor").total  # noqa: E731
    assert phase(budget) <= plan.usable < phase(budget + 1536)
    # Padded rows keep their width whatever the budget: it bounds memory only with packing.
    assert message.endswith(f"{ARR}.model.use_remove_padding=true")


def packed(x: PlanInputs, kernel: str | None) -> PlanInputs:
    """`x` with the policy's use_remove_padding (the actor's and the reference's one key) on `kernel`."""
    return x.with_model("actor", packing=kernel).with_model("ref", packing=kernel)


def test_expected_lengths_fit_and_name_where_each_phase_stops(worst):
    # Packed micro-batches of 200 responses, GSM8K-sized prompts of 200 tokens and responses of 300.
    x = replace(packed(worst, PACKED_SDPA), prompt_len=200, response_len=300, plan_mode="expected")
    x = x.with_micro({MICRO: 200})
    plan = plan_inputs(x, CAP)
    check_fit(plan)  # fits: no error
    stops = stop_lengths(plan)
    stop = stops["update_actor"]
    assert stop is not None and 300 < stop < 1024
    at = lambda r: plan_inputs(replace(x, response_len=r), CAP).phase("update_actor").total  # noqa: E731
    assert at(stop - 1) <= plan.usable < at(stop)  # the first length that does not fit
    # Phases that fit at the full response length say so (None).
    assert stops["generate"] is None and stops["update_weights"] is None


def test_packed_auto_micro_batch_picks_a_budget_that_fits_at_any_length(worst):
    x = replace(packed(worst, PACKED_SDPA), prompt_len=44, response_len=300, plan_mode="expected")
    picked = auto_micro_batch(x, CAP)
    budget = picked[BUDGET]
    assert budget == any_length_budget(x, CAP, "update_actor")
    # Fits at full lengths (so at any length), and the inputs now split update_actor by tokens.
    y = x.with_micro(picked)
    assert y.split("update_actor") == (None, budget)
    full = plan_inputs(y.worst_case(), CAP)
    assert full.phase("update_actor").total <= full.usable
    # Padded, the same call keeps micro-batches by rows.
    assert BUDGET not in auto_micro_batch(packed(x, None), CAP)


def test_a_budget_key_switches_the_step_plan_to_tokens(qwen7b):
    _, _, plan = validate(compose([*VERL_7B_LORA, f"{ARR}.model.path={qwen7b}"]))
    switched = plan.with_micro({BUDGET: 3072})
    assert switched.micro("update_actor").by_tokens and switched.micro("update_actor").key == BUDGET
    assert switched.actor.micro.value == 3072
    assert not switched.micro("ref").by_tokens  # only the phase named
    # The planner's inputs take the same {key: value} and split every phase as the step plan does.
    assert inputs(qwen7b, VERL_7B_LORA).with_micro({BUDGET: 3072}).phases == switched.phases


def test_expected_response_length_is_checked(qwen7b):
    base = [*VERL_7B_LORA, f"{ARR}.model.path={qwen7b}"]
    too_long = r"^trainer.expected_response_length=2000 exceeds data.max_response_length=1024"
    with pytest.raises(ConfigError, match=too_long):
        validate(compose([*base, "trainer.memory_plan=expected", "trainer.expected_response_length=2000"]))
    with pytest.raises(ConfigError, match=r"only read with trainer.memory_plan=expected"):
        validate(compose([*base, "trainer.expected_response_length=300"]))
    with pytest.raises(ConfigError, match="memory_plan"):
        validate(compose([*base, "trainer.memory_plan=average"]))


def test_the_resumed_checkpoint_gives_the_response_length(tmp_path):
    def checkpoint(step: int, history: list[dict], complete: bool = True):
        path = tmp_path / f"global_step_{step}"
        path.mkdir()
        (path / "trainer_state.json").write_text(json.dumps({"format": 1, "step": step, "extra": {"history": history}}))
        if complete:
            (path / "COMPLETE").write_text("")
        return path

    checkpoint(2, [{"step": 1, "len_mean": 900.0}])
    newest = checkpoint(4, [{"step": 3, "len_mean": 210.2}, {"step": 4, "len_mean": 250.5, "len_max": 700.0}])
    checkpoint(6, [{"step": 6, "len_mean": 999.0}], complete=False)  # an unfinished save is not resumed
    # The largest mean of the newest complete checkpoint's history, rounded up.
    assert last_run_response_length(str(tmp_path), "auto") == (251, str(newest))
    assert last_run_response_length(str(tmp_path), "disable") is None
    assert last_run_response_length(str(tmp_path / "none"), "auto") is None


# main_ppo.py's dry runs in-process (check_main); a memory refusal through the entry point:
# tests/memory/test_memory_fit.py.
def test_refused_at_worst_case_runs_at_expected_lengths(qwen7b, tmp_path):
    """Padded: the measured prompt lengths make the difference."""
    args = [*VERL_7B_LORA_128, f"{ARR}.model.path={qwen7b}", "trainer.dry_run=true"]
    line = assert_refused(check_main(*args, cwd=tmp_path), f"{ARR}.actor.use_dynamic_bsz=true {BUDGET}=")
    assert line.startswith("error: update_actor needs 87.3 GB > 79.0 GB usable per device"), line
    fits = check_main(*args, "trainer.memory_plan=expected", cwd=tmp_path)
    assert fits.code == 0, fits.line
    lines = fits.out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("memory plan: "))
    assert lines[first].startswith("memory plan: trainer.memory_plan=expected, prompts 44 tokens, the longest")
    assert lines[first + 1].startswith("memory plan per device")
    assert "no packing), so the plan holds at any response length" in fits.out
    worst = check_main(*args, "trainer.gpu_memory_gb=160", cwd=tmp_path)
    assert "memory plan: trainer.memory_plan=worst_case, full lengths" in worst.out


def test_packed_expected_plan_names_the_response_length_it_stops_at(qwen7b, tmp_path):
    args = [*VERL_7B_LORA, f"{ARR}.model.path={qwen7b}", f"{ARR}.model.use_remove_padding=true",
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=250",
            "trainer.dry_run=true", "trainer.memory_plan=expected", "trainer.expected_response_length=300"]
    fits = check_main(*args, cwd=tmp_path)
    assert fits.code == 0, fits.line
    assert "responses 300 tokens (trainer.expected_response_length)" in fits.out
    assert "expected lengths: stops fitting at response length update_actor at " in fits.out


def test_expected_needs_a_tokenizer_to_measure_prompts():
    need_data("kk_role")
    cfg, _, _ = validate(compose([*VERL_7B_LORA, f"{ARR}.model.path={ROOT / 'logicrl/memory/shapes/qwen2.5-7b'}",
                                  "trainer.memory_plan=expected"]))
    # A config-only shape directory: one line naming the key and the fix, not prompts of 0 tokens.
    with pytest.raises(ConfigError, match=r"has no tokenizer .*or use trainer.memory_plan=worst_case$"):
        plan_lengths(cfg, packed=False)


def test_measured_prompts_are_rendered_with_the_runs_tools(tmp_path):
    """A chat template that lists the tools (Qwen2.5's does, in a system turn) makes a multi-turn run's prompts
    longer: the planner measures them as the trainer loads them, tools included."""
    from logicrl.config.multi_turn import prompt_tools
    from logicrl.data.dataset import SAMPLE_ROWS, load_prompts
    from logicrl.memory.lengths import measured_prompt_lengths
    from logicrl.models.loading import load_tokenizer
    from logicrl.models.tiny_tokenizer import CHAT_TEMPLATE

    data = write_jsonl(tmp_path / "train.jsonl", 20)
    model = tmp_path / "model"
    shutil.copytree(tiny_checkpoint_dir(), model)
    lists_tools = ("{%- if tools %}{{- '<|im_start|>system\\n' }}{%- for tool in tools %}"
                   "{{- tool['function']['name'] + '\\n' }}{%- endfor %}{{- '<|im_end|>\\n' }}{%- endif %}")
    (model / "chat_template.jinja").write_text(lists_tools + CHAT_TEMPLATE)
    base = [f"data.train_files={data}", f"data.val_files={data}", f"{ARR}.model.path={model}",
            "trainer.memory_plan=expected"]
    tools = [f"{ARR}.rollout.multi_turn.enable=true",
             f"{ARR}.rollout.multi_turn.function_tool_path={ROOT / 'recipes/tools/lookup.py'}"]
    cfg = compose([*base, *tools])
    with_tools, without = measured_prompt_lengths(cfg), measured_prompt_lengths(compose(base))
    assert len(with_tools) == len(without) and all(a > b for a, b in zip(with_tools, without))
    loaded = load_prompts(str(data), load_tokenizer(str(model)), max_prompt_length=4096,
                          sample=SAMPLE_ROWS, tools=prompt_tools(cfg))
    assert with_tools == [len(row.input_ids) for row in loaded]
