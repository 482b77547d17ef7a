# `make demo` runs the main job on the embedded defaults; `make test` runs the linter (`make lint`:
# ruff check + ruff format --check) and then the test suite, so CI (.ci/run: make test) runs both.
# Both create (or reuse) a local virtual environment in .venv and install from pyproject.toml.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

NB_STAMP := $(VENV)/.notebooks

.PHONY: demo lint test test-fast notebooks bench bench-forward clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/cel-numpy demo --out runs/demo

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

test: $(STAMP) lint
	$(BIN)/python -m pytest -q

# Offline: every test that needs no download, against an empty model cache with downloads
# forbidden (CEL_NUMPY_OFFLINE=1), so a test that needs a file and lacks the `download` marker
# fails here instead of passing on a machine that happens to have the file cached.
test-fast: $(STAMP)
	@cache=$$(mktemp -d) && CEL_NUMPY_OFFLINE=1 CEL_NUMPY_CACHE=$$cache \
	  $(BIN)/python -m pytest -q -m "not download"; status=$$?; rm -rf "$$cache"; exit $$status

# executed notebooks of every tutorial in tutorials/notebooks/ (the `notebooks` extra: jupytext, nbclient)
notebooks: $(NB_STAMP)
	$(BIN)/python scripts/make_notebooks.py

$(NB_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[test,notebooks]'
	touch $(NB_STAMP)

bench: $(STAMP)
	$(BIN)/python bench/bench_theory.py

bench-forward: $(STAMP)  # with torch + transformers installed, also times the reference
	$(BIN)/python bench/bench_forward.py

clean:
	rm -rf $(VENV) runs .pytest_cache
