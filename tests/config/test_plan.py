"""The step plan (config/plan.py): its numbers by hand, which phases run and why, and new plans.

The data files hold 20 prompts; BASE_BATCH is 8 prompts x n=4, mini-batches of 4 prompts, micro 4.
"""

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR
from logicrl.config.plan import PHASES, WORKER_PHASES, count_steps
from tests.conftest import BASE_BATCH


def plan_of(data, *overrides):
    return validate(compose([*data, *BASE_BATCH, *overrides]))[2]


@pytest.mark.parametrize("rows, prompts, epochs, cap, expected", [
    (20, 4, 1, 50, (5, 5)),  # the cap cannot add epochs: 5 steps, not 50
    (20, 8, 3, None, (2, 6)),  # 20 // 8 = 2 (the last 4 rows dropped), x 3 epochs
    (21, 4, 2, 7, (5, 7)),  # 10 steps in 2 epochs, capped at 7
    (8, 8, 1, None, (1, 1)),
])
def test_count_steps_by_hand(rows, prompts, epochs, cap, expected):
    assert count_steps(rows, prompts, epochs, cap) == expected


def test_sizes_by_hand(data):
    # 8 x 4 = 32 responses over 2 ranks = 16 each; mini 4 prompts -> 2 per step, 4 x 4 / 2 = 8 per rank.
    plan = plan_of(data, "trainer.n_gpus=2", "trainer.total_epochs=3")
    assert (plan.prompts, plan.n, plan.ranks, plan.responses, plan.per_rank_responses) == (8, 4, 2, 32, 16)
    assert (plan.actor.num_mini, plan.actor.per_rank_mini, plan.actor.grad_accum) == (2, 8, 2)
    assert (plan.steps_per_epoch, plan.total_steps) == (2, 6)
    assert [p.name for p in plan.phases] == list(PHASES)
    assert set(WORKER_PHASES) <= set(PHASES)


def test_the_on_policy_rule(data):
    # One mini-batch of all 8 prompts, one epoch, no KL in the reward: one optimizer step, so skipped.
    on = plan_of(data, f"{ARR}.actor.ppo_mini_batch_size=8")
    assert on.actor.optimizer_steps == 1 and not on.runs("old_log_prob")
    assert on.phase("old_log_prob").skipped.startswith("on-policy")
    # Two mini-batches, a second epoch, or a KL penalty in the reward (it needs the sampling policy's
    # log-probs) each make the pass run.
    assert plan_of(data).runs("old_log_prob")
    assert plan_of(data, f"{ARR}.actor.ppo_mini_batch_size=8", f"{ARR}.actor.ppo_epochs=2").runs("old_log_prob")
    assert plan_of(data, f"{ARR}.actor.ppo_mini_batch_size=8", "algorithm.use_kl_in_reward=true").runs("old_log_prob")


def test_reference_and_critic_phases_run_only_when_needed(data):
    grpo = plan_of(data)
    assert not grpo.runs("ref") and "no KL term" in grpo.phase("ref").skipped
    assert not grpo.runs("values") and not grpo.runs("update_critic") and grpo.critic is None
    ppo = plan_of(data, "algorithm.adv_estimator=gae", f"{ARR}.actor.use_kl_loss=true")
    assert ppo.runs("ref") and ppo.runs("values") and ppo.runs("update_critic")


