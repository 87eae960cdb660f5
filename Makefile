# Two commands set everything up on a fresh machine:
#   make demo   the app on the bundled sample documents and the bundled models
#   make test   the test suite
# Both create .venv when missing and install the pinned requirements into it.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ragspec-installed
export RAGSPEC_HOME ?= $(CURDIR)/.ragspec-home
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1

.PHONY: install test test-fast demo lint bench bench-anchors clean chromium screenshot

install: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# Idle OpenMP threads sleep instead of spinning: on a 2-core machine running tests, servers and
# subprocesses at once, spinning threads starve each other (one GPU-check test took 4x longer).
test: $(STAMP) chromium
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q --timeout=900

# The browser test needs a real Chromium; Debian's package, installed when we may (root).
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } || \
	  echo "chromium not installed: the browser test will be skipped"

# llama.cpp for `ragspec bench` (methods llamacpp, llamacpp_pld): a source build, ~12 minutes on
# 2 cores. The default flags suit an AVX-512 Xeon like our development machines; ggml's AMX
# kernels stay off (they crash on some virtual machines that report AMX). Elsewhere, e.g.
#   make bench-anchors LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON"
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
  -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON \
  -DGGML_AVX_VNNI=ON -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF
bench-anchors: $(STAMP)
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --quiet -r requirements-bench.txt

# Refresh the README's picture of the chat (the browser test, writing into docs/).
screenshot: $(STAMP) chromium
	RAGSPEC_SCREENSHOT=$(CURDIR)/docs/screenshot.png $(PY) -m pytest -q tests/test_ui_browser.py

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not browser"

lint: $(STAMP)
	$(VENV)/bin/ruff check ragspec tests scripts

# First run: ingest the bundled sample documents (unchanged files are skipped later), then
# open the chat at http://localhost:8501.
demo: $(STAMP)
	$(VENV)/bin/ragspec ingest data/corpus
	$(VENV)/bin/ragspec ui

clean:
	rm -rf $(VENV) .pytest_cache
