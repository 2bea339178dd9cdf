"""The async step's estimate on separate groups against the colocated step: hand-derived arithmetic, the
colocated counterpart's shares, and the line that says which layout is expected to win and why."""

import datetime
import json

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR
from logicrl.timeplan.calibrate import CpuRates
from logicrl.timeplan.devices import device
from logicrl.timeplan.predict import Rates
from logicrl.timeplan.report import TimePlan, plan_line, rates_for, time_report
from logicrl.timeplan.split import SplitEstimate, colocated_plan, split_estimate, split_line

# 8 prompts x 4 = 32 responses; 2 GB of weights over NCCL in one node (100 GB/s): 0.02 s on the link.
SPLIT = {"generate": 10.0, "reward": 1.0, "old_log_prob": 2.0, "update_actor": 3.0, "update_weights": 0.5}
COLOCATED = {"generate": 4.0, "reward": 1.0, "old_log_prob": 1.5, "update_actor": 2.25, "update_weights": 0.5}


def estimate(split=SPLIT, colocated=COLOCATED, staleness=1, trainer=6, rollout=2) -> SplitEstimate:
    return SplitEstimate(split, colocated, trainer, rollout, staleness, sync_bytes=2 * 10**9, link="cuda_node")


def test_the_async_step_is_the_longer_group_plus_the_sync():
    est = estimate()
    assert est.generate_s == 10.0 and est.train_s == 1.0 + 2.0 + 3.0
    assert est.sync_s == pytest.approx(0.5 + 2e9 / 100e9)  # the trainer's stream, then the link
    assert est.step_s == pytest.approx(10.0 + 0.52)  # max(10, 6) + sync
    assert est.colocated_s == pytest.approx(9.25)
    assert estimate(staleness=0).step_s == pytest.approx(10.0 + 6.0 + 0.52)  # nothing overlaps


def test_the_line_says_plainly_which_layout_is_expected_to_be_faster():
    line = split_line(estimate())
    assert line.startswith("async step: max(generate 10 s on 2 rollout device(s), scoring and update 6 s on 6 "
                           "trainer device(s)) + weight sync 0.52 s (2 GB at 100 GB/s, NCCL in one node) = 10.5 s; "
                           "colocated on all 8 devices: 9.25 s (generate 4 s)")
    assert line.endswith(": colocated sync is expected to be faster (1.14x the step): generation on 2 of 8 devices "
                         "takes longer than the update it hides behind (more rollout devices: "
                         "rollout.n_gpus_per_node)")
    # Generation 5 s hidden behind the trainer's 6 s: 6.52 s against 9.25 s colocated.
    faster = split_line(estimate(split={**SPLIT, "generate": 5.0}))
    assert faster.endswith(": two groups expected faster, 1.42x")
    assert "max_staleness=0 overlaps nothing" in split_line(estimate(staleness=0))
    # The trainer's side longer than the whole colocated step: few devices for the update.
    slow_update = split_line(estimate(split={**SPLIT, "generate": 1.0, "update_actor": 9.0}))
    assert "the update on 6 of 8 devices takes longer than colocated generation and update together" in slow_update


@pytest.fixture
def split_plan(data_files):
    # 12 prompts x n=2 = 24 responses: 4 per trainer rank of 6, 12 per rollout rank of 2; mini-batches of 6
    # prompts (12 responses), 2 per trainer rank.
    overrides = [*data_files, "data.train_batch_size=12", f"{ARR}.rollout.n=2", f"{ARR}.actor.ppo_mini_batch_size=6",
                 f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1", "algorithm.adv_estimator=grpo",
                 f"{ARR}.hybrid_engine=false", "trainer.n_gpus=6", "rollout.n_gpus_per_node=2"]
    return validate(compose(overrides))


def test_the_colocated_counterpart_spreads_the_batch_over_every_device(split_plan):
    _, _, plan = split_plan
    assert (plan.per_rank_responses, plan.gen_per_rank_responses, plan.actor.per_rank_mini) == (4, 12, 2)
    both = colocated_plan(plan)
    assert (both.ranks, both.rollout_ranks) == (8, 0)
    # 24 / 8 = 3 responses per rank, generated and trained on the same ranks; a mini-batch's 12 responses over 8
    # ranks: the busiest holds 2.
    assert (both.per_rank_responses, both.gen_per_rank_responses, both.actor.per_rank_mini) == (3, 3, 2)


def test_the_estimate_reads_each_groups_share_from_the_same_time_plan(split_plan):
    cfg, spec, plan = split_plan
    rates = Rates(gpu=device("H100"))
    est = split_estimate(cfg, spec, plan, rates, prompt=100, response=200)
    assert (est.trainer_ranks, est.rollout_ranks, est.staleness, est.link) == (6, 2, 1, "cuda_node")
    # Every weight of the embedded tiny model in bf16.
    assert est.sync_bytes == spec.num_params() * 2
    assert set(est.split) == set(est.colocated)
    # Generation splits over 2 ranks on the groups, over 8 colocated: 12 responses per rank against 3.
    assert est.split["generate"] > est.colocated["generate"]
    assert split_estimate(cfg, spec, colocated_plan(plan), rates, 100, 200) is None  # a colocated plan: none


def test_a_split_time_plan_counts_the_async_step_and_prints_the_estimate():
    cpu = CpuRates({64: 50e9, 1024: 100e9}, 10e9, 1e-6, 5e9, 2)
    plan = TimePlan(SPLIT, Rates(cpu=cpu), 44, 4, split=estimate())
    assert plan.step_s == pytest.approx(10.52)
    now = datetime.datetime(2026, 1, 1, 10, 0, tzinfo=datetime.UTC)
    first, second = plan_line(plan, 100, now).splitlines()
    assert first.startswith("time plan: 10.5 s/step (generate 10, update_actor 3, old_log_prob 2, update_weights "
                            "0.5, other 1); 100 steps: 17m32s")
    assert second.startswith("time plan, async step: max(generate 10 s")


def test_an_unknown_gpu_model_is_named_with_the_ones_the_table_knows():
    with pytest.raises(ConfigError, match=r"^trainer.gpu_model=H1OO is not in the time plan's device table: name "
                                          r"one of H100 PCIe, .*H100, "):
        rates_for("cuda", 1, "H1OO")
    assert rates_for("cuda", 1, "NVIDIA H200").gpu.name == "H200"


def test_the_closing_report_checks_the_async_step_and_the_sync_as_measured(tmp_path):
    # A split run measures timing_s/sync_weights (the broadcast included) and a step that overlaps its phases.
    rows = [{"step": s, "timing_s/step": 10.6, "timing_s/generate": 10.0, "timing_s/update_actor": 3.0,
             "timing_s/sync_weights": 0.52} for s in range(1, 4)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cpu = CpuRates({64: 50e9, 1024: 100e9}, 10e9, 1e-6, 5e9, 2)
    plan = TimePlan(SPLIT, Rates(cpu=cpu), 44, 4, split=estimate())
    assert plan.compared["sync_weights"] == pytest.approx(0.52) and "update_weights" not in plan.compared
    table = {line.split()[0]: line.split()[1:] for line in
             time_report(plan.compared, tmp_path, plan.step_s).splitlines()[2:]}
    assert table["sync_weights"] == ["0.520", "0.520", "1.00"]
    assert table["step"] == ["10.520", "10.600", "1.01"]  # max(10, 6) + 0.52, not the phases' sum (16.52)
