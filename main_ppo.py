"""logicrl entry point: compose -> validate (and plan) -> preflight -> run.

    python main_ppo.py                                   # the embedded default: GRPO on a tiny model, CPU
    python main_ppo.py +recipe=stage1 trainer.n_gpus=4   # a Logic-RL phase
    python main_ppo.py trainer.dry_run=true              # validate and print the plan, load nothing
    python main_ppo.py +recipe=logic_rl                  # a staged curriculum (3 to 7 people), resumable

A bad input, or a memory plan that does not fit, is one line on stderr and exit code 2 before Ray or
any model is touched (logicrl/preflight/). Every later failure also ends in one line and an exit code
of its own (the EXIT_* constants below; docs/faults.md has the table), with the checkpoints intact.
HYDRA_FULL_ERROR=1 or trainer.verbose=true also print the traceback.
"""

import datetime
import errno
import os
import signal
import sys
import traceback
from contextlib import ExitStack
from pathlib import Path

import hydra
import yaml
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf

from logicrl.checkpoint_layout import holds_checkpoints, newest_resumable
from logicrl.config import check_overrides, validate
from logicrl.config.cli import hydra_error_line, yaml_error_line
from logicrl.config.evaluation import eval_runs, eval_targets
from logicrl.config.sizing import sizing_note
from logicrl.config.stages import Stage, build_stages, has_stages
from logicrl.config.summary import summarize
from logicrl.errors import BadInput
from logicrl.launch.sweep import register_resolver
from logicrl.memory.fit import DoesNotFit
from logicrl.preflight import Plans, preflight
from logicrl.run_lock import one_run_per_directory
from logicrl.timeplan.report import plan_line, time_plan, time_report

EXIT_CONFIG = 2
EXIT_OOM = 3  # out of memory with nothing left to halve; the last checkpoint is intact
# A rank ran out of memory inside FSDP2's collectives: the run ended rather than hang, the halved
# micro-batch is saved (trainer/micro_sizes.py); the same command resumes with it.
EXIT_OOM_RESUME = 4
EXIT_FAILED = 1  # a rank raised or died: one line here, the traceback in the run's log
# The run diverged: trainer.max_nonfinite_steps non-finite steps in a row, or NaN/inf weights at a save.
# Nothing was saved from them; re-running as is would diverge again, so it is not a resumable code.
EXIT_DIVERGED = 5
EXIT_SIGINT, EXIT_SIGTERM = 130, 143  # the shell's 128 + signal number
# Stopped by SIGUSR1/SIGTERM at a step boundary with a checkpoint, or by SIGUSR1 before training:
# resumable, so slurm/train.sbatch requeues the job (EX_TEMPFAIL: "try again later").
EXIT_PREEMPTED = 75
# A file system that refuses a write: what an OSError escaping the run is said to be (any other is a bug's).
DISK_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM)
# The user's own HYDRA_FULL_ERROR: __main__ sets it for Hydra (see there) and keeps the user's value in
# LOGICRL_FULL_ERROR, for this process and for what inherits its environment (a submitit sweep job).
FULL_ERROR = os.environ.get("LOGICRL_FULL_ERROR", os.environ.get("HYDRA_FULL_ERROR")) == "1"
# Hydra has composed the config and made the run's directory: an OSError before this is the directory's.
STARTED = False


class Ended(Exception):
    """The run ends with `code` and one line for stderr. A single run prints it and exits; a sweep
    job records it as its outcome, so the other jobs run (logicrl/launch/sweep.py)."""

    def __init__(self, code: int, line: str, cause: BaseException | None = None):
        super().__init__(line)
        self.code, self.line, self.cause = code, line, cause


def fail(err: BadInput) -> None:
    raise Ended(EXIT_CONFIG, f"error: {err}", err)


@hydra.main(config_path="conf", config_name="ppo_trainer", version_base="1.3")
def main(cfg: DictConfig) -> None:
    global STARTED
    STARTED = True
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode != RunMode.MULTIRUN:
        try:
            run(cfg, hydra_cfg)
        except Ended as end:
            print(end.line, file=sys.stderr)
            sys.exit(end.code)
        return
    from logicrl.launch.sweep import job_name, swept_from_env, write_result

    task = overrides_of(hydra_cfg)
    # Sweep jobs must not resume from each other's checkpoints: each combination gets its own
    # directory, named by its swept values, so re-running the sweep resumes every job from its own.
    cfg.trainer.default_local_dir = f"{cfg.trainer.default_local_dir}/{job_name(task, swept_from_env())}"
    job = dict(job=job_name(task, swept_from_env()), num=hydra_cfg.job.num, overrides=task,
               dry_run=bool(cfg.trainer.dry_run))
    job_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        plans = run(cfg, hydra_cfg)
    except Ended as end:
        if end.code in (EXIT_SIGINT, EXIT_SIGTERM, EXIT_PREEMPTED):  # the whole sweep was asked to stop
            print(end.line, file=sys.stderr)
            sys.exit(end.code)
        print(end.line, file=sys.stderr)  # this job's outcome; the sweep goes on
        refused = isinstance(end.cause, DoesNotFit)
        write_result(job_dir, **job, status="refused" if refused else "failed", detail=end.line.removeprefix("error: "),
                     knobs=end.cause.knobs if refused else [], planned_peak_gb=end.cause.peaks_gb if refused else {},
                     code=end.code)
        return
    # The device's capacity: what the summary marks beside the memory bars.
    write_result(job_dir, **job, status="done", planned_peak_gb=plans.peaks_gb, code=0, device=plans.device,
                 capacity_gb=round(plans.capacity_gb, 3))


