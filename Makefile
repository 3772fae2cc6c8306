# rootbench: `make bench` runs the benchmark, `make test` tests the harness.
# Everything slow (image, snapshot, llama-server, model) is cached under
# ~/.cache/rootbench (or $ROOTBENCH_CACHE), keyed by its inputs.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
# The venv is (re)installed when pyproject.toml is newer than this stamp. A stamp of its own,
# because touching $(PY) would follow its symlink to the system's python and say nothing.
STAMP  := $(VENV)/.installed
RB     := $(PY) -m runner
APT_PACKAGES := qemu-system-x86 qemu-utils mmdebstrap e2fsprogs openssh-client \
                python3-venv g++ cmake ninja-build chromium chromium-driver
ARGS ?=
# two: a VM test mostly waits on one guest vCPU, so a second worker fills the other core
TEST_WORKERS ?= 2

.PHONY: setup test test-fast bench bench-full replay verify perf reliability lint image doctor results clean

$(STAMP): pyproject.toml
	@[ -x $(PY) ] || $(PYTHON) -m venv $(VENV) || { echo "python3 -m venv failed: install python3-venv"; exit 1; }
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,mcp,inspect]'
	@touch $(STAMP)

## setup: system packages (apt, when missing) and the Python environment; idempotent
setup:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q --no-install-recommends $$missing; \
	fi
	@$(MAKE) --no-print-directory $(STAMP)

## test: lint, unit tests, real-VM tests (verify of the whole suite, the fault matrix), real-model tests,
## on TEST_WORKERS pytest workers (the long tests first, the rest filled around them)
# ROOTBENCH_GUEST_NICE=0: the two workers run VM tests beside model tests, and a guest niced
# below another test's llama-server gets ~1.5-10 % of a core while it computes, which made
# timing-bound VM tests flake; the tests of the nice itself set the nices they test.
test: setup lint
	ROOTBENCH_GUEST_NICE=0 $(PY) -m pytest -q -p no:cacheprovider -m "not soak" -n $(TEST_WORKERS) --dist loadfile --durations=25 $(ARGS)

## test-fast: tests/unit, what needs neither a VM nor a model (nor a browser or a wheel build)
test-fast: setup
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS) tests/unit $(ARGS)

## bench: the default subset with the default model, about an hour on 2 cores (docs/running.md,
## "The default bench"; builds what is missing as its episodes need it)
bench: setup
	$(RB) bench $(ARGS)

## bench-full: every scenario with the default model (about 3 h 40 min on 2 cores)
bench-full: setup
	$(RB) bench --all $(ARGS)

## replay: the committed recordings, offline (no VM, no model); archived ones against the specs kept beside them
replay: setup
	$(RB) replay --offline recordings/oracle $(wildcard recordings/live/*/) $(ARGS)
	@for a in recordings/archive/*/; do $(RB) replay --offline "$$a" --specs "$$a/specs" $(ARGS) || exit 1; done

## results: the README's results block and the measured difficulty tiers, made again from the
## committed live runs (recordings/live/*/) and specs/ (no VM, no model); prints labels that disagree
results: setup
	$(RB) results --write README.md $(ARGS)
	$(RB) results --write docs/results.md $(ARGS)

## verify: prove every scenario valid on real VMs; oracle cassettes go to recordings/oracle
verify: setup
	$(RB) verify $(ARGS)

## perf: speed figures
perf: setup
	$(RB) perf $(ARGS)

## reliability: the fault matrix and the soak test
reliability: setup
	$(PY) -m pytest -q -s tests/vm/test_reliability.py $(ARGS)

## lint: ruff, mypy ([tool.mypy]), and import-linter's layer and no-cycle contracts (pyproject.toml)
lint: setup
	$(PY) -m ruff check runner tests examples
	$(PY) -m mypy
	$(VENV)/bin/lint-imports

image: setup
	$(RB) image build $(ARGS)

doctor: setup
	$(RB) doctor

clean:
	rm -rf runs .pytest_cache .ruff_cache .mypy_cache
