# Everything a fresh machine needs: `make demo` and `make test` create the virtual environment
# on first use (torch comes from the CPU wheel on local disk; see pyproject.toml).
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tensortune tune --workload matmul:256,256,256 --trials 64 \
		--records sqlite:///tensortune.db --work-dir tensortune-work

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks data
	$(BIN)/ruff format --check src tests benchmarks data

test: lint
	$(BIN)/pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/measure_throughput.py

clean:
	rm -rf tensortune-work tensortune.db tensortune.db-wal tensortune.db-shm
