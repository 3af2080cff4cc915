# peerwire developer tasks. `make test` and `make demo` are the README's two commands:
# each builds what it needs from the package registries alone.
PYTHON ?= python3
VENV := .venv
LEGACY := .venv-legacy

.PHONY: test test-uvloop lint bench clean system-deps

$(VENV)/.ready: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[test]'
	touch $@

# hat-chatter 0.5.11 (the legacy dialect's reference) pins hat-sbs 0.6: its own venv.
$(LEGACY)/.ready:
	$(PYTHON) -m venv $(LEGACY)
	$(LEGACY)/bin/pip install -q 'hat-chatter==0.5.11'
	touch $@

# Machine packages the tests need: Debian's chromium (browser tests; Playwright drives it,
# never downloads a browser of its own) and Java (Spark). Installed only where missing.
system-deps:
	@command -v chromium >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@command -v java >/dev/null || { apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openjdk-17-jre-headless >/dev/null; }

test: system-deps $(VENV)/.ready $(LEGACY)/.ready
	$(VENV)/bin/pytest

# The same suite on uvloop (tests, threads and CLI children: see tests/conftest.py).
test-uvloop: system-deps $(VENV)/.ready $(LEGACY)/.ready
	$(VENV)/bin/pytest --loop uvloop

lint: $(VENV)/.ready
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

bench: $(VENV)/.ready
	for f in tests/benchmarks/bench_*.py; do $(VENV)/bin/python $$f || exit 1; done

.PHONY: demo
demo: $(VENV)/.ready
	$(VENV)/bin/python examples/demo.py

clean:
	rm -rf $(VENV) $(LEGACY) .pytest_cache .hypothesis .ruff_cache *.egg-info
