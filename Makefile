# The README's two commands: `make demo` and `make test`. Both create .venv when missing.
# bash: the test recipe reads PIPESTATUS.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
BACKENDS := tensorflow jax torch
STAMP := $(VENV)/.installed
# What `make test` runs on each backend: `make test TESTS=tests/test_model.py` for one file.
TESTS ?= tests

.PHONY: demo test install clean

install: $(STAMP)

# Reinstall when the dependencies change. torch comes from constraints.txt (the local CPU wheel).
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,jax,torch]"
	touch $(STAMP)

# Runs the suite once per Keras backend; fails if any backend fails (after running all
# three). Two streams run side by side, TensorFlow | JAX then PyTorch (about equal
# lengths): most tests are small and bound by one core's Python, so two streams keep
# both of CI's cores busy and the suite takes about half the time of one stream.
# Every line is prefixed with its backend; each backend's summary is repeated at the end.
test: $(STAMP)
	@mkdir -p .test-logs; \
	run_backends() { \
	  for backend in "$$@"; do \
	    start=$$(date +%s); \
	    KERAS_BACKEND=$$backend $(PY) -m pytest -q -p no:cacheprovider --durations=15 $(TESTS) 2>&1 \
	      | tee .test-logs/$$backend.log | sed -u "s/^/[$$backend] /"; \
	    echo "$${PIPESTATUS[0]} $$(( $$(date +%s) - start ))" > .test-logs/$$backend.status; \
	  done; \
	}; \
	run_backends tensorflow & run_backends jax torch & wait; \
	status=0; \
	for backend in $(BACKENDS); do \
	  read code seconds < .test-logs/$$backend.status; \
	  echo "=== KERAS_BACKEND=$$backend: $$(tail -n 1 .test-logs/$$backend.log) (exit $$code, $${seconds}s) ==="; \
	  [ "$$code" = 0 ] || status=1; \
	done; \
	exit $$status

demo: $(STAMP)
	KERAS_BACKEND=tensorflow $(PY) -m training.demo

clean:
	rm -rf $(VENV) .pytest_cache .test-logs
