"""PPO with all four models through the real entry point on 2 CPU ranks: actor, critic (GAE), a learned
reward model and the reference (KL in the reward); then a re-run of a run that died in step 2 (its
checkpoint root as a SIGKILL leaves it: step 1 the newest), which resumes from step 1 and ends exactly
where the uninterrupted run ended; and injected OOMs in every phase at step 1, which the run recovers
from with the uninterrupted run's result. (A real SIGKILL mid-save, then the same command:
tests/trainer/test_curriculum_resume.py; here the resumed state of all four models is the point.)

Every run here trains at Ulysses sequence parallelism 2 from step 0 (models/ulysses.py): the actor, the
reference and the critic split each packed row over the 2 ranks (the reward model's one attention head keeps
it at SP 1), with gradient checkpointing, the actor's and critic's offload keys on (nothing moves off a CPU
rank: workers/fsdp.py) and a token budget for old_log_prob. So the resume is bit-exact at SP 2, and
the last test resumes the SP 2 checkpoint at SP 1, padded, and gets the same step 2.

The reward model is a random one-label sequence classifier (hidden 64, one 64-wide head) over the
embedded tiny tokenizer, written to a tmp dir with a chat template of its own, so its phase re-renders
every row from the prompt's chat (the chats cross Ray with the shards). reward.combine is weighted
(0.5 x learned + 1 x rule), so the step's score is checkable from the two means the step reports.
Dynamic sampling is on (algorithm.filter_groups, rounds of 2 prompts for a batch of 4, filtered on the
combined score, which the random reward model makes differ between any two different responses): each
step takes at least two generation rounds, so the checkpointed sampler position (rounds drawn) is not the step, and
the resume must restore it to draw the same prompts.
"""

import shutil

import pytest
import torch
from safetensors.torch import load_file

from logicrl.config.phases import ARR
from tests.conftest import ROLE_DATA, ROOT, TINY_RUN, assert_refused, check_main, read_metrics, run_main, tail
from tests.workers.conftest import PLAIN_TEMPLATE, write_tiny_reward_model

pytestmark = pytest.mark.integration
DATA = ROOT / "data/kk_role"
# old_log_prob's tokens per rank: rows of at most 128 + 4 tokens, so a halved budget (80) still holds the
# longest row's half; each SP group packs 2 x the budget (workers/oom.py MicroSize.group).
BUDGET = 160
RUN = [*ROLE_DATA, *TINY_RUN, f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2", "trainer.test_freq=2", "trainer.n_gpus=2",
       "trainer.save_freq=1", "trainer.save_hf_model=true",
       "algorithm.adv_estimator=gae", "critic.ppo_micro_batch_size_per_gpu=2", "algorithm.use_kl_in_reward=true",
       "reward_model.enable=true", "reward_model.micro_batch_size_per_gpu=3",
       "reward.combine.mode=weighted", "reward.combine.weights.model=0.5", "reward.combine.weights.rule=1.0",
       "algorithm.filter_groups.enable=true", "algorithm.filter_groups.metric=score", "data.gen_batch_size=2",
       f"{ARR}.model.use_remove_padding=true", f"{ARR}.actor.ulysses_sequence_parallel_size=2",
       "reward_model.ulysses_sequence_parallel_size=1", f"{ARR}.model.enable_gradient_checkpointing=true",
       f"{ARR}.actor.fsdp_config.param_offload=true", f"{ARR}.actor.fsdp_config.optimizer_offload=true",
       "critic.fsdp_config.param_offload=true", "critic.fsdp_config.optimizer_offload=true",
       f"{ARR}.rollout.log_prob_use_dynamic_bsz=true", f"{ARR}.rollout.log_prob_max_token_len_per_gpu={BUDGET}"]
# Deterministic metrics of a step (no timings, no memory): equal in a resumed run to the uninterrupted one's.
SAME = ("critic/score/mean", "reward_model/score/mean", "reward/rule_score/mean", "actor/pg_loss", "critic/vf_loss",
        "actor/reward_kl_penalty", "response_length/mean", "val/acc", "val/score")


@pytest.fixture(scope="module")
def rm_path(kk_role, tmp_path_factory):
    return write_tiny_reward_model(tmp_path_factory.mktemp("rm") / "rm", chat_template=PLAIN_TEMPLATE)






