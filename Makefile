# The README's two commands: `make demo` and `make test`. Both create .venv when missing.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BACKENDS := tensorflow jax torch
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

install: $(STAMP)

# Reinstall when the dependencies change. torch comes from constraints.txt (the local CPU wheel).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,jax,torch]"
	touch $(STAMP)

# Runs the suite once per Keras backend; fails if any backend fails (after running all three).
test: $(STAMP)
	@status=0; \
	for backend in $(BACKENDS); do \
	  echo "=== KERAS_BACKEND=$$backend ==="; \
	  start=$$(date +%s); \
	  KERAS_BACKEND=$$backend $(PY) -m pytest -q tests || status=1; \
	  echo "=== KERAS_BACKEND=$$backend took $$(( $$(date +%s) - start ))s ==="; \
	done; \
	exit $$status

demo: $(STAMP)
	KERAS_BACKEND=tensorflow $(PY) -m training.demo

clean:
	rm -rf $(VENV) .pytest_cache
