"""The pieces of the two-group loop that need no process: which group a call goes to, which phases each
group's worker runs, and which test faults reach the rollout ranks."""

from logicrl.controller.two_groups import TwoGroups
from logicrl.faults import Fault, Faults, parse
from logicrl.trainer.one_step_off import rollout_faults
from logicrl.workers.hybrid import HybridWorker
from logicrl.workers.rollout_worker import RolloutWorker
from logicrl.workers.trainer_worker import TrainerWorker


class Recording:
    def __init__(self, name):
        self.name, self.calls = name, []

    def __len__(self):
        return 3

    def call(self, method, *args, **kwargs):
        self.calls.append((method, kwargs.get("phase")))
        return [self.name]

    def dispatch(self, method, shards, **kwargs):
        return self.call(method, **kwargs)

    call_async = call
    dispatch_async = dispatch

    def shutdown(self):
        self.calls.append(("shutdown", None))


def test_the_engines_phase_goes_to_the_rollout_ranks_everything_else_to_the_trainers():
    trainer, rollout = Recording("trainer"), Recording("rollout")
    groups = TwoGroups(trainer, rollout)
    assert groups.dispatch("run", [None], phase="generate") == ["rollout"]
    assert groups.call_async("run", None, phase="generate") == ["rollout"]
    for phase in ("reward_model", "old_log_prob", "ref", "values", "update_actor", "update_critic"):
        assert groups.dispatch_async("run", [None], phase=phase) == ["trainer"]
    assert groups.call("save_checkpoint", "/ckpt", True, False) == ["trainer"]
    assert groups.call("resume_from", "/ckpt") == ["trainer"]
    assert len(groups) == 3
    groups.shutdown()
    assert trainer.calls[-1] == rollout.calls[-1] == ("shutdown", None)


def test_each_group_runs_only_the_phases_of_what_it_holds():
    assert set(HybridWorker.phases) == {"generate", "reward_model", "old_log_prob", "ref", "values", "update_critic",
                                        "update_actor", "update_weights"}
    assert set(TrainerWorker.phases) == set(HybridWorker.phases) - {"generate"}
    assert set(RolloutWorker.phases) == {"generate", "update_weights"}
    # The rollout rank's own generate (it stamps the weight version) and its receiving update_weights.
    assert RolloutWorker.phases["generate"].method is RolloutWorker._generate
    assert RolloutWorker.phases["update_weights"].method is RolloutWorker._update_weights
    assert TrainerWorker.phases["update_weights"].method is HybridWorker._update_weights


def test_rollout_ranks_are_numbered_after_the_trainers_in_test_faults():
    faults = Faults(parse("stall@update_weights:2@rank3,raise@generate:1,die@update_actor:2@rank1"))
    rollout = rollout_faults(faults, trainer_ranks=2)
    assert rollout.points == {("update_weights", 2, None): Fault("stall", 1), ("generate", 1, None): Fault("raise")}
    assert faults.points[("update_actor", 2, None)] == Fault("die", 1)  # the trainer group's, unchanged