def test_each_phase_names_the_key_that_sets_its_split(data):
    # The forward passes follow the actor's use_dynamic_bsz unless told otherwise (conf/).
    plan = plan_of(data, f"{ARR}.actor.use_dynamic_bsz=true", f"{ARR}.actor.ppo_max_token_len_per_gpu=3000",
                   f"{ARR}.rollout.log_prob_use_dynamic_bsz=false",
                   f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=3")
    actor = plan.micro("update_actor")
    assert (actor.key, actor.value, actor.by_tokens) == (f"{ARR}.actor.ppo_max_token_len_per_gpu", 3000, True)
    assert plan.actor.grad_accum is None  # packed: the count varies
    old = plan.micro("old_log_prob")
    assert (old.key, old.value, old.by_tokens) == (f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu", 3, False)
    assert plan.forwards("old_log_prob") == 11  # ceil(32 / 3)
    assert plan.micro("generate").key == f"{ARR}.rollout.max_num_seqs"
    ref = plan.micro("ref")  # not told otherwise: packed to the actor's budget
    assert (ref.key, ref.value, ref.by_tokens) == (f"{ARR}.ref.log_prob_max_token_len_per_gpu", 3000, True)


def test_with_micro_is_a_new_plan_and_checks_it(data):
    plan = plan_of(data, "algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=4")
    key = "critic.ppo_micro_batch_size_per_gpu"
    smaller = plan.with_micro({key: 2})
    # One key sets the critic's training micro-batch and its values forward: both change.
    assert smaller.micro("values").value == smaller.micro("update_critic").value == smaller.critic.micro.value == 2
    assert plan.micro("values").value == 4  # the original is untouched
    with pytest.raises(ConfigError, match=r"critic.ppo_micro_batch_size_per_gpu=3 must divide the per-rank mini-batch"):
        plan.with_micro({key: 3})  # 16 responses per mini-batch
    with pytest.raises(KeyError):
        plan.with_micro({"data.train_batch_size": 4})


def test_for_rows_replans_the_steps_and_refuses_too_few(data):
    plan = plan_of(data)
    assert plan.for_rows(17).steps_per_epoch == 2 and plan.for_rows(16).total_steps == 2
    with pytest.raises(ConfigError, match=r"hold 7 usable prompts, fewer than data.train_batch_size=8"):
        plan.for_rows(7)


# ---------------------------------------------------------------- dynamic sampling (algorithm.filter_groups)
DYNAMIC = "algorithm.filter_groups.enable=true"


def test_dynamic_sampling_rounds_in_the_plan_and_the_sampler(data):
    from logicrl.trainer.sampler import EpochSampler

    plan = plan_of(data, DYNAMIC, "data.gen_batch_size=12", "algorithm.filter_groups.max_num_gen_batches=5")
    # Steps still count train batches (20 rows // 8); rounds draw 12 prompts x n=4 = 48 responses on 1 rank.
    rounds = (plan.filter_groups, plan.round_prompts, plan.max_gen_rounds, plan.gen_per_rank_responses)
    assert rounds == (True, 12, 5, 48)
    assert (plan.prompts, plan.steps_per_epoch) == (8, 2)
    # The sampler draws rounds of 12: one per epoch of 20 rows, each epoch's order its own shuffle.
    sampler = EpochSampler(plan, shuffle=True, seed=1)
    first, second = sampler.batch(0), sampler.batch(1)
    assert len(first) == len(second) == 12 and first == sampler.order(0)[:12] and second == sampler.order(1)[:12]
    assert plan_of(data, DYNAMIC, "algorithm.filter_groups.max_num_gen_batches=0").max_gen_rounds is None
    # Off: one round of the train batch per step, the sampler's batches are the steps' as before.
    off = plan_of(data)
    assert (off.filter_groups, off.round_prompts, off.max_gen_rounds) == (False, 8, 1)
    assert EpochSampler(off, True, 1).batch(3) == EpochSampler(off, True, 1).order(1)[8:16]


@pytest.mark.parametrize("overrides, needle", [
    (["data.gen_batch_size=12"], "data.gen_batch_size=12 is read only with dynamic sampling"),
    ([DYNAMIC, f"{ARR}.rollout.n=1", "algorithm.adv_estimator=reinforce_plus_plus"],
     f"algorithm.filter_groups.enable=true needs {ARR}.rollout.n >= 2"),
    ([DYNAMIC, "algorithm.filter_groups.metric=seq_final_reward", "algorithm.use_kl_in_reward=true"],
     "use metric=seq_reward"),
    ([DYNAMIC, "data.gen_batch_size=3", "trainer.n_gpus=8", "trainer.n_gpus_per_node=8"],
     "data.gen_batch_size=3 x actor_rollout_ref.rollout.n=4 = 12 responses a round do not split across "
     "trainer.n_gpus=8 ranks"),
    ([DYNAMIC, "data.gen_batch_size=24"], "fewer than data.gen_batch_size=24"),
    ([DYNAMIC, "algorithm.filter_groups.on_limit=skip"], "algorithm.filter_groups.on_limit"),
])
def test_dynamic_sampling_refusals_name_the_key(data, overrides, needle):
    with pytest.raises(ConfigError, match=None) as err:
        plan_of(data, *overrides)
    assert needle in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_the_dry_run_says_how_many_rounds_a_step_may_take(data):
    from logicrl.config.summary import _sampling_lines

    cfg, _, plan = validate(compose([*data, *BASE_BATCH, DYNAMIC, "data.gen_batch_size=4"]))
    assert _sampling_lines(cfg, plan) == [
        "sampling   dynamic (algorithm.filter_groups, metric=acc): up to 10 generation rounds of 4 prompts x n=4 "
        "(16 responses per rank per round), at most 40 prompts per step, until 8 groups with a spread are kept, or "
        "10 rounds in a row keep none; short at the limit: train on the whole mini-batches kept"]
    assert _sampling_lines(*validate(compose([*data, *BASE_BATCH]))[::2]) == []