@pytest.fixture(scope="module")
def reference(rm_path, tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    # Its step 1 measures each phase's live tensors (TINY_RUN leaves them out): the reward model's is checked.
    result = run_main(*RUN, f"reward_model.model.path={rm_path}", "trainer.track_tensor_peaks=true",
                      ckpt=root / "ckpt", run_dir=root / "run")
    assert result.returncode == 0, tail(result)
    (root / "output.txt").write_text(result.stdout + result.stderr)
    return root


def test_every_phase_runs_with_the_reward_model(reference):
    rows = read_metrics(reference / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        for phase in ("generate", "reward_model", "reward", "old_log_prob", "ref", "values", "update_critic",
                      "update_actor", "update_weights"):
            assert f"timing_s/{phase}" in row, phase
        if row["step"] == 1:  # the tracked step (memory/telemetry.py tracks_tensors)
            assert 0 < row["perf/memory/reward_model/tensor_peak_gb"] < row["perf/memory/reward_model/rss_peak_gb"]
        assert row["perf/oom_retries/reward_model"] == 0 and row["reward_model/truncated"] == 0
        # The budget as configured, what each rank holds (its half of a group's 2 x BUDGET tokens), not 2 x it.
        assert row["perf/micro_size/old_log_prob"] == BUDGET
        # reward.combine weighted: every row's score is 0.5 x learned + 1 x rule, so are the means.
        assert row["critic/score/mean"] == pytest.approx(
            0.5 * row["reward_model/score/mean"] + row["reward/rule_score/mean"], abs=1e-5)
        assert row["reward_model/score/max"] > row["reward_model/score/min"]  # 8 re-rendered rows differ
        assert "actor/reward_kl_penalty" in row and "critic/vf_loss" in row
        # Rounds of 2 prompts until 4 groups are kept (two, unless a group's two responses came out alike),
        # and 4 x n=2 responses trained.
        assert row["filter/gen_rounds"] >= 2 and row["filter/groups_kept"] >= 4
        assert row["filter/groups_kept"] + row["filter/groups_dropped"] == row["batch/prompts"] == \
            2 * row["filter/gen_rounds"]
        assert row["batch/responses"] == 8
    # Validation (step 2) scores with the reward model too, as verl's: its score mixes in the learned one,
    # so it is not the rule's alone (+1, 0 or -1 per response: a mean that is a multiple of 1/200).
    val = rows[-1]["val/score"] * 200  # 200 prompts x val_kwargs.n=1
    assert "val/acc" in rows[-1] and abs(val - round(val)) > 1e-6
    # The plan's header names what SP splits: the actor's, reference's and critic's phases, not the reward model's.
    out = (reference / "output.txt").read_text()
    for phase in ("old_log_prob", "ref", "values", "update_critic", "update_actor"):
        assert f"{phase} splits each row over 2 ranks" in out, phase
    assert "reward_model splits" not in out


def test_a_run_that_died_in_step_2_resumes_bit_exactly(rm_path, reference, tmp_path):
    # The uninterrupted run's step 1 is what a run of the same command killed in step 2 leaves: the
    # same seed, data order and weights (the kill itself: test_curriculum_resume.py).
    ckpt = tmp_path / "ckpt"
    shutil.copytree(reference / "ckpt" / "global_step_1", ckpt / "global_step_1")

    resumed = run_main(*RUN, f"reward_model.model.path={rm_path}", ckpt=ckpt, run_dir=tmp_path / "run2")
    assert resumed.returncode == 0, tail(resumed)
    assert f"resumed from {ckpt / 'global_step_1'} at step 1" in resumed.stdout + resumed.stderr
    ours, theirs = read_metrics(tmp_path / "run2"), read_metrics(reference / "run")
    assert [r["step"] for r in ours] == [2]
    assert {k: ours[0][k] for k in SAME} == {k: theirs[1][k] for k in SAME}
    final = "global_step_2/huggingface/model.safetensors"
    w_ours, w_theirs = load_file(ckpt / final), load_file(reference / "ckpt" / final)
    assert w_ours.keys() == w_theirs.keys()
    for k in w_theirs:
        torch.testing.assert_close(w_ours[k], w_theirs[k], rtol=0, atol=0)


# Every phase that halves its micro-batch after an OOM (workers/hybrid.py's @worker_phase(retried=True)).
RETRIED = ("generate", "reward_model", "old_log_prob", "ref", "values", "update_critic", "update_actor")


def test_injected_ooms_in_every_phase_are_recovered_with_identical_results(rm_path, reference, tmp_path):
    """Each phase halves its micro-batch once at step 1, keeps it for step 2 and re-runs the phase: the
    rewards, losses and final weights are the uninterrupted run's (the reference above)."""
    faulty = run_main(*RUN, f"reward_model.model.path={rm_path}", ckpt=tmp_path / "ckpt", run_dir=tmp_path / "run",
                      fault=",".join(f"oom@{p}:1" for p in RETRIED))
    assert faulty.returncode == 0, tail(faulty)
    assert "update_actor ran out of memory: actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu 2 -> 1" in \
        faulty.stdout + faulty.stderr

    a, b = read_metrics(reference / "run"), read_metrics(tmp_path / "run")
    for phase in RETRIED:
        clean = [r[f"perf/micro_size/{phase}"] for r in a]
        assert clean[0] >= 2 and clean == [clean[0]] * 2, (phase, clean)
        assert [r[f"perf/micro_size/{phase}"] for r in b] == [clean[0] // 2] * 2, phase
        assert [r[f"perf/oom_retries/{phase}"] for r in a] == [0, 0], phase
        assert [r[f"perf/oom_retries/{phase}"] for r in b] == [1, 1], phase  # counted once, at step 1
    for ra, rb in zip(a, b):
        for key in ("critic/score/mean", "reward_model/score/mean", "response_length/mean"):
            assert ra[key] == rb[key], key  # same responses, same rewards
        # <role>/loss is a mini-batch's loss however it was split (workers/update.py); pg_loss and
        # vf_loss are means over its micro-batches, which a halved micro-batch changes.
        for key in ("actor/loss", "critic/loss"):
            assert ra[key] == pytest.approx(rb[key], rel=1e-5, abs=1e-6), key
        assert ra["critic/grad_norm"] == pytest.approx(rb["critic/grad_norm"], rel=1e-4)
        assert ra["actor/grad_norm"] == pytest.approx(rb["actor/grad_norm"], rel=1e-4)
    final = "global_step_2/huggingface/model.safetensors"
    wa, wb = load_file(reference / "ckpt" / final), load_file(tmp_path / "ckpt" / final)
    # Halved micro-batches sum the same gradient in another order (float rounding, ~1e-7 relative);
    # AdamW divides by sqrt(v), which magnifies that for a component with a tiny second moment: up to
    # ~1e-5 in a weight after 2 steps here (seen: 1.5e-5 in 1 of 16384; with packed rows, whose halved
    # micro-batch also regroups the rows a matmul sees, 9.5e-5 in 1 of 45056). A micro-batch counted twice,
    # or dropped, moves the weights by the order of lr (5e-4), and most of them: so no weight may move by
    # half of lr, and at most 1 in 10,000 by more than a tenth of it.
    for k in wa:
        diff = (wb[k].float() - wa[k].float()).abs()
        assert diff.max() < 2.5e-4, (k, diff.max())
        assert (diff > 5e-5).sum() <= max(1, diff.numel() // 10_000), (k, (diff > 5e-5).sum())


def test_a_reward_model_without_its_tokenizer_is_refused_before_anything_starts(kk_role, tmp_path):
    # It re-renders rows with its own tokenizer (input_tokenizer is the actor's, verl's default): one line,
    # before Ray or a model starts, instead of every rank failing to load it.
    # main_ppo.py's checks in-process (check_main): the preflight's refusal path launches in tests/bad_inputs.
    rm = write_tiny_reward_model(tmp_path / "rm")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (rm / name).unlink(missing_ok=True)
    result = check_main(*RUN, f"reward_model.model.path={rm}", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                        f"hydra.run.dir={tmp_path / 'run'}")
    line = assert_refused(result, str(rm))
    assert line.startswith("error: reward_model.model.path") and line.endswith("copy the checkpoint's tokenizer files")
    assert not (tmp_path / "ckpt").exists()


def test_sp_1_padded_resumes_the_sp_2_runs_checkpoint_and_matches_its_step_2(rm_path, reference, tmp_path):
    """The SP 2 run's step-1 checkpoint resumed at SP 1, padded, without checkpointing, offload or budget:
    its step 2 generates the same responses (rollout is unchanged by SP), and scores, losses, gradient
    norms and the engine-vs-trainer log-prob gap are the SP 2 run's (packing and the sharded forwards
    differ only in float rounding): SP leaves rollout/logprob_diff at the non-SP level."""
    resumed = run_main(*RUN, f"reward_model.model.path={rm_path}", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
                       f"hydra.run.dir={tmp_path / 'run'}", f"{ARR}.model.use_remove_padding=false",
                       f"{ARR}.actor.ulysses_sequence_parallel_size=1",
                       f"{ARR}.model.enable_gradient_checkpointing=false",
                       f"{ARR}.actor.fsdp_config.param_offload=false",
                       f"{ARR}.actor.fsdp_config.optimizer_offload=false",
                       "critic.fsdp_config.param_offload=false", "critic.fsdp_config.optimizer_offload=false",
                       f"{ARR}.rollout.log_prob_use_dynamic_bsz=false",
                       f"trainer.resume_mode={reference / 'ckpt' / 'global_step_1'}")
    assert resumed.returncode == 0, tail(resumed)
    out = resumed.stdout + resumed.stderr
    assert f"resumed from {reference / 'ckpt' / 'global_step_1'} at step 1" in out
    assert "splits each row" not in out
    ours, theirs = read_metrics(tmp_path / "run"), read_metrics(reference / "run")
    assert [r["step"] for r in ours] == [2]
    ours, theirs = ours[0], theirs[1]
    for key in ("reward/rule_score/mean", "response_length/mean"):
        assert ours[key] == theirs[key], key  # the same responses
    for key in ("reward_model/score/mean", "critic/score/mean", "actor/pg_loss", "critic/vf_loss", "actor/loss",
                "critic/loss", "actor/grad_norm", "critic/grad_norm", "actor/reward_kl_penalty", "val/score"):
        assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), key
    assert ours["rollout/logprob_diff"] == pytest.approx(theirs["rollout/logprob_diff"], abs=1e-5)
