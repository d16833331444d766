# The course's commands. `make lab` and `make test` create the environment they need.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-stamp
WORK   ?= work
# nbgrader runs `alembic` from PATH, so the venv's bin/ comes first.
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: help venv constraints lab instructor-lab test test-numerics test-install train student-bundle catch-up gradescope book solutions notebooks package release manifest build check grade self-check progress export update reset doctor bench clean-venv

help:
	@echo "make lab       open the course in JupyterLab (your copy lives in $(WORK)/)"
	@echo "make instructor-lab  JupyterLab with nbgrader's instructor tools: make instructor-lab LAB_DIR=graded/nbgrader"
	@echo "make test      run the whole test suite (as CI does)"
	@echo "make test-numerics  the numeric tests again at 1 and 4 torch threads, in reverse order (part of make test)"
	@echo "make test-install  a fresh clone: its installs measured, every documented command run in it, the Colab set-up cell (minutes)"
	@echo "make train     train the course's model (about 7 minutes on a laptop CPU) into data/"
	@echo "make book      the textbook website from the notebooks' stored outputs, in build/book/src/_build/html/"
	@echo "make solutions  the solution notebooks as pages that work offline, in build/solutions/"
	@echo "make build     rebuild solution notebooks (executed), package, chapters, manifest"
	@echo "make package   write minillm/ from the solution notebooks' export cells"
	@echo "make release   write chapters/ from solutions/ with nbgrader"
	@echo "make student-bundle UPTO=04 [DUE=03]  what a graded class hands out, in dist/"
	@echo "make catch-up CHAPTER=05  a latecomer's bundle: chapters before 05 complete, 05 to do, in dist/"
	@echo "make gradescope CHAPTER=04  the chapter's Gradescope autograder zip, in dist/ (private: it holds solutions)"
	@echo "make grade     grade notebooks: make grade FILES='sub/' OUT=graded JOBS=2"
	@echo "make self-check  a learner's report: make self-check CHAPTER=work/00_history"
	@echo "make progress  one line per chapter of $(WORK)/: visible checks passing, written answers given (unchanged chapters keep their last result)"
	@echo "make export CHAPTER=04  your answers that pass their visible tests into your own copy of minillm ($(WORK)/.minillm/)"
	@echo "make update    bring new or changed chapters into $(WORK)/, keeping your answers (backups in $(WORK)/.backups/)"
	@echo "make reset     start a chapter over from its release: make reset CHAPTER=04 (a backup is kept)"
	@echo "make doctor    check the environment, one OK/FAIL line per check"
	@echo "make constraints  re-resolve the dependencies for every platform into constraints.txt (then make clean-venv test)"
	@echo "make bench     run the benchmarks in bench/"
	@echo "make speedrun  train to 1.40 nats per character against the clock, and record it in data/speedrun.json (up to 10 minutes)"
	@echo "make speedrun-verify RECORD=0 [BOARD=FILE]  rerun a record of the leaderboard (or of a submitted file) here and check that it holds"
	@echo "make sweep     rerun chapter 08's scaling-law lab into data/scaling_sweep.json (under 30 minutes)"

