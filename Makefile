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
# three). Two streams run side by side: most tests are small and bound by one core's
# Python, so two streams keep both of CI's cores busy and the suite takes about half the
# time of one stream. One stream runs TensorFlow's session, the other JAX's; PyTorch's
# tests, the shortest session, are cut into three parts that wait in a queue, and each
# stream takes the next part when its own session ends (a part is claimed with mkdir,
# which only one stream can win). Which of TensorFlow and JAX is slower changes with the
# machine and the hour (on a slow 2-core Intel Xeon: TensorFlow 670 s and JAX 585 s in one
# hour, 848 s and 955 s in a slower one), so a fixed split left one core idle for minutes;
# the queue gives the faster stream more of PyTorch's work. Tests of plain-Python
# behaviour run in one session only (tests/conftest.py's once_on), and JAX compiles the
# tiny test models with LLVM's cheapest code generation and XLA:CPU's older emitters,
# which compile faster (tests/conftest.py).
# Every line is prefixed with its session; each session's summary, and every FAILED or
# ERROR line of pytest's short summary, is repeated at the end, where CI's tail shows it.
# PyTorch's parts, taken longest first so that the last one taken is the shortest (on
# that Xeon: 146, 143 and 110 s): every file not named below, then the killed-run chains
# and the docs' examples, then the heaviest other files.
TORCH_PART_2 := tests/test_fault_injection.py tests/test_docs.py
TORCH_PART_3 := tests/test_faults.py tests/test_subword_sampling.py tests/test_ensemble.py \
	tests/test_determinism.py tests/test_cli.py tests/test_model.py tests/test_translator.py
TORCH_PART_1 := tests $(addprefix --ignore=,$(TORCH_PART_2) $(TORCH_PART_3))
TORCH_PARTS := torch-1 torch-2 torch-3

test: $(STAMP)
	@mkdir -p .test-logs; rm -rf .test-logs/*.status .test-logs/*.claimed; \
	session() { \
	  name=$$1; backend=$$2; shift 2; start=$$(date +%s); \
	  KERAS_BACKEND=$$backend $(PY) -m pytest -q -p no:cacheprovider --durations=15 --junitxml=.test-logs/$$name.xml "$$@" 2>&1 \
	    | tee .test-logs/$$name.log | sed -u "s/^/[$$name] /"; \
	  echo "$${PIPESTATUS[0]} $$(( $$(date +%s) - start ))" > .test-logs/$$name.status; \
	}; \
	torch_parts() { \
	  mkdir .test-logs/torch-1.claimed 2>/dev/null && session torch-1 torch $(TORCH_PART_1); \
	  mkdir .test-logs/torch-2.claimed 2>/dev/null && session torch-2 torch $(TORCH_PART_2); \
	  mkdir .test-logs/torch-3.claimed 2>/dev/null && session torch-3 torch $(TORCH_PART_3); \
	  true; \
	}; \
	if [ "$(TESTS)" = tests ]; then \
	  { session tensorflow tensorflow tests; torch_parts; } & \
	  { session jax jax tests; torch_parts; } & \
	  names="tensorflow jax $(TORCH_PARTS)"; \
	else \
	  session tensorflow tensorflow $(TESTS) & { session jax jax $(TESTS); session torch torch $(TESTS); } & \
	  names="$(BACKENDS)"; \
	fi; \
	wait; \
	status=0; \
	for name in $$names; do \
	  if [ ! -f .test-logs/$$name.status ]; then echo "=== $$name: no result ==="; status=1; continue; fi; \
	  read code seconds < .test-logs/$$name.status; \
	  case $$name in \
	    torch-1) label="torch, part 1 (the test files not in parts 2 and 3)";; \
	    torch-2) label="torch, part 2 ($(TORCH_PART_2))";; \
	    torch-3) label="torch, part 3 ($(TORCH_PART_3))";; \
	    *) label=$$name;; \
	  esac; \
	  echo "=== KERAS_BACKEND=$$label: $$(tail -n 1 .test-logs/$$name.log) (exit $$code, $${seconds}s) ==="; \
	  [ "$$code" = 0 ] || status=1; \
	done; \
	for name in $$names; do \
	  grep -a -E "^(FAILED|ERROR) " .test-logs/$$name.log 2>/dev/null | cut -c1-400 | sed "s/^/[$$name] /"; \
	done; \
	exit $$status

demo: $(STAMP)
	KERAS_BACKEND=tensorflow $(PY) -m training.demo

clean:
	rm -rf $(VENV) .pytest_cache .test-logs
