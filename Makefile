# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
# torch is pinned to the build this project is tested with; pip takes it from a local wheel cache when there is one.
TORCH := torch==2.14.1 torchvision==0.29.1
# CPU-only machine: `make demo TORCH_INDEX=https://download.pytorch.org/whl/cpu` takes PyTorch's CPU wheels
# (no CUDA libraries: a much smaller venv, same results).
TORCH_INDEX ?=
MINI := data/mini
DEMO_RUN := outputs/train/digits/demo
ZEROSHOT_RUN := outputs/train/digits/demo_zeroshot
OFFLINE := HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 WANDB_MODE=offline

.PHONY: demo test test-fast venv install install-dev mini clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) $(TORCH)
	$(PIP) install --quiet -e '.[corruptions]'
	touch $@

# rbo (the reference RBO implementation the text-robustness test agrees with) pins numpy<2 though it runs on 2:
# installed without its dependencies, test-only.
# The readers of rgb's exports (tests/consumers.py), test-only in $(VENV)/test-only, off rgb's import path:
# RobustBench and CLIP_benchmark without their dependencies (old pins: timm==1.0.9, gdown==5.1.0), plus the few
# modules the reading code imports that the venv lacks (RobustBench's model zoo: geotorch, torchdiffeq, gdown and
# its bs4; clip_benchmark.cli: pycocoevalcap).
TEST_ONLY := robustbench==1.1.1 clip-benchmark==1.6.2 geotorch==0.4.0 torchdiffeq==0.2.5 gdown==5.1.0 \
	beautifulsoup4==4.15.0 soupsieve==4.1.4 pycocoevalcap==1.2
$(VENV)/.installed-dev: $(VENV)/.installed
	$(PIP) install --quiet -e '.[dev]'
	$(PIP) install --quiet --no-deps rbo
	$(PIP) install --quiet --no-deps --upgrade --target $(VENV)/test-only $(TEST_ONLY)
	touch $@

venv install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

mini: $(VENV)/.installed
	$(PY) -m rgb.data.mini $(MINI)

# The whole pipeline on the embedded mini benchmark: build it, train, attack (L1, L2, Linf), score.
# Every step resumes: re-running `make demo` recomputes nothing that finished.
# Then a zero-shot CLIP (the embedded one, trained on the mini benchmark on first use) with CPE prompts: attacked at
# Linf only, since many of its images resist and L2 + L1 take tens of minutes on a CPU (its row shows them
# missing; `python attack.py run=$(ZEROSHOT_RUN)` completes them), the ensembles side by side, its text-side
# brittleness, and a leaderboard with both models, and its static site (its path is the last line printed:
# outputs/leaderboard/site/index.html).
demo: $(VENV)/.installed mini
	$(OFFLINE) $(PY) train.py run_name=demo
	$(OFFLINE) $(PY) attack.py run=$(DEMO_RUN)
	$(OFFLINE) $(PY) evaluate.py run=$(DEMO_RUN)
	$(OFFLINE) $(PY) train.py model=openclip_mini strategy=zeroshot prompts=cpe run_name=demo_zeroshot
	$(OFFLINE) $(PY) attack.py run=$(ZEROSHOT_RUN) norms=[linf]
	$(OFFLINE) $(PY) evaluate.py run=$(ZEROSHOT_RUN)
	$(OFFLINE) $(PY) evaluate.py run=$(ZEROSHOT_RUN) zeroshot_report=true
	$(OFFLINE) $(PY) evaluate.py run=$(ZEROSHOT_RUN) text_robustness=true \
		'text_robustness_options.types=[keyboard_typo,char_swap,punctuation,keywords_only,word_shuffle,template_synonym]'
	$(OFFLINE) $(PY) evaluate.py 'pool=[outputs/eval/digits]' 'leaderboard_datasets=[digits]' site=true

# The test suite (slow tests included; RGB_FAST=1 skips them).
test: $(VENV)/.installed-dev
	$(OFFLINE) $(PY) -m pytest -q $(PYTEST_ARGS)

test-fast: $(VENV)/.installed-dev
	RGB_FAST=1 $(OFFLINE) $(PY) -m pytest -q $(PYTEST_ARGS)

clean:
	rm -rf outputs multirun $(MINI) .pytest_cache
