"""Every model option of the catalogue trains through PyTorch's captured step past its capture.

Each option gets a tiny model trained a few batches with the step captured at its first
batch (`capture_after=1`), beside the same model trained by Keras' eager step: the
captured one must have captured (no fallback warning), and, where no dropout draws
random numbers from PyTorch's global generator, give Keras' logs. Word dropout draws
from the layer's seed in the graph (`layers.word_dropout.token_uniform`), so it is
compared too, and it trains through `jit_compile="auto"` and `jit_compile=True`.
"""

import warnings

import keras
import numpy as np
import pytest
from conftest import tiny_config

import keras_transformer as kt
from keras_transformer.graph_cache import CaptureFallbackWarning
from keras_transformer.train.compile import compile_transformer

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="the captured training step is the PyTorch backend's"
)

VOCAB = 32

# name: the TransformerConfig fields that select the option (docs/model.md's catalogue).
OPTIONS = {
    "paper": {},
    "norm_first": {"norm_first": True},
    "scale_norm": {"normalization": "scale"},
    "learned_positions": {"position_encoding": "learned"},
    "fixed_positions": {"position_encoding": "fixed"},
    "gelu": {"activation": "gelu"},
    "swish": {"activation": "swish"},
    "gated_ffn": {"gated_ffn": True, "activation": "gelu"},
    "word_dropout": {"source_word_dropout": 0.3, "target_word_dropout": 0.3},
    "untied_embeddings": {"share_embeddings": False},
    "fix_norm": {"fix_norm": True},
    "unscaled_embeddings": {"scale_embeddings": False},
    "output_bias": {"output_bias": True},
    "dropouts": {"dropout": 0.1, "attention_dropout": 0.1, "activation_dropout": 0.1},
    "mixed_bfloat16": {"dtype_policy": "mixed_bfloat16"},
    "mixed_float16": {"dtype_policy": "mixed_float16"},  # a LossScaleOptimizer: Keras' apply
}
# Options whose capture is expected to fail (and fall back with one warning): none today.
NOT_CAPTURED = frozenset()
# Dropout drawn from PyTorch's global generator: the graph's draws are not the eager step's.
RANDOM = frozenset({"dropouts"})


def batches(count, rows=2, length=5, seed=0):
    rng = np.random.default_rng(seed)
    result = []
    for _ in range(count):
        x = {
            "encoder_inputs": rng.integers(4, VOCAB, (rows, length)).astype("int32"),
            "decoder_inputs": rng.integers(4, VOCAB, (rows, length + 1)).astype("int32"),
        }
        result.append((x, rng.integers(0, VOCAB, (rows, length + 1)).astype("int32")))
    return result


def train(overrides, data, captured):
    """Logs of a seeded tiny model trained on `data`, and its captured step (or None)."""
    from keras_transformer.train.torch_step import CapturedTrainStep

    keras.utils.set_random_seed(1)
    model = compile_transformer(kt.Transformer(tiny_config(vocab_size=VOCAB, **overrides)), jit_compile=False)
    if captured:
        model.captured_train_step = CapturedTrainStep(model, capture_after=1)
    logs = [model.train_on_batch(x, y, return_dict=True) for x, y in data]
    return logs, model.captured_train_step


@pytest.mark.parametrize("name", sorted(OPTIONS))
def test_each_option_trains_through_the_captured_step(name):
    data = batches(3)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureFallbackWarning)
        logs, step = train(OPTIONS[name], data, captured=True)
    fallbacks = [str(w.message) for w in caught if issubclass(w.category, CaptureFallbackWarning)]
    if name in NOT_CAPTURED:
        assert (step.captures, len(fallbacks)) == (0, 1), fallbacks
    else:
        assert (step.captures, fallbacks) == (1, [])
    assert all(np.isfinite(entry["loss"]) for entry in logs), logs
    if name not in RANDOM:
        eager_logs, _ = train(OPTIONS[name], data, captured=False)
        tolerance = 1e-2 if "dtype_policy" in OPTIONS[name] else 1e-5
        for actual, expected in zip(logs, eager_logs):
            assert actual == pytest.approx(expected, rel=tolerance), name


def fit_and_step(model, data):
    """`fit` on `data` (the capture happens during it), then one more batch's logs."""
    x = {key: np.concatenate([batch[0][key] for batch in data]) for key in data[0][0]}
    y = np.concatenate([batch[1] for batch in data])
    history = model.fit(x, y, batch_size=2, epochs=1, shuffle=False, verbose=0).history
    return history, model.train_on_batch(*data[0], return_dict=True)


@pytest.mark.parametrize("jit_compile", ["auto", True])
def test_word_dropout_trains_through_the_captured_step_in_both_modes(jit_compile):
    """The user's run that stopped at the capture: word dropout on both sides, PyTorch."""
    keras.utils.set_random_seed(1)
    config = tiny_config(vocab_size=VOCAB, source_word_dropout=0.1, target_word_dropout=0.1)
    # jit_compile=True compiles with $KERAS_TRANSFORMER_TORCH_COMPILER: aot_eager here (conftest.py).
    model = compile_transformer(kt.Transformer(config), jit_compile=jit_compile)
    step = model.captured_train_step
    step.graphs.capture_after = 3  # "auto" captures at a shape's 32nd batch: sooner here
    with warnings.catch_warnings():
        warnings.simplefilter("error", CaptureFallbackWarning)
        history, last = fit_and_step(model, batches(6))
    assert step.captures == 1
    assert step.graphs.compiles == (1 if jit_compile is True else 0)
    assert np.isfinite(history["loss"][0]) and np.isfinite(last["loss"])  # the last batch ran the graph
