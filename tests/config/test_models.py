"""The model table (config/models.py): every row's keys are keys of the composed config, each role is in
use for the algorithms that need it, and the phase table and the readers agree with it."""

import pytest
from omegaconf import OmegaConf

from logicrl.config import compose, validate
from logicrl.config.models import BY_NAME, MODELS, TRAINED, in_use, model
from logicrl.config.phases import (
    FORWARD_PHASES,
    SIZED_PHASES,
    STEP,
    UPDATE_OF,
    UPDATE_PHASES,
    WORKER_PHASES,
)
from logicrl.config.sequence_parallel import model_sp_sizes

ARR = "actor_rollout_ref"
KEY_FIELDS = ("path_key", "sp_key", "packing_key", "offload_key", "optim_offload_key", "ckpt_key", "lr_key")
MISSING = object()


@pytest.fixture(scope="module")
def composed():
    return compose()


@pytest.mark.parametrize("role", MODELS, ids=lambda m: m.name)
def test_every_key_of_a_row_is_in_the_composed_config(composed, role):
    keys = [getattr(role, f) for f in KEY_FIELDS if getattr(role, f) is not None]
    assert [k for k in keys if OmegaConf.select(composed, k, default=MISSING) is MISSING] == []
    assert OmegaConf.select(composed, role.prefix) is not None  # its own group: batch sizes, fsdp_config
    # A role that trains has an optimizer, its offload and checkpointing; a frozen one has none of them.
    assert (role.lr_key is not None) == (role.optim_offload_key is not None) == (role.ckpt_key is not None) \
        == role.trains


@pytest.mark.parametrize(("overrides", "used"), [
    (["algorithm.adv_estimator=gae"], {"critic"}),
    (["algorithm.adv_estimator=grpo"], set()),
    (["algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=true"], {"ref"}),
    (["algorithm.adv_estimator=reinforce_plus_plus", "algorithm.use_kl_in_reward=true"], {"ref"}),
    (["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "reward_model.enable=true"],
     {"critic", "ref", "reward_model"}),
])
def test_in_use_per_algorithm(overrides, used):
    cfg = compose([f"{ARR}.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false", *overrides])
    assert in_use(cfg) == {m.name: m.name in used | {"actor"} for m in MODELS}
    assert all(model(name).in_use(cfg) == on for name, on in in_use(cfg).items())


def test_the_step_plan_runs_the_phases_of_the_models_in_use(data_files):
    cfg, _, plan = validate(compose([*data_files, "algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=true"]))
    used = in_use(cfg)
    assert (used["critic"], used["ref"]) == (False, True)
    assert plan.critic is None and plan.update("critic") is None and plan.update("actor") is plan.actor
    assert plan.runs("ref") and not plan.runs("values") and not plan.runs("update_critic")


def test_the_phase_table_speaks_of_the_model_table():
    for p in STEP:
        assert p.model in (None, "engine", *BY_NAME), p.name
        if p.backward:  # an update trains its model, and splits its rows
            assert model(p.model).trains and p.rows_key and not p.forward_only, p.name
    assert UPDATE_OF == {"critic": "update_critic", "actor": "update_actor"} and set(UPDATE_OF) == set(TRAINED)
    assert UPDATE_PHASES == ("update_critic", "update_actor")
    # The reward model may read the rows in its own tokens: its pass is not over the trainer's rows.
    assert FORWARD_PHASES == ("old_log_prob", "ref", "values")
    # Auto micro-batching tries the policy's passes first, then the other models', each in step order.
    assert SIZED_PHASES == ("generate", "old_log_prob", "ref", "update_actor", "reward_model", "values",
                            "update_critic")
    assert set(SIZED_PHASES) <= set(WORKER_PHASES)


def test_an_unknown_role_is_refused_in_one_line():
    with pytest.raises(KeyError, match="no model role 'value'; the roles are actor, ref, critic, reward_model"):
        model("value")


def test_sequence_parallel_sizes_are_read_by_the_rows_keys(composed):
    cfg = compose([f"{ARR}.actor.ulysses_sequence_parallel_size=4", "critic.ulysses_sequence_parallel_size=2"])
    # The reference and the reward model follow the actor's key in the YAML; the critic has its own here.
    assert model_sp_sizes(cfg) == {"actor": 4, "ref": 4, "critic": 2, "reward_model": 4}
    assert model_sp_sizes(composed) == dict.fromkeys(BY_NAME, 1)

