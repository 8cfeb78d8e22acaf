# make demo: the main job end to end.  make test: lint and the whole test suite.
# make test-fast: the inner loop, all but the tests marked e2e (engines) or slow, on both cores.
# make bench: the benchmarks.  Everything runs in .venv, created here if missing.
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.kvaudit-installed
ENGINES := $(VENV)/.kvaudit-engines
ENGINE_SCRIPTS := $(sort $(wildcard scripts/install-*.sh))

.PHONY: demo test test-fast bench lint install engines side-vllm clean

install: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip setuptools
	$(PY) -m pip install -q --disable-pip-version-check -e '.[all,dev]'
	$(PY) -m kvaudit.read.scanner_cache  # the page scanner's machine code, once (about a minute)
	touch $@

engines: $(ENGINES)

$(ENGINES): $(INSTALLED) $(ENGINE_SCRIPTS)
	for script in $(ENGINE_SCRIPTS); do bash $$script $(PY) || exit 1; done
	touch $@

# The Python modules of the supported vLLM releases without a CPU build, for the hook's
# conformance tests; each is downloaded once into .cache/ and kept (scripts/side-vllm.sh).
side-vllm: $(ENGINES)
	bash scripts/side-vllm.sh $(PY)

demo: $(INSTALLED)
	$(VENV)/bin/kvaudit demo

lint: $(INSTALLED)
	$(VENV)/bin/ruff check .

test: $(INSTALLED) $(ENGINES) side-vllm lint
	$(PY) -m pytest -q --durations=25

test-fast: $(INSTALLED) lint
	$(PY) -m pytest -q -m "not e2e and not slow" -n 2 --durations=10

bench: $(INSTALLED) $(ENGINES)
	$(PY) -m bench

clean:
	rm -rf $(VENV) demo-out .cache
