"""controller/worker_group.py failure(): a rank whose constructor raised is named with its exception, not as a
process that died (the kernel's OOM killer), though Ray hands back only the error's text."""

from ray.exceptions import RayActorError

from logicrl.controller.worker_group import WorkerFailed, failure

TRACEBACK = """The actor died because of an error raised in its creation task, ray::HybridWorker.__init__() (pid=1)
  File "/x/logicrl/workers/build.py", line 156, in build_models
    model = load(path)
_pickle.UnpicklingError: Weights only load failed. In PyTorch 2.6, we changed the default value of weights_only"""


def test_a_constructor_that_raised_is_named_by_its_exception():
    err = failure(0, "start-up", RayActorError(None, TRACEBACK, actor_init_failed=True), "127.0.0.1")
    assert isinstance(err, WorkerFailed)
    assert str(err) == ("rank 0 on node 127.0.0.1 failed in start-up: _pickle.UnpicklingError: Weights only load "
                        "failed. In PyTorch 2.6, we changed the default value of weights_only")


def test_a_process_that_died_is_still_said_to_have_died():
    err = failure(1, "generate", RayActorError(None, "The actor died unexpectedly", actor_init_failed=False))
    assert str(err).startswith("rank 1 died in generate: its process ended without an exception")