# Installs the course with the exact versions of constraints.txt, and again whenever
# pyproject.toml or constraints.txt changed since the last install. A learner's commands
# (make lab, self-check, progress, update, reset, doctor) need only what the chapters use;
# the tests and the instructor's tools add the test extra (pytest, transformers, the
# website's builder and the rest).
LEARNER_STAMP := $(VENV)/.learner-stamp
$(LEARNER_STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e .
	$(BIN)/python -m pip check --disable-pip-version-check
	@touch $(LEARNER_STAMP)

$(STAMP): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[test]'
	$(BIN)/python -m pip check --disable-pip-version-check
	@touch $(STAMP) $(LEARNER_STAMP)

venv: $(STAMP)

# Resolves pyproject.toml's ranges with uv for every platform and Python the course supports,
# from PyPI alone, and writes the pins with their markers into constraints.txt (docs/platforms.md,
# "Pinned versions"; coursebuild/constraints.py). It keeps the versions already pinned where
# they still fit; UPGRADE=1 takes the newest that fit. uv comes into a venv of its own, so
# this works before .venv can be installed. Then run `make clean-venv test` and commit
# constraints.txt.
LOCK_VENV := build/lock-venv
constraints:
	rm -rf $(LOCK_VENV)
	$(PYTHON) -m venv $(LOCK_VENV)
	$(LOCK_VENV)/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt uv
	$(LOCK_VENV)/bin/python -m coursebuild.constraints $(if $(UPGRADE),--upgrade)
	rm -rf $(LOCK_VENV)

# Copies chapters/ into $(WORK)/ without overwriting anything already there: your answers
# stay yours, and chapters added by `git pull` appear. Stop JupyterLab with Ctrl-C.
# A learner's lab (autograder/lab.py, as on every route): lab/learner/ turns off nbgrader's
# instructor tools and its assignment list. `make instructor-lab` keeps the tools.
lab: $(LEARNER_STAMP)
	$(BIN)/python -m autograder lab --work $(WORK) $(LAB_ARGS)

# JupyterLab with nbgrader's instructor tools, in LAB_DIR (default: the repository), for
# example formgrader on a graded folder: make instructor-lab LAB_DIR=graded/nbgrader
LAB_DIR ?= .
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)
instructor-lab: $(STAMP)
	cd $(LAB_DIR) && $(abspath $(BIN))/jupyter lab $(ROOT_FLAG) $(LAB_ARGS)

# Unit, sync and grading tests on both cores; then the solution notebooks in quick mode
# under nbval, also on both cores: nbval runs a notebook's cells in order in one kernel,
# and --dist loadfile sends each notebook whole to one worker (plain --dist load would
# split its cells across two kernels).
test: $(STAMP)
	$(BIN)/python -m pytest -n 2 --dist loadgroup --durations=25 tests $(PYTEST_ARGS)
	$(MAKE) --no-print-directory test-numerics
	$(BIN)/python -m pytest -n 2 --dist loadfile solutions $(PYTEST_ARGS)

# The numeric tests again, at 1 and at 4 torch threads and in reverse order (tests/conftest.py):
# a tolerance that holds only for one machine's rounding, or a test that leans on state an
# earlier test left, fails here. About a minute per thread count.
NUMERIC_TESTS := $(addprefix tests/test_,$(addsuffix .py,model attention positional flash flash_triton moe lora \
	kvcache dpo norm ffn block sampling embedding generate scaling convert train checkpoint))
test-numerics: $(STAMP)
	for threads in 1 4; do \
	  MINILLM_TEST_THREADS=$$threads MINILLM_TEST_ORDER=reversed \
	    $(BIN)/python -m pytest -q -n 2 --dist loadgroup $(NUMERIC_TESTS) $(PYTEST_ARGS) || exit 1; \
	done

# A fresh machine: a clone of HEAD, its installs measured (the learner's, then the full one, in
# the clone's one .venv), every documented command run as written in that clone, and the Colab
# set-up cell in a new runtime that keeps its own torch (many minutes; not part of `make test`).
test-install: $(STAMP)
	MINILLM_TEST_INSTALL=1 $(BIN)/python -m pytest -p no:xdist -s tests/test_install.py tests/test_colab.py $(PYTEST_ARGS)

# The recipe of the shipped model (data/minillm-shakespeare*): one torch thread, so two runs
# of the same code with the same torch version give the same weights. Prints the validation loss
# in nats per character and a sample.
train: $(STAMP)
	$(BIN)/python -m minillm train --threads 1 --out data/minillm-shakespeare.pt --figure data/minillm-shakespeare-loss.png $(TRAIN_ARGS)

# Chapter 08's scaling-law lab: every run of bench/scaling_sweep.py (six sizes on a fixed token
# budget, the IsoFLOP grid, the learning-rate check), one torch thread; rewrites
# data/scaling_sweep.json and prints how long it took (under 30 minutes on 2 cores).
.PHONY: sweep speedrun speedrun-verify
sweep: $(STAMP)
	$(BIN)/python bench/scaling_sweep.py $(SWEEP_ARGS)

# The textbook website: a Jupyter Book of the chapters as learners get them, with the stored
# outputs of the solution notebooks (nothing is executed), the Tech Band index, the tee
# errata and the instructor guide; open build/book/src/_build/html/index.html.
book: $(STAMP)
	$(BIN)/python -m coursebuild.book

