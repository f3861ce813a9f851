# The README's two commands: `make demo` and `make test`. Both create .venv when missing.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BACKENDS := tensorflow jax torch
STAMP := $(VENV)/.installed
# What `make test` runs on each backend: `make test TESTS=tests/test_model.py` for one file.
TESTS ?= tests

.PHONY: demo test install clean $(BACKENDS:%=test-%)

install: $(STAMP)

# Reinstall when the dependencies change. torch comes from constraints.txt (the local CPU wheel).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,jax,torch]"
	touch $(STAMP)

# The suite runs once per Keras backend, the three sessions side by side (make -j3): on
# CI's two cores one session's compiling or Python fills the time another leaves a core.
# WORKERS=N spreads each session's files over N pytest-xdist workers, for larger machines:
# on two cores their imports and compiles, made once per worker, cost more than they gain.
# Every backend runs even if one fails; its result and every FAILED or ERROR line are
# repeated at the end, where CI's log tail shows them.
WORKERS ?= 0
test: $(STAMP)
	@rm -rf .test-logs; mkdir -p .test-logs
	@$(MAKE) --no-print-directory -j3 --output-sync=target $(BACKENDS:%=test-%); status=0; \
	for backend in $(BACKENDS); do \
	  { read code seconds < .test-logs/$$backend.status; } 2>/dev/null || code="no result"; [ "$$code" = 0 ] || status=1; \
	  echo "=== KERAS_BACKEND=$$backend: $$(grep -s -a -E " in [0-9.]+s( \(|$$)" .test-logs/$$backend.log | tail -n 1) (exit $$code, $${seconds}s) ==="; \
	done; \
	grep -s -a -E "^(FAILED|ERROR) " $(BACKENDS:%=.test-logs/%.log) | cut -c1-400; \
	exit $$status

$(BACKENDS:%=test-%): test-%: $(STAMP)
	@echo "KERAS_BACKEND=$*: running, its log in .test-logs/$*.log"; start=$$(date +%s); \
	KERAS_BACKEND=$* $(PY) -m pytest -q -p no:cacheprovider $(if $(filter-out 0,$(WORKERS)),-n $(WORKERS) --dist loadfile) \
	  --durations=15 --junitxml=.test-logs/$*.xml $(TESTS) > .test-logs/$*.log 2>&1; \
	echo "$$? $$(( $$(date +%s) - start ))" > .test-logs/$*.status; cat .test-logs/$*.log

demo: $(STAMP)
	KERAS_BACKEND=tensorflow $(PY) -m training.demo

clean:
	rm -rf $(VENV) .pytest_cache .test-logs
