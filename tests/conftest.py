"""Shared set-up for every tier: the one launcher of the real entry point (`run_main`), the one tiny
run (`TINY_RUN`), the K&K role data's fixture, and what a failed run shows (`tail`).

Tiers (markers in pyproject.toml): a bare `pytest` runs unit tests only, in-process and fast;
`integration` starts main_ppo.py, Ray or worker processes (make test); `slow` proves learning
(make test-all); `gpu` needs CUDA and skips cleanly without it (make test-gpu). A test that starts
a Python process without one of those markers fails and says so (`guard_unit_tier`).
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from logicrl.config import compose
from logicrl.config.phases import ARR
from logicrl.config.stages import build_stages, has_stages
from tests.helpers import launcher, pip_resolution

ROOT = Path(__file__).resolve().parents[1]
ROLE = ROOT / "data" / "kk_role"
ROLE_DATA = [f"data.train_files={ROLE}/train.parquet", f"data.val_files={ROLE}/test.parquet"]
# The tiny run most integration tests start from: 2 steps of 4 prompts x n=2 on the embedded tiny
# model, 4-token responses, one mini-batch per step, the HF engine (vLLM's start-up costs ~7 s a
# rank; tests about vLLM say rollout.name=vllm), metrics in metrics.jsonl and no validation. A test
# adds what it is about after it: later overrides of the same key win. preset=embedded: the embedded
# default's values also where a test points it at another tiny checkpoint (which would select verl's).
# No live-tensor peaks (trainer.track_tensor_peaks): step 1 would scan every Python object of each rank
# before each phase, a second or two each; the tests of those peaks turn it back on. No curves.png
# (trainer.plot_curves): matplotlib's import and drawing, 1-2 CPU s of each launch's driver.
TINY_RUN = ["preset=embedded", "data.train_batch_size=4", f"{ARR}.rollout.n=2", f"{ARR}.actor.ppo_mini_batch_size=4",
            "data.max_response_length=4", "trainer.total_training_steps=2", f"{ARR}.rollout.name=hf",
            "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.test_freq=-1",
            "trainer.track_tensor_peaks=false", "trainer.plot_curves=false"]
# Tiers whose tests may start processes (the unit tier may not: see guard_unit_tier).
PROCESS_TIERS = ("integration", "slow", "gpu")


def pytest_collection_modifyitems(config, items):
    # make test runs on two xdist workers, each taking one module at a time (the scheduler below), in
    # this order: the SLURM modules (minutes of waiting on the daemons), then the other integration
    # modules, most tests that launch first, then the unit modules, which fill in the end. Module order
    # only: a module's tests stay together and in their own order (a module of in-process checks with a
    # real launch among them sorts by its launches, not its size).
    launches = collections.Counter(item.nodeid.split("::")[0] for item in items
                                   if any(item.get_closest_marker(tier) for tier in PROCESS_TIERS))

    def rank(item):
        module = item.nodeid.split("::")[0]
        return (scope(item.nodeid) != "tests/slurm", not launches[module], -launches[module], module)

    items.sort(key=rank)
    gpu_items = [item for item in items if "gpu" in item.keywords]
    if not gpu_items:
        return
    import torch  # only paid for when a gpu test was selected

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in gpu_items:
            item.add_marker(skip)


def scope(nodeid: str) -> str:
    """The unit of work an xdist worker takes whole: the test's module, or all of tests/slurm (one
    session cluster, one worker)."""
    module = nodeid.split("::")[0]
    return "tests/slurm" if module.startswith("tests/slurm/") else module


@pytest.hookimpl(optionalhook=True)  # an xdist hook: a pytest without xdist must not refuse it
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadscope` by scope() above (pytest 9 ignores xdist_group marks: xdist 3.8 renames the
    node ids that pytest 9 no longer reads), so module-scoped runs are made once."""
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ByScope(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return scope(nodeid)

    return ByScope(config, log)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """In the xdist controller, for each worker: the CUDA install's pip resolution, a minute of waiting on the
    registry, starts now in the controller's own thread (tests/helpers/pip_resolution.py)."""
    node.workerinput["logicrl_pip_resolution"] = pip_resolution.start_early(node.config)


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist)
        pip_resolution.stop_early()