# The solution notebooks as read-only pages, from their stored outputs: a learner's way to
# read a solution (the lab is rooted at work/); open build/solutions/index.html.
solutions: $(LEARNER_STAMP)
	$(BIN)/python -m coursebuild.solutions

notebooks: $(STAMP)
	$(BIN)/python -m coursebuild notebooks --execute $(CHAPTERS)

package: $(STAMP)
	$(BIN)/python -m coursebuild package

release: $(STAMP)
	$(BIN)/python -m coursebuild release $(CHAPTERS)

manifest: $(STAMP)
	$(BIN)/python -m coursebuild manifest

build: notebooks package release manifest

check: $(STAMP)
	$(BIN)/python -m coursebuild check

# Learner notebooks 00..UPTO and a minillm complete only for the chapters due (by default
# those before UPTO): dist/student-bundle-upto-NN-due-MM/ and its zip. See docs/grading.md.
student-bundle: $(STAMP)
	$(BIN)/python -m coursebuild bundle --upto $(UPTO) $(if $(DUE),--due $(DUE))

# A latecomer in a graded class: every chapter before CHAPTER complete (the trained model
# included, in data/), CHAPTER itself as exercises. dist/catch-up-NN/.
catch-up: $(STAMP)
	$(BIN)/python -m coursebuild bundle --upto $(CHAPTER) --catch-up

# The Gradescope autograder of one chapter: dist/gradescope-NN.zip (it holds the chapter's
# solutions and hidden tests: upload it to Gradescope, never hand it out).
gradescope: $(STAMP)
	$(BIN)/python -m coursebuild gradescope $(CHAPTER)

OUT  ?= graded
JOBS ?= 1
grade: $(STAMP)
	$(BIN)/python -m autograder grade $(FILES) --out $(OUT) --jobs $(JOBS)

# The learner's own report on a notebook, a chapter's folder or a chapter number (looked up in
# $(WORK)/): make self-check CHAPTER=work/00_history, make self-check CHAPTER=00. Failing checks
# are the report, not an error: self-check and progress fail only for a bad argument or when the
# grader itself failed. progress keeps each chapter's last result in $(WORK)/.progress-cache/
# and checks again only the chapters whose notebook, release or grader changed.
self-check: $(LEARNER_STAMP)
	$(BIN)/python -m autograder check $(CHAPTER) --work $(WORK)

progress: $(LEARNER_STAMP)
	$(BIN)/python -m autograder check all --work $(WORK)

# After `git pull`: new chapters are copied into $(WORK)/, changed ones get the new release
# with your answer cells and written answers carried over; old notebooks go to $(WORK)/.backups/.
update: $(LEARNER_STAMP)
	@mkdir -p $(WORK)
	$(BIN)/python -m autograder update --work $(WORK)

# Your answers of a chapter that pass their visible tests become your own copy of the package,
# $(WORK)/.minillm/minillm/, which the lab's kernels import first (restart the kernel after it).
export: $(LEARNER_STAMP)
	$(BIN)/python -m autograder export $(CHAPTER) --work $(WORK)

reset: $(LEARNER_STAMP)
	$(BIN)/python -m autograder reset $(CHAPTER) --work $(WORK)

doctor: $(LEARNER_STAMP)
	$(BIN)/python -m minillm.doctor

bench: $(STAMP)
	@for script in bench/*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

# The CPU speedrun (bench/speedrun.py): SPEEDRUN_ARGS='--recipe tiny --no-save' tries the tools in seconds.
speedrun: $(STAMP)
	$(BIN)/python bench/speedrun.py run $(SPEEDRUN_ARGS)

# BOARD=FILE verifies a record of another leaderboard (a learner's submitted file, docs/speedrun.md);
# OUT=FILE appends the rerun to that leaderboard when it holds. Only an OUT the caller gives
# counts: the Makefile's own default OUT is grade's folder.
speedrun-verify: $(STAMP)
	$(BIN)/python bench/speedrun.py verify $(RECORD) $(if $(BOARD),--board $(BOARD)) $(if $(filter-out file undefined,$(origin OUT)),--out $(OUT))

clean-venv:
	rm -rf $(VENV)