def run(cfg: DictConfig, hydra_cfg) -> Plans:
    """Validate, plan, check the inputs, then train (unless a dry run). Returns the plans (the planned peak
    per phase in GB, the largest over a curriculum's stages: .peaks_gb); raises Ended."""
    curriculum = has_stages(cfg)
    runs, plans, finished = checked(cfg, overrides_of(hydra_cfg))
    dry_run = runs[0].cfg.trainer.dry_run
    time_plans = {}  # stage index -> its time plan (logicrl/timeplan/)
    for stage, planned in zip(runs, plans.stages):
        stage.plan = planned.plan  # with trainer.auto_micro_batch's picks and the resolved grad_accumulation
        if curriculum or len(runs) > 1:
            print(f"==== {'stage' if curriculum else 'checkpoint'} {stage.index + 1}/{len(runs)}: {stage.name}")
        if dry_run:
            print(OmegaConf.to_yaml(stage.cfg))
        print(summarize(stage.cfg, stage.spec, stage.plan, planned.table))
        if not stage.cfg.trainer.val_only:  # beside the memory plan: seconds per phase, per step, in all
            # A curriculum's stages run one after another: each ETA counts the stages before it.
            after_s = sum(p.step_s * runs[i].plan.total_steps for i, p in time_plans.items() if p)
            time_plans[stage.index] = planned_time(stage, planned.memory.inputs.device, after_s)
        if note := sizing_note(stage.cfg, stage.spec, on_cpu=planned.memory.inputs.device == "cpu"):
            print(note, flush=True)
    if dry_run:
        # What a launch would refuse, after the plan it would have run: the first ends the run (exit 2), as at
        # a launch; any later one is said before it.
        refusals = [err for planned in plans.stages for err in planned.refusals]
        for err in refusals[1:]:
            print(f"error: {err}", file=sys.stderr)
        if refusals:
            fail(refusals[0])
        return plans
    # Heavy imports (torch, Ray, transformers) only once the config is known to be good.
    from logicrl.logs import pin_ray_auth

    # Before Ray is imported: it reads RAY_AUTH_MODE once (logicrl/logs.py).
    pin_ray_auth(joining=bool(cfg.trainer.ray_address or os.environ.get("RAY_ADDRESS")))
    from logicrl.controller import cluster  # imports Ray
    from logicrl.controller.cluster import ClusterLost, stop_ray
    from logicrl.controller.worker_group import WorkerFailed
    from logicrl.faults import Faults
    from logicrl.logs import run_log_file
    from logicrl.signals import Preempted, stop_request_of
    from logicrl.trainer.checkpoint import SaveFailed
    from logicrl.trainer.divergence import Diverged
    from logicrl.trainer.micro_sizes import OutOfMemoryOnRank
    from logicrl.workers.oom import OutOfMemoryAtMinimum

    run_dir = Path(hydra_cfg.runtime.output_dir)
    held = ExitStack()  # the checkpoint directory's lock, released after Ray is stopped (logicrl/run_lock.py)
    try:
        held.enter_context(one_run_per_directory(cfg.trainer.default_local_dir))
    except BadInput as err:
        fail(err)
    cluster.dashboard = bool(cfg.trainer.ray_dashboard)
    cluster.resume_hint = lambda: resume_hint(cfg, newest=True)  # for the GCS watch's own line
    faults = Faults.from_env()  # test-only fault injection, read once and passed down
    show_all = cfg.trainer.verbose or FULL_ERROR
    try:
        if curriculum:
            from logicrl.trainer.curriculum import run_curriculum

            run_curriculum(runs, Path(cfg.trainer.default_local_dir), run_dir,
                           carry_optimizer=cfg.curriculum.carry_optimizer,
                           resume=cfg.trainer.resume_mode != "disable", faults=faults, done=finished)
        elif runs[0].cfg.trainer.val_only:
            from logicrl.trainer.evaluation import run_evaluation

            run_evaluation(runs, eval_targets(cfg), run_dir, faults=faults)
        else:
            from logicrl.trainer.one_step_off import trainer_class

            trainer_class(runs[0].cfg)(runs[0].cfg, runs[0].plan, run_dir, faults=faults).fit()
        from logicrl.memory.report import memory_report

        # The plan checked against the run, phase by phase (and again at the lengths the run saw).
        if table := memory_report(plans.peaks_gb, run_dir, plans.peaks_gb_at):
            print(table)
        for stage in runs:  # the time plan checked the same way, per stage
            where = run_dir / stage.dir_name if curriculum else run_dir
            planned = time_plans.get(stage.index)
            if planned and (table := time_report(planned.compared, where, planned.step_s)):
                print(table)
    except BadInput as err:  # one the preflight could not see (e.g. a row past the sampled ones)
        fail(err)
    except Diverged as err:  # its line names the lr to lower and the last (finite) checkpoint
        raise Ended(EXIT_DIVERGED, f"error: {err}", err) from None
    except OutOfMemoryOnRank as err:  # its line names the rank, phase, saved size and checkpoint
        keep_traceback(run_log_file(run_dir), err)  # the rank's own traceback, for the curious
        raise Ended(EXIT_OOM_RESUME, f"error: {err}", err) from None
    except SaveFailed as err:  # a full disk or read-only directory: its line names the cause and what is intact
        keep_traceback(run_log_file(run_dir), err)
        stop(err, str(err), EXIT_FAILED, show_all)
    except WorkerFailed as err:
        lost_to_signal(err, cfg)
        if isinstance(err.cause, OutOfMemoryAtMinimum):  # its message names the knob and the checkpoint
            raise Ended(EXIT_OOM, f"error: {str(err.cause).splitlines()[0]}", err) from None
        stop(err, f"{err} (traceback in {keep_traceback(run_log_file(run_dir), err)})", EXIT_FAILED, show_all)
    except ClusterLost as err:  # its line names the GCS, its log and what to do
        lost_to_signal(err, cfg)
        raise Ended(EXIT_FAILED, f"error: {err}", err) from None
    except Preempted as err:
        raise Ended(EXIT_PREEMPTED, f"logicrl: {err}; run the same command (or requeue the job) to resume",
                    err) from None
    except KeyboardInterrupt as err:  # Stopped is one; inside a Ray wait it comes out as a plain one
        stopped = stop_request_of(err)
        if stopped is None:
            stop(err, f"interrupted (Ctrl-C); {resume_hint(cfg)}", EXIT_SIGINT, show_all)
        stop(err, f"stopped by {stopped}; {resume_hint(cfg)}", stopped_code(stopped), show_all)
    except OSError as err:
        if err.errno not in DISK_ERRNOS:
            raise
        # The run directory's files (metrics.jsonl, logs, samples): checkpoint writes fail as SaveFailed above.
        why = "the disk is full: free space there" if err.errno in (errno.ENOSPC, errno.EDQUOT) else \
            "it is not writable: fix its permissions or point hydra.run.dir elsewhere"
        stop(err, f"cannot write {err.filename or run_dir} ({err.strerror}): {why}; {resume_hint(cfg, newest=True)}",
             EXIT_FAILED, show_all)
    finally:
        # Multirun jobs share this process: each must start its own Ray cluster from scratch. Also
        # after a signal in the middle of ray.init, when Ray has processes but is not initialised.
        stop_ray()
        held.close()
    return plans


