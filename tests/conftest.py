"""Shared fixtures. The same files run under each KERAS_BACKEND (see the Makefile).

A session fixture is made once per pytest process: once per backend, or once per
pytest-xdist worker (`make test WORKERS=N`); what fixtures write goes under
tmp_path_factory, which gives each worker a directory of its own.
"""

import hashlib
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Runs on file corpora binarize them into the user cache (run.py): keep the suite's out of ~/.cache.
os.environ.setdefault("KERAS_TRANSFORMER_CACHE", os.path.join(tempfile.gettempdir(), f"keras_transformer_tests_{os.getpid()}"))
# PyTorch's compiled paths (jit_compile=True's step, a recurring decoding shape) compile with
# aot_eager: dynamo and AOTAutograd as inductor runs them, without inductor's C++ build
# (minutes of a session on a small CPU). One test compiles with inductor itself
# (tests/test_torch_step.py); child processes inherit the variable.
os.environ.setdefault("KERAS_TRANSFORMER_TORCH_COMPILER", "aot_eager")

# The tests' models are tiny, so XLA's compile time is nearly all of their time under JAX
# (and under TensorFlow's jit_compile): LLVM's cheapest code generation cuts the JAX session
# by about a quarter (four of its heaviest files: 189 -> 139 s on a 2-core Intel Xeon).
# XLA:CPU's older elemental emitters instead of its MLIR fusion emitters compile each
# program in about 60% of the time: JAX's eager ops (one program per op and shape; a
# tiny model's first call 4.8 -> 2.8 s) and its first fit (5.1 -> 2.7 s); the whole JAX
# session 822 -> 665 s on a 2-core AMD EPYC. TensorFlow's XLA showed no change.
# Only code generation changes, not what is computed; benchmarks and training keep the
# default. Set before any backend starts; child processes inherit it; a user's own
# XLA_FLAGS are kept.
TEST_XLA_FLAGS = (
    "--xla_backend_optimization_level=0",
    "--xla_llvm_disable_expensive_passes=true",
    "--xla_cpu_use_fusion_emitters=false",
)
_user_xla_flags = os.environ.get("XLA_FLAGS", "")
os.environ["XLA_FLAGS"] = " ".join(
    [_user_xla_flags] + [flag for flag in TEST_XLA_FLAGS if flag.split("=")[0] not in _user_xla_flags]
).strip()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

import keras_transformer as kt  # noqa: E402

if keras.backend.backend() == "torch":
    import torch  # noqa: E402

    # The tests' matrices are tiny: one thread avoids thread hand-off costs that dominate
    # them, and oversubscription when subprocess tests run beside the main process.
    torch.set_num_threads(1)


if keras.backend.backend() == "jax":
    import atexit  # noqa: E402
    import shutil  # noqa: E402
    import tempfile  # noqa: E402

    import jax  # noqa: E402

    # Most tests build the same tiny model and fit it on the same shapes, each time in a
    # new jitted function that JAX would compile again. XLA's compilation cache is keyed
    # by the program, not the function object: with it, the session compiles each program
    # once. One cache per session, removed at exit;
    # the environment passes it to the tests' child processes too.
    _JAX_CACHE = tempfile.mkdtemp(prefix="kt-jax-cache-")
    atexit.register(shutil.rmtree, _JAX_CACHE, ignore_errors=True)
    for _option, _value in (
        ("jax_compilation_cache_dir", _JAX_CACHE),
        ("jax_persistent_cache_min_entry_size_bytes", -1),
        ("jax_persistent_cache_min_compile_time_secs", 0),
    ):
        os.environ[_option.upper()] = str(_value)
        jax.config.update(_option, _value)


@pytest.fixture(autouse=True)
def _seed_and_policy():
    """Every test starts from the same seed and the float32 policy, and restores it."""
    keras.utils.set_random_seed(1234)
    keras.config.set_dtype_policy("float32")
    yield
    keras.config.set_dtype_policy("float32")


def tiny_config(**overrides):
    """The tiny preset shrunk for tests: 1+1 layers, width 16, 2 heads, vocab 32, no dropout."""
    values = dict(
        vocab_size=32,
        d_model=16,
        d_ff=32,
        num_heads=2,
        num_encoder_layers=1,
        num_decoder_layers=1,
        dropout=0.0,
        max_length=32,
    )
    values.update(overrides)
    return kt.TransformerConfig.from_preset("tiny", **values)


def once_on(backend, why):
    """Runs a test in one backend's session only; `why` says why one is enough.

    For tests of behaviour that is plain Python or tf.data (callbacks' arithmetic, a run's
    bookkeeping), the same under every backend: the compiled steps they drive are tested
    on every backend elsewhere, so repeating them costs each session their compiling.
    """
    return pytest.mark.skipif(keras.backend.backend() != backend, reason=f"{why}: runs once, in the {backend} session")


def to_numpy(x):
    return keras.ops.convert_to_numpy(x)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def tree_digest(directory):
    """{relative path: sha256} of every file under `directory` ({} if there is none)."""
    digest = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as file:
                digest[os.path.relpath(path, directory)] = hashlib.sha256(file.read()).hexdigest()
    return digest
