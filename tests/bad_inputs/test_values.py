"""Values that used to pass validation and fail later, or never: each is now one `error:` line naming the
key and the fix, exit 2, before anything starts. In-process (`check_main`): the entry point's own checks,
without a launch; the entry point's wiring of the two refusals Hydra raises before main (a YAML file that
does not parse, a run directory it cannot make) is checked with one launch each."""

from __future__ import annotations

import pytest
import yaml

from logicrl.config.cli import yaml_error_line
from logicrl.config.phases import ARR
from tests.bad_inputs.conftest import refused, timed_main
from tests.conftest import ROLE_DATA, TINY_RUN, assert_refused, check_main

RC = "algorithm.rollout_correction"


@pytest.mark.parametrize("overrides, says", [
    # lr=inf passed `> 0`; the run then stopped at its divergence guard 19 s later.
    ([f"{ARR}.actor.optim.lr=inf"], [f"{ARR}.actor.optim.lr=inf must be a finite number > 0"]),
    ([f"{ARR}.actor.optim.lr=nan"], ["optim.lr=nan must be a finite number > 0"]),
    ([f"{ARR}.actor.optim.lr=-1e-6"], ["optim.lr=-1e-06 must be a finite number > 0"]),
    (["algorithm.filter_groups.max_num_gen_batches=-7"],
     ["algorithm.filter_groups.max_num_gen_batches=-7 must be >= 0"]),
    # YAML reads 0.5_2 as 0.52: one bound u means 1/u_u, here 1.92_0.52, which holds no ratio at all.
    ([f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold=0.5_2"],
     ["rollout_rs_threshold=0.52", "does not hold ratio 1", "quote it"]),
    ([f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold='2.0_0.5'"],
     ["rollout_rs_threshold=2.0_0.5", "band 2.0_0.5 does not hold ratio 1"]),
    # A band above 1 rejects the on-policy tokens (ratio 1) too.
    ([f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold='1.5_3'"], ["band 1.5_3 does not hold ratio 1"]),
    ([f"{ARR}.actor.policy_loss.clip_cov_lb=5", f"{ARR}.actor.policy_loss.clip_cov_ub=1"],
     ["clip_cov_lb=5.0 > ", "clip_cov_ub=1.0"]),
    (["trainer.experiment_name=../../../../x"], ["trainer.experiment_name='../../../../x'", "inside the output tree"]),
    (["trainer.project_name=/tmp/elsewhere"], ["trainer.project_name='/tmp/elsewhere'"]),
    (["trainer.default_local_dir="], ["trainer.default_local_dir is empty"]),
    # The key is named (OmegaConf's own error names none here: the line used to say "None").
    (["data.train_batch_size=${oops}"], ["data.train_batch_size: Interpolation key 'oops' not found"]),
    (["reward.timeout_s=0"], ["reward.timeout_s=0.0 must be a finite number > 0"]),
    (["algorithm.filter_groups.max_empty_rounds=0"], ["algorithm.filter_groups.max_empty_rounds=0 must be >= 1"]),
])
def test_a_value_that_cannot_work_is_refused_in_one_line(tmp_path, overrides, says):
    result = check_main(*ROLE_DATA, *TINY_RUN, *overrides, f"hydra.run.dir={tmp_path / 'run'}")
    assert_refused(result, *says)


@pytest.mark.parametrize("overrides", [
    [f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold='0.5_2.0'"],
    [f"{RC}.rollout_rs=token", f"{RC}.rollout_rs_threshold=2.0"],  # 1/2_2
    ["trainer.experiment_name=group/run-1"],  # a subdirectory stays inside the tree
])
def test_the_values_next_to_them_pass(tmp_path, overrides):
    result = check_main(*ROLE_DATA, *TINY_RUN, *overrides, f"hydra.run.dir={tmp_path / 'run'}",
                        f"trainer.default_local_dir={tmp_path / 'ckpt'}")
    assert result.code == 0, result.line


def test_a_yaml_syntax_error_names_the_file_and_line(tmp_path):
    from hydra import compose, initialize_config_dir

    bad = tmp_path / "bad.yaml"
    bad.write_text("data:\n  train_batch_size: 4\n   oops: [1\n")
    with pytest.raises(yaml.YAMLError) as raised, initialize_config_dir(str(tmp_path), version_base="1.3"):
        compose("bad")  # as Hydra reads a recipe or a conf/ group file
    line = yaml_error_line(raised.value)
    assert line.startswith(f"{bad} line 3, column 8: YAML syntax error: mapping values are not allowed here"), line


@pytest.mark.integration
def test_an_unwritable_run_directory_is_one_line(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")  # a file where the run directory's parent should be: no user can make it
    result, seconds = timed_main(*ROLE_DATA, *TINY_RUN, "trainer.dry_run=true", f"hydra.run.dir={blocker}/run")
    refused(result, seconds, f"hydra.run.dir: cannot write {blocker}", "set hydra.run.dir=", bound=15)


def test_a_damaged_trainer_state_names_the_file_and_the_checkpoint_that_reads(tmp_path):
    # Two checkpoints marked complete; the newest's trainer_state.json damaged after saving (its manifest's CRC
    # updated too, so only parsing finds it): refused before anything starts, naming the file and step 1.
    ckpt = tmp_path / "ckpt"
    for step, state in ((1, '{"format": 1, "step": 1}'), (2, '{"format": 1, "step": 2,,')):
        (ckpt / f"global_step_{step}").mkdir(parents=True)
        (ckpt / f"global_step_{step}" / "COMPLETE").write_text("")
        (ckpt / f"global_step_{step}" / "trainer_state.json").write_text(state)
    result = check_main(*ROLE_DATA, *TINY_RUN, f"trainer.default_local_dir={ckpt}", f"hydra.run.dir={tmp_path / 'run'}")
    assert_refused(result, f"{ckpt / 'global_step_2' / 'trainer_state.json'} does not read (JSONDecodeError: ",
                   "global_step_2 is marked complete", f"{ckpt / 'global_step_1'} is the newest other checkpoint whose "
                   f"state reads: move {ckpt / 'global_step_2'} aside",
                   "to start a new run, give it a directory of its own")


class _Code:
    def __reduce__(self):
        import os

        return (os.system, ("true",))


def test_weights_whose_pickle_torch_refuses_are_named_before_anything_starts(tmp_path, tiny_dir):
    # A model directory whose pytorch_model.bin pickles a call (os.system): torch's weights_only load refuses it,
    # inside the rank, which used to be reported as a process killed by the OOM killer.
    import shutil

    import torch
    from safetensors.torch import load_file

    model = tmp_path / "model"
    shutil.copytree(tiny_dir, model)
    state = {}
    for file in model.glob("*.safetensors"):
        state.update(load_file(file))
        file.unlink()
    torch.save({**state, "extra": _Code()}, model / "pytorch_model.bin")
    result = check_main(*ROLE_DATA, *TINY_RUN, f"{ARR}.model.path={model}", f"hydra.run.dir={tmp_path / 'run'}")
    assert_refused(result, f"{model / 'pytorch_model.bin'} names posix.system in its pickle, which is code, not "
                           "tensors", "convert the weights to safetensors")


def test_an_unwritable_model_cache_is_named_as_such(tmp_path, monkeypatch):
    # The embedded model is built into $LOGICRL_CACHE: one that cannot be made (under a file: even root cannot)
    # used to be reported as a tokenizer to copy.
    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("LOGICRL_CACHE", str(blocker / "cache"))
    result = check_main(*ROLE_DATA, *TINY_RUN, f"hydra.run.dir={tmp_path / 'run'}")
    assert_refused(result, f"{ARR}.model.path=embedded:tiny is built into the cache directory {blocker / 'cache'} "
                           "($LOGICRL_CACHE", "set LOGICRL_CACHE to a writable directory")


@pytest.mark.integration
def test_ctrl_c_while_the_config_is_checked_exits_130_quietly(tmp_path):
    import signal

    from tests.conftest import run_main
    from tests.helpers.signals import finish, one_error_line, wait_for

    proc = run_main(*ROLE_DATA, *TINY_RUN, f"hydra.run.dir={tmp_path / 'run'}",
                    f"trainer.default_local_dir={tmp_path / 'ckpt'}", popen=True)
    # Hydra has composed and written the run's config: main is validating and checking the inputs (seconds).
    wait_for(lambda: (tmp_path / "run" / ".hydra" / "config.yaml").is_file(), timeout=60)
    proc.send_signal(signal.SIGINT)
    returncode, _, err, _ = finish(proc)
    assert returncode == 130, err[-2000:]
    assert one_error_line(err).startswith("error: interrupted (Ctrl-C)"), err[-2000:]