def planned_time(stage: Stage, device: str, after_s: float = 0.0):
    """The stage's time plan, its line printed (its ETA `after_s` seconds later than its own run would end);
    never in the way of a run (no plan: one line saying why)."""
    try:
        plan = time_plan(stage.cfg, stage.spec, stage.plan, device)
    except Exception as err:  # noqa: BLE001 - a prediction must not stop a run that the checks let through
        print(f"time plan: none ({type(err).__name__}: {err})", flush=True)
        return None
    start = datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=after_s)
    print(plan_line(plan, stage.plan.total_steps, start), flush=True)
    return plan


def lost_to_signal(err: BaseException, cfg: DictConfig) -> None:
    """A stop request was being honoured when the cluster failed: the signal reached Ray's processes
    too (a whole container, cgroup or job step was signalled: `docker stop`, SLURM's time limit), so
    the step in flight is lost. Say that, not the rank's or the GCS's death it caused."""
    from logicrl.controller import cluster
    from logicrl.signals import requested

    if (signum := requested()) is not None:
        raise Ended(cluster.signalled_code(signum), f"error: {cluster.signalled_line(signum)}", err) from None


def overrides_of(hydra_cfg) -> list[str]:
    """The command line's overrides as typed: a value that is a broken interpolation (`key=${oops}`) reaches
    validation, which names its key, instead of failing here as it is read."""
    return OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)


