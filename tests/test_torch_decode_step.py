"""PyTorch decoding through `decode_step` captured once per shape (`inference.torch_decode_step`)."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.inference.compiled import CompiledDecoder

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="the captured decoding step is the PyTorch backend's"
)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(0)
    return kt.Transformer(kt.TransformerConfig.from_preset("tiny", vocab_size=40))


SOURCES = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]], "int32")


# Beam search runs its first step on one row a sentence, before the beams: a second shape.
SHAPES = {"greedy": 1, "beam": 2}


@pytest.mark.parametrize("method, kwargs", [("greedy", {}), ("beam", {"beam_size": 3, "alpha": 0.6})])
def test_captured_decoding_equals_eager_decoding(model, method, kwargs):
    eager = CompiledDecoder(model, method, jit_compile=False, max_length=12, **kwargs)
    captured = CompiledDecoder(model, method, max_length=12, **kwargs)
    captured.captured_steps.graphs.capture_after = 1
    expected_tokens, expected_scores = eager(SOURCES)
    for _ in range(2):  # the second call reuses the graph
        tokens, scores = captured(SOURCES)
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(tokens), keras.ops.convert_to_numpy(expected_tokens))
        np.testing.assert_allclose(keras.ops.convert_to_numpy(scores), keras.ops.convert_to_numpy(expected_scores), atol=1e-5)
    assert captured.captured_steps.captures == SHAPES[method]  # each shape once: every step and both calls


def test_captured_decoding_sees_weight_updates(model):
    decoder = CompiledDecoder(model, "greedy", max_length=8)
    decoder.captured_steps.graphs.capture_after = 1
    before = keras.ops.convert_to_numpy(decoder(SOURCES)[1])
    variable = next(v for v in model.trainable_variables if "embedding" in v.path)
    original = keras.ops.convert_to_numpy(variable).copy()
    try:
        variable.assign(original * 3.0)
        after = keras.ops.convert_to_numpy(decoder(SOURCES)[1])
        reference = keras.ops.convert_to_numpy(CompiledDecoder(model, "greedy", jit_compile=False, max_length=8)(SOURCES)[1])
    finally:
        variable.assign(original)
    assert not np.allclose(after, before)
    np.testing.assert_allclose(after, reference, atol=1e-5)


def test_short_searches_run_eagerly_until_a_shape_recurs(model):
    decoder = CompiledDecoder(model, "greedy", max_length=3)  # 3 steps a search
    assert decoder.captured_steps.graphs.capture_after > 3
    decoder(SOURCES)
    assert decoder.captured_steps.captures == 0
    for _ in range(3):
        decoder(SOURCES)
    assert decoder.captured_steps.captures == 1


@pytest.mark.parametrize("method, kwargs", [("greedy", {}), ("beam", {"beam_size": 3, "alpha": 0.6})])
def test_a_recurring_shape_is_compiled_once_and_decodes_as_eager(model, method, kwargs):
    """The graph is compiled at the shape's `compile_after`-th step, never again."""
    eager = CompiledDecoder(model, method, jit_compile=False, max_length=12, **kwargs)
    decoder = CompiledDecoder(model, method, max_length=12, **kwargs)
    steps = decoder.captured_steps
    assert steps.compiler == "aot_eager"  # $KERAS_TRANSFORMER_TORCH_COMPILER in the tests (conftest.py)
    steps.graphs.capture_after, steps.graphs.compile_after = 2, 15
    expected_tokens, expected_scores = (keras.ops.convert_to_numpy(t) for t in eager(SOURCES))
    compiles = []
    for _ in range(3):  # 12 steps a search: compiled during the second
        tokens, scores = (keras.ops.convert_to_numpy(t) for t in decoder(SOURCES))
        compiles.append(steps.compiles)
        np.testing.assert_array_equal(tokens, expected_tokens)
        np.testing.assert_allclose(scores, expected_scores, atol=1e-5)
    assert compiles == [0, 1, 1]  # beam's first-step shape runs once a search: never 15 times here
    assert steps.captures == SHAPES[method]
