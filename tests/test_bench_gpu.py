"""`bench/gpu.py` and its Flax peer: runnable where TensorFlow is not, the peer's loss exact.

The GPU machine has no TensorFlow, so what the benchmark's processes import must not pull
it in (keras_transformer's model side included). Its timings are not tested here: they
are the benchmark's output (`bench/gpu.py --device cpu` is its smoke test).
"""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench import gpu  # noqa: E402

# What one backend's process of the benchmark does before its first step: import the
# script and its peers, seed, build and compile ours, build the PyTorch peer.
_CHILD = """
import json, sys
sys.path.insert(0, sys.argv[1])
from bench import gpu
plan = gpu.make_plan(gpu._parser().parse_args(["--device", "cpu", "--policies", "float32"]), None)
gpu._build_ours(plan, "tiny", "float32", batch=2)
if gpu._backend() == "torch":
    gpu._build_torch_peer(plan, "tiny", "float32", batch=2, compiled=False)
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] == "tensorflow")))
"""


@pytest.mark.skipif(keras.backend.backend() == "tensorflow", reason="the TensorFlow backend imports TensorFlow by design")
def test_the_benchmark_builds_its_models_without_importing_tensorflow():
    env = dict(os.environ, KERAS_BACKEND=keras.backend.backend())
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, str(ROOT)], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1]) == []


def test_the_cpu_plan_is_a_small_two_point_sweep_and_big_takes_its_own_tokens():
    parser = gpu._parser()
    plan = gpu.make_plan(parser.parse_args(["--device", "cpu"]), parser)
    assert (plan.presets, plan.tokens, plan.length, plan.vocab) == (("tiny",), {"tiny": (64, 128)}, 16, 1000)
    plan = gpu.make_plan(parser.parse_args(["--presets", "base,big", "--tokens", "4096", "--big-tokens", "8192"]), parser)
    assert plan.tokens == {"base": (4096,), "big": (8192,)}
    assert plan.policies == ("mixed_bfloat16",) and plan.jit_compile is True
    with pytest.raises(SystemExit):
        gpu.make_plan(parser.parse_args(["--policies", "bfloat16"]), parser)  # not a policy name


def test_ratios_pair_implementations_measured_at_the_same_point():
    def entry(name, tokens, speed):
        return {"implementation": name, "preset": "base", "policy": "mixed_bfloat16", "tokens_per_step": tokens, "tokens_per_s": speed}

    parts = {
        "jax": {"training": [entry("ours_jax", 8192, 300.0), entry("flax", 8192, 400.0), entry("ours_jax", 4096, 1.0)]},
        "torch": {"training": [entry("ours_torch", 8192, 270.0), entry("torch_compiled", 8192, 300.0)]},
    }
    values = {(row["tokens_per_step"], row["ratio"]): row["value"] for row in gpu.ratios(parts)}
    assert values == {
        (8192, "ours_torch / torch_compiled"): 0.9,
        (8192, "ours_jax / flax"): 0.75,
        (8192, "ours_torch / ours_jax"): 0.9,
    }


def test_the_flax_peers_smoothed_loss_equals_optax_on_smoothed_one_hot_targets():
    flax_peer = pytest.importorskip("bench.flax_peer", reason="flax and optax are optional (not installed)")
    import jax
    import optax

    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 7)).astype("float32")
    labels = np.array([[1, 0, 3], [6, 2, 0]])  # 0 is padding: two of six tokens
    smoothed = optax.smooth_labels(jax.nn.one_hot(labels, 7), 0.1)
    per_token = np.asarray(optax.softmax_cross_entropy(logits, smoothed))
    expected = per_token[labels != 0].mean()
    np.testing.assert_allclose(float(flax_peer.smoothed_cross_entropy(logits, labels, 0.1)), expected, rtol=1e-6)