@pytest.fixture(autouse=True)
def guard_unit_tier(request, monkeypatch):
    """Keeps the default tier honest: a test without a process tier's marker that starts a Python
    process (main_ppo.py, a Ray node, torch's spawned ranks, vLLM's helpers) fails after it ran,
    naming the marker to add. The process still starts (failing inside a library's start-up could
    hang it); short helper processes (make, nvidia-smi, git) are not counted."""
    if any(request.node.get_closest_marker(tier) for tier in PROCESS_TIERS):
        yield
        return
    import _posixsubprocess

    real, started = _posixsubprocess.fork_exec, []

    def fork_exec(args, executable_list, *rest):
        # args is argv ([b"python", "main_ppo.py", ...]); executable_list the paths tried.
        names = [os.path.basename(os.fsdecode(a)) for a in [*(args or [])[:1], *(executable_list or [])]]
        if any(name.startswith("python") or name == "ray" for name in names):
            started.append(" ".join(map(os.fsdecode, args or []))[:200])
        return real(args, executable_list, *rest)

    # subprocess keeps its own reference; multiprocessing's spawn (torch's mp.spawn) reads the module's.
    monkeypatch.setattr(subprocess, "_fork_exec", fork_exec)
    monkeypatch.setattr(_posixsubprocess, "fork_exec", fork_exec)
    # A rank forked by a running forkserver (tests/helpers/spawn.py) starts no executable: count it here.
    from multiprocessing import forkserver

    connect = forkserver.ForkServer.connect_to_new_process

    def forked(server, fds):
        started.append("a rank forked by tests/helpers/spawn.py's forkserver")
        return connect(server, fds)

    monkeypatch.setattr(forkserver.ForkServer, "connect_to_new_process", forked)
    # A run forked by run_main's launch server (tests/helpers/launcher.py) starts no executable either.
    monkeypatch.setattr(launcher, "launch", lambda argv, *rest: started.append(f"main_ppo.py {' '.join(argv)}"[:200]))
    yield
    if started:
        pytest.fail(f"{request.node.nodeid} started {started[0]!r}: a unit test starts no process; mark it "
                    "integration (pytestmark = pytest.mark.integration)", pytrace=False)


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A fresh tiny-model cache directory (tokenizer built from scratch) per test module."""
    return tmp_path_factory.mktemp("logicrl-cache")


@pytest.fixture(scope="module")
def tokenizer(cache):
    from logicrl.models.tiny import load_tiny_tokenizer

    return load_tiny_tokenizer(cache)


def need_data(name: str = "kk_role") -> Path:
    """data/<name>, or the test skips saying how to build it (the Makefile's `data` target)."""
    if not (ROOT / "data" / name / "train.parquet").is_file():
        pytest.skip(f"data/{name} is missing: run `make data`")
    return ROOT / "data" / name


@pytest.fixture(scope="session")
def kk_role() -> list[str]:
    """ROLE_DATA, the overrides that train and validate on data/kk_role; skips where it is not built."""
    need_data("kk_role")
    return ROLE_DATA


@pytest.fixture(scope="session")
def tiny_rm() -> Path:
    """The embedded reward model's checkpoint (embedded:tiny_rm), built once per test run: 83 s of
    training on 2 idle cores the first time, then read from the cache root ($LOGICRL_CACHE or
    ~/.cache/logicrl), where main_ppo.py and its workers find it too."""
    from logicrl.models.loading import checkpoint_dir
    from logicrl.models.tiny import EMBEDDED_TINY_RM

    return checkpoint_dir(EMBEDDED_TINY_RM)


def row(i: int = 0, **fields) -> dict:
    """One kk_role row (prompt i, a rule reward), `fields` replacing or adding keys."""
    base = {"prompt": [{"role": "user", "content": f"puzzle {i}"}], "data_source": "kk_role",
            "reward_model": {"style": "rule", "ground_truth": {"name": "Zoey", "role": "knight"}}}
    return {**base, **fields}


def write_jsonl(path: Path, rows: int) -> Path:
    """`rows` kk_role rows (row(0) ... row(rows - 1)) as a jsonl file at `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row(i)) + "\n" for i in range(rows)))
    return path


@pytest.fixture
def stage_files(tmp_path) -> dict[str, str]:
    """Three 40-row jsonl sets (a, b, val) for two-stage curricula (tests/config/test_stages.py two_stages)."""
    return {name: str(write_jsonl(tmp_path / f"{name}.jsonl", 40)) for name in ("a", "b", "val")}


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> list[str]:
    """data.train_files / data.val_files overrides for one 20-row jsonl set, written once per module."""
    path = write_jsonl(tmp_path_factory.mktemp("data") / "train.jsonl", 20)
    return [f"data.train_files={path}", f"data.val_files={path}"]


def two_stages(files: dict[str, str], *extra: str) -> list[str]:
    """A base config and its curriculum as overrides (what a recipe holds), then `extra`."""
    return [f"data.train_files={files['a']}", f"data.val_files={files['val']}",
            "data.train_batch_size=8", f"{ARR}.actor.ppo_mini_batch_size=8", "trainer.default_local_dir=/ck/run",
            f"curriculum.stages=[{{name: s1, overrides: {{trainer: {{total_training_steps: 3}}}}}},"
            f"{{name: s2, overrides: {{data: {{train_files: {files['b']}, train_batch_size: 4}},"
            f" {ARR}: {{rollout: {{n: 4, temperature: 0.5}}, actor: {{optim: {{lr: 1.0e-6}}}}}}}}}}]",
            *extra]


def stages_of(overrides: list[str], n_base: int = 6):
    """Stages as main_ppo builds them: the first `n_base` overrides stand for a recipe, the rest
    for what the user typed (only those are re-applied over each stage)."""
    cfg = compose(overrides)
    assert has_stages(cfg)
    return build_stages(cfg, overrides[n_base:])


# A kk_role row whose prompt states the answer, and a chat row only a reward model scores (data_source chat).
KK_ROLE = {"prompt": [{"role": "user", "content": "Zoey is a knight. What is Zoey?"}], "data_source": "kk_role",
           "reward_model": {"style": "rule", "ground_truth": {"name": "Zoey", "role": "knight"}}}
CHAT = {"prompt": [{"role": "user", "content": "Say something kind."}], "data_source": "chat",
        "reward_model": {"style": "model", "ground_truth": "a kind reply"}}


def write_rows(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# The batch the config tests' hand-computed numbers assume, pinned so that retuning the embedded
# default does not change them: 8 prompts x 4 responses, mini-batches of 4 prompts, micro 4.
BASE_BATCH = ["data.train_batch_size=8", "actor_rollout_ref.rollout.n=4",
              "actor_rollout_ref.actor.ppo_mini_batch_size=4",
              "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
              "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=8"]


@pytest.fixture
def data_files(tmp_path) -> list[str]:
    """Overrides pointing data.train_files/val_files at small jsonl sets (20 train rows, 4 val rows),
    with BASE_BATCH (later overrides of the same keys win)."""
    train = write_jsonl(tmp_path / "data" / "train.jsonl", 20)
    val = write_jsonl(tmp_path / "data" / "test.jsonl", 4)
    return [f"data.train_files={train}", f"data.val_files={val}", *BASE_BATCH]


def _sigint_default() -> None:
    """In the child before exec: SIGINT back to its default. A child inherits an ignored SIGINT (Python then
    installs no KeyboardInterrupt handler), and something earlier in a pytest-xdist worker can leave it ignored:
    in make test the Ctrl-C case of test_signals.py hung there (twice) while the SIGTERM case passed, and it
    passes alone, under CPU load and in module order."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_main(*overrides: str, ckpt: Path | None = None, run_dir: Path | None = None, fault: str | None = None,
             popen: bool = False, cwd: Path | None = None, env: dict | None = None, timeout: float = 900,
             fresh: bool = False):
    """Run the real entry point as a user would: `python main_ppo.py *overrides`, one-line errors
    (HYDRA_FULL_ERROR=0), Hydra's run dir under `cwd` unless hydra.run.dir is given.

    ckpt, run_dir: trainer.default_local_dir and hydra.run.dir (metrics.jsonl's directory: read_metrics).

    fault: LOGICRL_INJECT_FAULT for this run only (logicrl/faults.py; Ray's workers inherit it from the
    driver); never inherited from the test's own environment. env: more variables for this run.
    popen: return the running run instead of waiting: a launcher.Forked, or a subprocess.Popen where a new
    interpreter must run it (both: pid, poll, wait, communicate with text, send_signal, kill, returncode).
    fresh: a new interpreter even where the launch server could fork the run (a test that times the launch
    as a user sees it: Python's start and the imports count).
    The run is in its own session, so a test can signal its process group, and a SIGKILLed
    controller's Ray processes are reaped by Ray, not by the test. Other runs are forked from a server
    that has made the driver's imports (tests/helpers/launcher.py)."""
    overrides = (*overrides, *([f"trainer.default_local_dir={ckpt}"] if ckpt else []),
                 *([f"hydra.run.dir={run_dir}"] if run_dir else []))
    if not any(a.startswith("trainer.default_local_dir=") for a in overrides):
        # Checkpoints are on by default and resume_mode=auto: a shared directory would make one
        # test resume from another's run.
        overrides = (*overrides, f"trainer.default_local_dir={tempfile.mkdtemp(prefix='logicrl-ckpt-')}")
    # One thread a rank (controller/placement.py thread_cap): make test runs two tests at once on 2
    # cores, and a tiny model's rank gains nothing from a second thread but its spinning.
    base = {**os.environ, "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}
    run_env = {**base, **(env or {})}
    run_env.pop("LOGICRL_INJECT_FAULT", None)
    if fault:
        run_env["LOGICRL_INJECT_FAULT"] = fault
    # LOGICRL_TEST_LAUNCH=exec starts every run as a new interpreter.
    if not fresh and os.environ.get("LOGICRL_TEST_LAUNCH") != "exec":
        forked = launcher.launch(list(overrides), cwd or ROOT, run_env, base, None if popen else timeout)
        if forked is not None:
            return forked
    argv = [sys.executable, str(ROOT / "main_ppo.py"), *overrides]
    if popen:  # a run the test signals: Ctrl-C must reach it as it reaches a terminal's foreground job
        return subprocess.Popen(argv, cwd=cwd or ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=run_env, start_new_session=True, preexec_fn=_sigint_default)
    return subprocess.run(argv, cwd=cwd or ROOT, capture_output=True, text=True, timeout=timeout, env=run_env,
                          start_new_session=True)


# ---- main_ppo.py's checks in-process: a refusal without a launch -------------------------------------------
@dataclass(frozen=True)
class Checked:
    """What `python main_ppo.py ...` would have ended with before Ray or a model starts."""

    code: int  # its exit code: 2 refused, 0 passed (a dry run: the plan was printed)
    line: str  # its one stderr line when refused, "" when it passed
    out: str  # what it printed and logged (warnings; a dry run's config and summary)
    err: str = ""  # anything else written to stderr


def check_main(*overrides: str, cwd: Path | None = None) -> Checked:
    """main_ppo.py's checks of `overrides`, in this process: its override check, Hydra's composition, then
    `main_ppo.checked` (every stage validated and preflighted), or `main_ppo.run` for a dry run. The same
    code, without the 1-3 CPU s of a launch (Python, Hydra's start, main_ppo's imports); the entry point's
    own wiring (exit code, stderr as one line) keeps one real launch per refusal path (tests/bad_inputs)."""
    import contextlib
    import io
    import logging

    import yaml
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.hydra_config import HydraConfig
    from hydra.errors import HydraException
    from omegaconf import open_dict

    import main_ppo
    from logicrl.config.cli import CONF_DIR, CONFIG_NAME, hydra_error_line
    from logicrl.errors import BadInput
    from logicrl.launch.sweep import register_resolver

    # A launch starts with empty caches: what the preflight cached (nvidia-smi's answer) for an earlier call
    # must not answer this one, whose PATH may differ.
    for module in [m for name, m in sys.modules.items() if name.startswith("logicrl.")]:
        for value in list(vars(module).values()):
            if callable(getattr(value, "cache_clear", None)) and hasattr(value, "__wrapped__"):
                value.cache_clear()
    out, err = io.StringIO(), io.StringIO()
    handler = logging.StreamHandler(out)  # Hydra's job logging prints the run's log records on stdout
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    made = None
    try:
        with contextlib.chdir(cwd or ROOT), contextlib.redirect_stdout(out), \
                contextlib.redirect_stderr(err):
            try:
                argv = main_ppo.check_overrides(list(overrides))
                register_resolver()
                with initialize_config_dir(str(CONF_DIR), version_base="1.3"):
                    cfg = hydra_compose(CONFIG_NAME, overrides=argv, return_hydra_config=True)
                # What Hydra's run sets before main: its config (HydraConfig: what code reading the overrides sees)
                # and the run's directory, which exists by then (the preflight's disk check reads it).
                if any(a.startswith("hydra.run.dir=") for a in argv):
                    run_dir = Path(cfg.hydra.run.dir)
                else:  # removed below: thousands of checks would leave thousands of directories in /tmp
                    run_dir = made = Path(tempfile.mkdtemp(prefix="logicrl-run-"))
                run_dir.mkdir(parents=True, exist_ok=True)
                with open_dict(cfg):
                    cfg.hydra.runtime.output_dir = str(run_dir.resolve())
                HydraConfig.instance().set_config(cfg)
                hydra_cfg = HydraConfig.get()
                with open_dict(cfg):
                    del cfg["hydra"]
                if cfg.trainer.dry_run:
                    main_ppo.run(cfg, hydra_cfg)
                else:
                    main_ppo.checked(cfg, main_ppo.overrides_of(hydra_cfg))
            except main_ppo.Ended as end:
                return Checked(end.code, end.line, out.getvalue(), err.getvalue())
            except BadInput as bad:
                return Checked(main_ppo.EXIT_CONFIG, f"error: {bad}", out.getvalue(), err.getvalue())
            except HydraException as hydra_err:
                return Checked(main_ppo.EXIT_CONFIG, f"error: {BadInput(hydra_error_line(hydra_err))}",
                               out.getvalue(), err.getvalue())
            except yaml.YAMLError as yaml_err:
                return Checked(main_ppo.EXIT_CONFIG, f"error: {main_ppo.yaml_error_line(yaml_err)}", out.getvalue(),
                               err.getvalue())
            finally:
                HydraConfig.instance().cfg = None  # tests that compose later are not under a Hydra run
        return Checked(0, "", out.getvalue(), err.getvalue())
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


def assert_refused(checked: Checked, *names: str) -> str:
    """A refusal as main_ppo.py prints it: exit 2, one `error:` line holding each of `names`, nothing else
    on stderr."""
    assert checked.code == 2, (checked.code, checked.line, checked.out[-2000:])
    assert checked.line.startswith("error: ") and "\n" not in checked.line, checked.line
    assert not checked.err, checked.err
    for name in names:
        assert name in checked.line, (name, checked.line)
    return checked.line


def tail(result, chars: int = 3000) -> str:
    """The end of a finished run's stderr (or of a string): what an assertion shows when a run failed."""
    text = result if isinstance(result, str) else result.stderr or ""
    return text[-chars:]


def read_metrics(run_dir: Path) -> list[dict]:
    """A run's metrics.jsonl (trainer.logger includes jsonl), one dict per logged step."""
    return [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines()]


# The memory planner's band: a phase's measured peak within 15% of its plan (docs/memory.md).
MEMORY_BAND = (0.85, 1.15)


def peak_over_plan(stdout: str) -> dict[str, float]:
    """The closing memory table's peak/plan column (memory/report.py), by phase, for the phases it measured."""
    lines = stdout[stdout.index("memory per device (GB): planned vs measured"):].splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("phase") and "peak/plan" in line)
    ratios = {}
    for line in lines[header + 1:]:
        cells = line.split()
        if len(cells) < 5 or not all(c == "-" or c.replace(".", "", 1).isdigit() for c in cells[1:]):
            break  # the table's end
        if cells[-2] != "-":
            ratios[cells[0]] = float(cells[-2])
    return ratios
