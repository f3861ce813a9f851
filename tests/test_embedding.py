"""Token embedding (scaled, tied) and position encodings."""

import math

import keras
import numpy as np
import pytest
from conftest import to_numpy

from keras_transformer.layers import LearnedPositionEmbedding, SinusoidalPositionEncoding, TokenEmbedding


@pytest.mark.parametrize(
    "pos, channel, expected",
    [
        # PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)), d = 8.
        (0, 0, 0.0),  # sin(0)
        (0, 1, 1.0),  # cos(0)
        (1, 0, 0.8414709848078965),  # sin(1)
        (1, 1, 0.5403023058681398),  # cos(1)
        (3, 2, 0.29552020666133955),  # sin(3 / 10000^(2/8)) = sin(0.3)
        (3, 3, 0.955336489125606),  # cos(0.3)
        (5, 6, 0.004999979166692708),  # sin(5 / 10000^(6/8)) = sin(0.005)
        (5, 7, 0.9999875000260416),  # cos(0.005)
    ],
)
def test_sinusoid_equals_hand_computed(pos, channel, expected):
    encoding = to_numpy(SinusoidalPositionEncoding(max_length=16)(np.zeros((1, 6, 8), "float32")))
    assert encoding[0, pos, channel] == pytest.approx(expected, abs=1e-6)


def test_sinusoid_start_index_shifts_positions():
    layer = SinusoidalPositionEncoding(max_length=16)
    full = to_numpy(layer(np.zeros((2, 6, 8), "float32")))
    step = to_numpy(layer(np.zeros((2, 1, 8), "float32"), start_index=4))
    np.testing.assert_allclose(step[:, 0], full[:, 4], atol=1e-6)


def test_sinusoid_refuses_sequences_over_max_length():
    with pytest.raises(ValueError, match="Sequence length 9 exceeds max_length=8"):
        SinusoidalPositionEncoding(max_length=8)(np.zeros((1, 9, 4), "float32"))


def test_learned_positions_start_index_and_values():
    layer = LearnedPositionEmbedding(max_length=10)
    full = to_numpy(layer(np.zeros((2, 5, 4), "float32")))
    table = to_numpy(layer.position_embeddings)
    np.testing.assert_allclose(full[1], table[:5], atol=0)
    step = to_numpy(layer(np.zeros((2, 1, 4), "float32"), start_index=3))
    np.testing.assert_allclose(step[:, 0], np.broadcast_to(table[3], (2, 4)), atol=0)


def test_token_embedding_is_scaled_and_tied():
    layer = TokenEmbedding(vocab_size=32, d_model=16)
    ids = np.array([[4, 7, 0]], "int32")
    embedded = to_numpy(layer(ids))
    matrix = to_numpy(layer.embeddings)
    np.testing.assert_allclose(embedded[0], matrix[[4, 7, 0]] * math.sqrt(16), rtol=1e-6)
    hidden = np.random.default_rng(0).normal(size=(1, 3, 16)).astype("float32")
    logits = layer(hidden, reverse=True)
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(logits), hidden @ matrix.T, rtol=1e-5, atol=1e-5)


def test_token_embedding_reverse_logits_are_float32_under_bfloat16():
    layer = TokenEmbedding(vocab_size=32, d_model=16, dtype="mixed_bfloat16")
    hidden = layer(np.array([[4, 5]], "int32"))
    assert keras.backend.standardize_dtype(hidden.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(layer(hidden, reverse=True).dtype) == "float32"


@pytest.mark.parametrize("bad_id", [32, 99, -1, -32], ids=["vocab_size", "far_above", "minus_1", "minus_vocab_size"])
def test_ids_outside_the_vocabulary_embed_as_nan_never_as_another_token(bad_id):
    """Inside compiled calls ids cannot be checked: a bad id must be loud on every backend.

    Gathered as it is, -1 would wrap around to the last row on every backend, and 32
    would raise, read zeros or give NaN depending on the backend and device.
    """
    layer = TokenEmbedding(vocab_size=32, d_model=8)
    embedded = to_numpy(layer(np.array([[4, bad_id, 31, 0]], "int32")))
    matrix = to_numpy(layer.embeddings)
    assert np.isnan(embedded[0, 1]).all()
    np.testing.assert_allclose(embedded[0, [0, 2, 3]], matrix[[4, 31, 0]] * math.sqrt(8), rtol=1e-6)


class _SymbolicLength:
    """A length known only symbolically (as JAX's shape-polymorphic export traces one)."""

    def __gt__(self, other):
        raise TypeError("Symbolic dimension comparison 'b' > '8' is inconclusive")


class _Traced:
    shape = (2, _SymbolicLength(), 4)


def test_length_check_lets_symbolic_lengths_through():
    """Keras' `model.export` on JAX traces with symbolic lengths; the check must not compare them."""
    from keras_transformer.layers.embedding import _check_length

    _check_length(_Traced(), max_length=8)  # no comparison, no error
    _check_length(np.zeros((1, 8, 4)), max_length=8)
    with pytest.raises(ValueError, match="Sequence length 9 exceeds max_length=8"):
        _check_length(np.zeros((1, 9, 4)), max_length=8)
