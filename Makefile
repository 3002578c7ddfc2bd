# Two commands for a fresh machine: `make demo` and `make test`. Both create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
EXTRAS := xla,notebooks,dev,gemma-offline,bench,math,tracking

CLASSIC := .venv-classic
CLASSIC_STAMP := $(CLASSIC)/.installed

.PHONY: demo test setup browser bench bench-test bench-twice lint clean platforms faults release study study-seeded course-times scaling multihost

# torch's CUDA wheels are large downloads, and a registry connection that drops mid-file has failed a fresh install:
# pip resumes a broken download, and the whole install is tried again (finished wheels stay in pip's cache). A file
# cut at the same byte on every try (a cache on the way holding it cut short) is fetched afresh past that cache and
# checked against the index's sha256 by scripts/refetch_wheel.py, with pip's messages from the failed try.
$(STAMP): pyproject.toml requirements/lock.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	for attempt in 1 2 3; do \
	  installed=yes; $(BIN)/python -m pip install --quiet --resume-retries 5 -c requirements/lock.txt \
	    -e ".[$(EXTRAS)]" 2>$(VENV)/pip-stderr.txt || installed=no; \
	  cat $(VENV)/pip-stderr.txt >&2; [ $$installed = yes ] && break; \
	  [ $$attempt = 3 ] && exit 1; \
	  echo "pip install failed (attempt $$attempt of 3): trying again"; \
	  $(BIN)/python scripts/refetch_wheel.py $(VENV)/pip-stderr.txt || sleep 30; \
	done
	touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/grpo-kit demo

# The browser test drives Debian's Chromium (never a downloaded browser): installed with apt where we can.
browser:
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then APT="apt-get"; \
	  elif command -v sudo >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && sudo -n true 2>/dev/null; then APT="sudo -n apt-get"; fi; \
	  if [ -n "$$APT" ]; then echo "installing Debian's chromium for the browser test (log: .venv/apt.log)"; \
	    mkdir -p $(VENV); export DEBIAN_FRONTEND=noninteractive; \
	    $$APT install -y -q chromium >$(VENV)/apt.log 2>&1 || { $$APT update -q >>$(VENV)/apt.log 2>&1 && $$APT install -y -q chromium >>$(VENV)/apt.log 2>&1; } \
	      || { tail -20 $(VENV)/apt.log; exit 1; }; \
	  else echo "WARNING: no chromium and no apt here: tests/browser will fail. Install Chromium, or set GRPO_KIT_SKIP_BROWSER=1."; fi; }

# Colab's Jupyter versions (classic Notebook 6.5.7, ipywidgets 7.7.1, ipykernel 6.17.1) for the browser test;
# torch, transformers and the kit come from .venv.
$(CLASSIC_STAMP): $(STAMP) requirements/colab-frontend.txt scripts/link_venv.py
	rm -rf $(CLASSIC)
	$(PYTHON) -m venv $(CLASSIC)
	$(CLASSIC)/bin/python -m pip install --quiet -r requirements/colab-frontend.txt
	$(CLASSIC)/bin/python scripts/link_venv.py $(VENV)
	touch $@

# Notebooks run through nbmake in quick mode (GRPO_KIT_QUICK=1: fewer steps, same code), with their exercises solved
# (GRPO_KIT_SOLUTIONS=1: each exercise cell runs its solution from grpo_kit/course/exercises.py; the files keep the blanks).
# One test process per CPU (pytest-xdist), each with one thread: most tests are small-tensor Python work that one
# thread runs as fast as two. Whatever starts Jupyter kernels (the notebooks, tests marked `kernel`) runs in one
# process, in order, and so do the tests that share a costly module fixture (tests/scheduling.py). The 40 slowest
# tests are listed at the end: the whole run must stay within CI's 45 minutes.
test: $(STAMP) $(CLASSIC_STAMP) browser
	$(BIN)/python -m ruff check grpo_kit tools tests scripts notebooks/install.py
	OMP_NUM_THREADS=1 GRPO_KIT_QUICK=1 GRPO_KIT_SOLUTIONS=1 $(BIN)/python -m pytest tests --nbmake notebooks \
	  --nbmake-timeout=600 -m "not bench and not multihost" -n logical --dist loadgroup --durations=40

# The benchmark's real-model and capstone sections end to end at small sizes (they load Gemma 3 270M five times;
# `make test` runs the tiny-model parts): run before changing what `make bench` reports.
bench-test: $(STAMP)
	$(BIN)/python -m pytest tests -m bench

