"""Separate rollout and trainer groups against the colocated run: does generation hide behind the update?

    .venv/bin/python benchmarks/one_step_off.py [--gen-s 1.0 --update-s 1.0 --steps 6] [--real] [override ...]

Part 1 (always): the real trainers and workers on the embedded tiny model, in this process, each group's
rank on a thread of its own (Ray's actor queue without Ray), with every generate call slowed by --gen-s and
every actor update by --update-s (sleeps: they release the GIL as a device would). The median step time of
the colocated run, of two groups at async_training.max_staleness=0 and at 1 is printed beside
gen + update (colocated's sum) and max(gen, update) (what overlap can reach; the sync and the rest add to
both). Part 2 (--real): the embedded task itself through main_ppo.py and Ray, colocated (1 rank) against
two groups (1 + 1 ranks, staleness 1), on this machine's cores, whichever wins: no sleeps.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
ARR = "actor_rollout_ref"
SMALL = ["data.train_batch_size=4", f"{ARR}.rollout.n=2", f"{ARR}.actor.ppo_mini_batch_size=4",
         "data.max_response_length=8", f"{ARR}.rollout.name=hf", "trainer.val_before_train=false",
         "trainer.test_freq=-1", "trainer.save_freq=-1", "trainer.logger=[jsonl]"]
SPLIT = [f"{ARR}.hybrid_engine=false"]


class Running:
    """One call on every rank of a ThreadGroup, issued: controller/pending.py's Pending."""

    def __init__(self, phase: str, futures: list):
        self.phase, self.futures = phase, futures

    def ready(self) -> bool:
        return all(f.done() for f in self.futures)

    def result(self) -> list:
        return [f.result() for f in self.futures]


def slowed(call, seconds: float):
    def wrapper(*args, **kwargs):
        time.sleep(seconds)
        return call(*args, **kwargs)
    return wrapper


def thread_group(gen_s: float, update_s: float) -> type:
    import logicrl.workers.phase_worker as phase_worker

    # The live-tensor tracker runs torch's profiler, one session per process: two ranks' threads would race for it.
    phase_worker.tracks_tensors = lambda step: False

    class ThreadGroup:
        """A one-rank worker group whose rank runs its calls in order on a thread of its own."""

        def __init__(self, worker_cls, n_ranks, use_cuda, nnodes=1, ray_address=None, **kwargs):
            from logicrl.controller.ports import free_port

            assert n_ranks == 1 and nnodes == 1, "one rank per group in this benchmark"
            kwargs["log_file"] = None
            self.pool = ThreadPoolExecutor(1)
            worker = self.pool.submit(lambda: worker_cls(rank=0, world_size=1, master_addr="127.0.0.1",
                                                         master_port=free_port("127.0.0.1"), **kwargs)).result()
            if worker.engine is not None:
                worker.engine.generate = slowed(worker.engine.generate, gen_s)
            if worker.models is not None:
                worker.models.actor.update = slowed(worker.models.actor.update, update_s)
            self.workers = [worker]

        def __len__(self):
            return 1

        def call_async(self, method, *args, **kwargs):
            return Running(kwargs.get("phase", method),
                           [self.pool.submit(lambda: getattr(self.workers[0], method)(*args, **kwargs))])

        def dispatch_async(self, method, shards, **kwargs):
            return Running(kwargs.get("phase", method),
                           [self.pool.submit(lambda: getattr(self.workers[0], method)(shards[0], **kwargs))])

        def call(self, method, *args, **kwargs):
            return self.call_async(method, *args, **kwargs).result()

        def dispatch(self, method, shards, **kwargs):
            return self.dispatch_async(method, shards, **kwargs).result()

        def shutdown(self):
            self.pool.shutdown()
            self.workers = []

    return ThreadGroup


