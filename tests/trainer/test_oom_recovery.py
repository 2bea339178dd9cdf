"""An OOM at a micro-batch of one ends the run with a one-line message, exit code 3, and the last
checkpoint intact. (Recovery from OOMs in every phase, with the same result as a run without them:
tests/trainer/test_reward_model_train.py, which shares that run's reference.)
"""

import pytest

from logicrl.config.phases import ARR
from tests.conftest import ROLE_DATA, TINY_RUN, run_main, tail

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kk_role")]
RUN = [*ROLE_DATA, *TINY_RUN, f"{ARR}.rollout.n=4", "trainer.total_training_steps=3"]


def train(tmp_path, name, *extra, fault=None):
    return run_main(*RUN, *extra, f"hydra.run.dir={tmp_path / name}",
                    f"trainer.default_local_dir={tmp_path / name / 'ckpt'}", fault=fault, cwd=tmp_path)


def test_oom_at_a_micro_batch_of_one_exits_cleanly_with_the_checkpoint_intact(tmp_path):
    result = train(tmp_path, "tiny", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1", "trainer.save_freq=1",
                   fault="oom@update_actor:2")
    assert result.returncode == 3, tail(result)
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: update_actor ran out of memory with "
                           "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1"), last
    ckpt = tmp_path / "tiny" / "ckpt"
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "1"
    assert (ckpt / "global_step_1" / "COMPLETE").is_file()