# Every notebook on replicas of Colab TPU (Python 3.13), Kaggle TPU v5e-8 and Colab GPU (3.12), each on a fresh machine
# as users get it (scripts/platforms.py; cell 1 installs the commit the notebooks pin, from this repository;
# `python scripts/platforms.py --kit head` installs the committed HEAD instead). One JSON line per replica.
platforms: $(STAMP)
	$(BIN)/python scripts/platforms.py

# The study (`python -m tools study`: 3 regimes × 3 seeds, 76–155 min a cell alone on 2 cores; running it again continues where it
# stopped; each finished cell is recorded in docs/study_cells/ and not run again, so commit them to continue on
# another machine), then its summary and plot copied to docs/ (docs/study.json, docs/study.png) and the table written
# into docs/capstone.md, docs/study/README.md (the full record), README.md and notebook 08 from docs/study.json.
study: $(STAMP)
	$(BIN)/python -m tools study --output-dir runs/study --record-dir docs/study_cells
	cp runs/study/summary.json docs/study.json
	cp runs/study/study.png docs/study.png
	$(BIN)/python -m tools study --from-json docs/study.json --report docs/capstone.md docs/study/README.md README.md \
	  notebooks/08_gemma_gsm8k.ipynb

# The scarce regime again, 3 seeds, with each seed's LoRA adapters drawn from it (the published cells' were not), on
# the fp32 path of an AVX2 CPU (the AVX2 stand-in, which every x86-64 machine here can run, so that cells recorded on
# different machines run the same kernels; MKL's variable from seed 2 on: an Intel Xeon ran seed 1 without it, with
# MKL's AVX-512 products); each finished cell is recorded in docs/study_cells_seeded/ (commit it: a cell took 111
# minutes alone on a 2-core AMD EPYC Zen 4, and one recorded there is not run again), then docs/study_seeded.json and
# its tables in docs/capstone.md and docs/study/README.md.
study-seeded: $(STAMP)
	ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 GRPO_KIT_CPU_BF16=0 \
	  $(BIN)/python -m tools study --regimes scarce \
	  --output-dir runs/study-seeded --record-dir docs/study_cells_seeded
	cp runs/study-seeded/summary.json docs/study_seeded.json
	$(BIN)/python -m tools study --from-json docs/study_seeded.json --report docs/capstone.md docs/study/README.md

# docs/benchmarks.md and its plots, from one quick run, alone (18 minutes on a 2-core Xeon with AMX, 42 on one without, 49 on a 2-core AMD EPYC VM).
bench: $(STAMP)
	$(BIN)/python -m tools bench --quick --report docs

# A TPU pod slice's hosts stood in for by two torchrun processes on XLA's CPU devices (tests/test_spmd_hosts.py, its
# multihost test: ≈ 6 min of XLA compiles on 2 cores): only host 0 writes, a run resumes from its checkpoint on both, the rows of one process.
multihost: $(STAMP)
	$(BIN)/python -m pytest tests/test_spmd_hosts.py -m multihost

# The scaling model against runs here: 1 vs 2 processes (gloo; the tiny Gemma and Gemma 3 270M) and 1 vs 8 virtual
# XLA devices (the tiny Gemma) (tools/scaling.py, ≈ 15 min on 2 cores, alone); writes docs/scaling.json and the
# tables of docs/scaling.md.
scaling: $(STAMP)
	$(BIN)/python -m tools scaling --report docs/scaling.md

# Two quick bench runs in a row and how far each ratio moved between them (the goal: within 15 %).
bench-twice: $(STAMP)
	mkdir -p runs
	$(BIN)/python -m tools bench --quick --json > runs/bench-quick-1.json
	$(BIN)/python -m tools bench --quick --json > runs/bench-quick-2.json
	$(BIN)/python -m tools.bench agree runs/bench-quick-1.json runs/bench-quick-2.json

# The situations that once lost a user's work, replayed through the command line (also a test in `make test`).
faults: $(STAMP)
	$(BIN)/python scripts/faults.py

# Cut the release pyproject.toml names and CHANGELOG.md describes: the notebooks' cell 1 pinned to this commit, then
# every badge opening those notebooks; two commits, checked (scripts/release.py).
release: $(STAMP)
	$(BIN)/python scripts/release.py cut

lint: $(STAMP)
	$(BIN)/python -m ruff check grpo_kit tools tests scripts notebooks/install.py

clean:
	rm -rf $(VENV) $(CLASSIC) runs .pytest_cache .platforms

# Every notebook but 08 and 09 timed in full mode with the tiny Gemma on this machine (about 8 minutes, nothing else
# running), into grpo_kit/assets/course_minutes.json and the notebooks' time headers (scripts/course_times.py).
course-times: $(STAMP)
	$(BIN)/python scripts/course_times.py