def in_process(overrides: list[str], root: Path, gen_s: float, update_s: float) -> list[dict]:
    from logicrl.config import compose, validate
    from logicrl.preflight.memory import check_memory
    from logicrl.trainer.one_step_off import trainer_class
    from tests.conftest import ROLE_DATA

    cfg, spec, plan = validate(compose([*ROLE_DATA, *overrides, f"trainer.default_local_dir={root / 'ckpt'}"]))
    plan = check_memory(cfg, spec, plan).plan
    trainer_class(cfg)(cfg, plan, root / "run", group_cls=thread_group(gen_s, update_s)).fit()
    return [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]


def launched(overrides: list[str], root: Path) -> list[dict]:
    argv = [sys.executable, str(ROOT / "main_ppo.py"), *overrides, f"trainer.default_local_dir={root / 'ckpt'}",
            f"hydra.run.dir={root / 'run'}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
            "trainer.test_freq=-1", "trainer.save_freq=-1"]
    result = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        sys.exit(f"main_ppo.py {' '.join(overrides)} failed:\n{result.stderr[-3000:]}")
    return [json.loads(line) for line in (root / "run" / "metrics.jsonl").read_text().splitlines()]


def median(rows: list[dict], key: str) -> float:
    """The median over the steps after the first (it holds start-up: the first sync, warm caches)."""
    values = [r[key] for r in rows[1:] if key in r] or [r[key] for r in rows if key in r]
    return statistics.median(values) if values else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gen-s", type=float, default=1.0)
    parser.add_argument("--update-s", type=float, default=1.0)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--real", action="store_true", help="also the embedded task through main_ppo.py and Ray")
    args, overrides = parser.parse_known_args()
    import torch

    torch.set_num_threads(1)  # each rank's thread one core, as run_main's ranks have
    steps = [f"trainer.total_training_steps={args.steps}"]
    print(f"part 1: generation slowed by {args.gen_s} s, the actor update by {args.update_s} s, {args.steps} steps")
    print(f"{'run':<22} {'step s':>8} {'generate':>9} {'wait_gen':>9} {'update':>8} {'sync':>7} "
          f"{'trainer idle':>12} {'rollout idle':>12}")
    for name, extra in (("colocated", []), ("two groups, stale 0", [*SPLIT, "async_training.max_staleness=0"]),
                        ("two groups, stale 1", [*SPLIT, "async_training.max_staleness=1"])):
        with tempfile.TemporaryDirectory() as tmp:
            rows = in_process([*SMALL, *steps, *extra, *overrides], Path(tmp), args.gen_s, args.update_s)
        print(f"{name:<22} {median(rows, 'timing_s/step'):>8.3f} {median(rows, 'timing_s/generate'):>9.3f} "
              f"{median(rows, 'timing_s/wait_prev_gen'):>9.3f} {median(rows, 'timing_s/update_actor'):>8.3f} "
              f"{median(rows, 'timing_s/sync_weights') or median(rows, 'timing_s/update_weights'):>7.3f} "
              f"{median(rows, 'perf/trainer_idle_ratio'):>12.2f} {median(rows, 'perf/rollout_idle_ratio'):>12.2f}")
    print(f"gen + update = {args.gen_s + args.update_s:.3f} s; max(gen, update) = "
          f"{max(args.gen_s, args.update_s):.3f} s (each plus the step's real work)")
    if not args.real:
        return
    print(f"part 2: the embedded task (the conf defaults and the overrides given), {args.steps} steps through "
          "main_ppo.py and Ray, no sleeps")
    for name, extra in (("colocated, 1 rank", []), ("two groups, 1 + 1, stale 1", SPLIT)):
        with tempfile.TemporaryDirectory() as tmp:
            rows = launched([*steps, *extra, *overrides], Path(tmp))
        print(f"{name:<28} step {median(rows, 'timing_s/step'):.3f} s (median of steps 2-{args.steps}), generate "
              f"{median(rows, 'timing_s/generate'):.3f} s, update_actor {median(rows, 'timing_s/update_actor'):.3f} s")


if __name__ == "__main__":
    main()