def checked(cfg: DictConfig, task: list[str]) -> tuple[list[Stage], Plans, dict]:
    """Everything decided before Ray or a model starts: every stage validated and through the preflight,
    then a curriculum's record of finished stages read ({} for a plain run or a dry run). Raises Ended
    (exit 2, one line) on a bad input; tests call it in-process (tests/conftest.py check_main)."""
    try:
        # Every stage is composed and validated now, so stage 5's typo stops stage 1 from starting.
        curriculum = has_stages(cfg)
        if curriculum:
            runs = build_stages(cfg, task)
        elif cfg.trainer.val_only:  # an evaluation: one run per eval.checkpoints entry (config/evaluation.py)
            runs, _ = eval_runs(cfg)
        else:
            runs = [Stage(0, "", *validate(cfg))]
        # Memory plans, device, data, directories and disk, model directories: every stage's,
        # before any starts; directories are made only once all passed (logicrl/preflight/).
        plans = preflight(runs)
        finished = {}
        if curriculum and not runs[0].cfg.trainer.dry_run:
            # A finished stage edited since is refused here, before Ray and torch are imported.
            from logicrl.trainer.curriculum import finished_stages

            finished = finished_stages(runs, Path(cfg.trainer.default_local_dir),
                                       resume=cfg.trainer.resume_mode != "disable")
        return runs, plans, finished
    except BadInput as err:
        fail(err)


def stopped_code(err: BaseException) -> int:
    """A stop request from the scheduler (SIGUSR1) is resumable: requeue; SIGTERM is the shell's 143."""
    return EXIT_PREEMPTED if getattr(err, "signum", None) == signal.SIGUSR1 else EXIT_SIGTERM


def resume_hint(cfg: DictConfig, newest: bool = False) -> str:
    root = cfg.trainer.default_local_dir
    if not holds_checkpoints(root):
        return f"no checkpoint under {root} yet: the same command starts over"
    if newest and (found := newest_resumable(root)) is not None:  # a curriculum's are in stage directories
        return f"{found} is intact: run the same command to resume from it"
    return f"checkpoints under {root} are intact: run the same command to resume"


def keep_traceback(log_file: Path, err: BaseException) -> Path:
    """Append the whole story (the rank's own traceback is in the cause's text) to the run's log."""
    with open(log_file, "a") as f:
        f.write("".join(traceback.format_exception(err)))
    return log_file


def stop(err: BaseException, line: str, code: int, show_all: bool) -> None:
    if show_all:
        traceback.print_exception(err, file=sys.stderr)
    raise Ended(code, f"error: {line}", err) from None


if __name__ == "__main__":
    from logicrl.signals import Stopped, stop_on_signals

    # From the start: SIGUSR1's default action would kill the driver and orphan its Ray processes.
    stop_on_signals()
    try:
        # Keys only today's verl has come back as ++key=value, so Hydra's struct mode lets them
        # through to validation, which maps, ignores or refuses each (config/verl_keys.py).
        sys.argv[1:] = check_overrides(sys.argv[1:])
        register_resolver()  # names sweep jobs' directories (conf/ppo_trainer.yaml: hydra.sweep.subdir)
        # Hydra prints an override it cannot compose (`+key` on a set key, an index past a list's
        # end) as several lines and exits 1; with HYDRA_FULL_ERROR it raises instead, so the error
        # reaches the handler below and becomes one line with exit 2.
        os.environ.setdefault("LOGICRL_FULL_ERROR", "1" if FULL_ERROR else "0")
        os.environ["HYDRA_FULL_ERROR"] = "1"
        main()
    except BadInput as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except HydraException as err:
        if FULL_ERROR:
            traceback.print_exc()
        print(f"error: {BadInput(hydra_error_line(err))}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except yaml.YAMLError as err:  # a recipe or conf/ file that does not parse (Hydra reads them as it composes)
        print(f"error: {yaml_error_line(err)}", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except OSError as err:
        if STARTED:
            raise
        # Hydra makes hydra.run.dir (and writes .hydra/ there) before the run starts.
        print(f"error: hydra.run.dir: cannot write {err.filename or 'the run directory'} ({err.strerror or err}): "
              "set hydra.run.dir=<a writable directory>", file=sys.stderr)
        sys.exit(EXIT_CONFIG)
    except Stopped as err:  # before any model or Ray started: nothing to save
        print(f"error: stopped by {err} before training started", file=sys.stderr)
        sys.exit(stopped_code(err))
    except KeyboardInterrupt:  # Ctrl-C while the config was checked or the imports ran: nothing started yet
        print("error: interrupted (Ctrl-C) before training started; nothing was written", file=sys.stderr)
        sys.exit(EXIT_SIGINT)
    from logicrl.launch import sweep

    if sweep.NOT_DONE:  # a sweep with jobs that did not finish: its summary says which and why
        sys.exit(EXIT_FAILED)
