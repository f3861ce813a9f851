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
# three). Two streams run side by side, TensorFlow | JAX then PyTorch: most tests are
# small and bound by one core's Python, so two streams keep both of CI's cores busy and
# the suite takes about half the time of one stream. TensorFlow's session is the longest,
# yet JAX's and PyTorch's together are longer still, so two PyTorch files run after
# TensorFlow in a session of their own (torch-after): the killed-run chains (~2 minutes)
# and the docs' examples (~1 minute). Tests of plain-Python behaviour run in one session
# only (tests/conftest.py's once_on), and JAX compiles the tiny test models with LLVM's
# cheapest code generation. On a slow 2-core Intel Xeon the two streams then took 1,084 s
# and 1,093 s (TensorFlow, then those two | JAX, then the rest of PyTorch); 1,170 s and
# 1,151 s half an hour later, as that machine slowed.
# Every line is prefixed with its session; each session's summary is repeated at the end.
TORCH_AFTER_TENSORFLOW := tests/test_fault_injection.py tests/test_docs.py

test: $(STAMP)
	@mkdir -p .test-logs; rm -f .test-logs/*.status; \
	session() { \
	  name=$$1; backend=$$2; shift 2; start=$$(date +%s); \
	  KERAS_BACKEND=$$backend $(PY) -m pytest -q -p no:cacheprovider --durations=15 "$$@" 2>&1 \
	    | tee .test-logs/$$name.log | sed -u "s/^/[$$name] /"; \
	  echo "$${PIPESTATUS[0]} $$(( $$(date +%s) - start ))" > .test-logs/$$name.status; \
	}; \
	if [ "$(TESTS)" = tests ]; then \
	  { session tensorflow tensorflow tests; session torch-after torch $(TORCH_AFTER_TENSORFLOW); } & \
	  { session jax jax tests; session torch torch tests $(addprefix --ignore=,$(TORCH_AFTER_TENSORFLOW)); } & \
	else \
	  session tensorflow tensorflow $(TESTS) & { session jax jax $(TESTS); session torch torch $(TESTS); } & \
	fi; \
	wait; \
	status=0; names="$(BACKENDS)"; [ "$(TESTS)" != tests ] || names="$$names torch-after"; \
	for name in $$names; do \
	  if [ ! -f .test-logs/$$name.status ]; then echo "=== $$name: no result ==="; status=1; continue; fi; \
	  read code seconds < .test-logs/$$name.status; \
	  backend=$${name%-after}; label=$$backend; [ $$name = $$backend ] || label="$$backend ($(TORCH_AFTER_TENSORFLOW))"; \
	  echo "=== KERAS_BACKEND=$$label: $$(tail -n 1 .test-logs/$$name.log) (exit $$code, $${seconds}s) ==="; \
	  [ "$$code" = 0 ] || status=1; \
	done; \
	exit $$status

demo: $(STAMP)
	KERAS_BACKEND=tensorflow $(PY) -m training.demo

clean:
	rm -rf $(VENV) .pytest_cache .test-logs
