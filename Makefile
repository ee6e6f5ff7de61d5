# The two entry points other tools call: keep these names.
STACK ?= homelab
OUT ?= rendered/$(STACK)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: render test bench clean

# Rebuilt when the pinned requirements change; a fresh clone builds it on first use.
$(VENV)/.installed: requirements.txt requirements-dev.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

render: $(VENV)/.installed
	$(BIN)/python -m render $(STACK) --out $(OUT)

test: $(VENV)/.installed
	$(BIN)/python -m pytest -q

clean:
	rm -rf rendered

bench: $(VENV)/.installed
	$(BIN)/python bench/run.py
