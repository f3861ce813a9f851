"""MultiHeadAttention against a NumPy reference, on the fused and the explicit path."""

import keras
import numpy as np
import pytest
from conftest import to_numpy

from keras_transformer.layers import MultiHeadAttention, masks

NUM_HEADS, KEY_DIM, WIDTH = 2, 4, 8


def numpy_attention(layer, query, value, mask=None):
    """softmax(Q K^T / sqrt(d_k)) V per head, concatenated, times W^O: the paper's 3.2."""

    def project(dense, x):
        return x @ to_numpy(dense.kernel) + to_numpy(dense.bias)

    batch, t, s = query.shape[0], query.shape[1], value.shape[1]
    q = project(layer.query_dense, query).reshape(batch, t, NUM_HEADS, KEY_DIM)
    k = project(layer.key_dense, value).reshape(batch, s, NUM_HEADS, KEY_DIM)
    v = project(layer.value_dense, value).reshape(batch, s, NUM_HEADS, KEY_DIM)
    scores = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(KEY_DIM)
    if mask is not None:
        scores = np.where(mask[:, None], scores, -np.inf)
    scores = scores - scores.max(-1, keepdims=True)
    probs = np.exp(scores)
    probs = probs / probs.sum(-1, keepdims=True)
    heads = np.einsum("bnts,bsnh->btnh", probs, v).reshape(batch, t, NUM_HEADS * KEY_DIM)
    return project(layer.output_dense, heads), probs


def make_inputs(rng, t, s):
    query = rng.normal(size=(2, t, WIDTH)).astype("float32")
    value = rng.normal(size=(2, s, WIDTH)).astype("float32")
    return query, value


@pytest.mark.parametrize("path", ["fused", "explicit"])
@pytest.mark.parametrize("kind", ["self", "cross", "one_query"])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_equals_numpy(rng, path, kind, masked):
    # One query position (a decoding step) takes `single_query_attention` on the fused path.
    t, s = {"self": (5, 5), "cross": (4, 6), "one_query": (1, 6)}[kind]
    query, value = make_inputs(rng, t, s)
    if kind == "self":
        value = query
    mask = None
    if masked:
        key_mask = np.ones((2, s), bool)
        key_mask[0, -2:] = False  # the first sentence has two padded keys
        mask = np.broadcast_to(key_mask[:, None, :], (2, t, s))
        if kind == "self":
            mask = mask & np.tril(np.ones((t, s), bool))
    layer = MultiHeadAttention(NUM_HEADS, KEY_DIM)
    # The explicit path is taken when scores are requested.
    result = layer(query, value, attention_mask=mask, return_attention_scores=path == "explicit")
    expected, expected_probs = numpy_attention(layer, query, value, mask)
    if path == "explicit":
        result, probs = result
        np.testing.assert_allclose(to_numpy(probs), expected_probs, atol=1e-6)
    np.testing.assert_allclose(to_numpy(result), expected, atol=1e-5)


def test_fused_and_explicit_paths_agree(rng):
    query, value = make_inputs(rng, 4, 6)
    mask = rng.random((2, 4, 6)) > 0.3
    mask[:, :, 0] = True
    layer = MultiHeadAttention(NUM_HEADS, KEY_DIM)
    fused = layer(query, value, attention_mask=mask)
    explicit, _ = layer(query, value, attention_mask=mask, return_attention_scores=True)
    np.testing.assert_allclose(to_numpy(fused), to_numpy(explicit), atol=1e-6)


def test_implicit_key_padding_equals_explicit_mask(rng):
    """A [B, 1, S] key padding mask equals the same mask spelled out as [B, T, S]."""
    query, value = make_inputs(rng, 3, 5)
    key_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    layer = MultiHeadAttention(NUM_HEADS, KEY_DIM)
    lifted = layer(query, value, attention_mask=masks.key_padding_mask(key_mask))
    spelled = layer(query, value, attention_mask=np.broadcast_to(key_mask[:, None], (2, 3, 5)))
    np.testing.assert_allclose(to_numpy(lifted), to_numpy(spelled), atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("scores", [False, True])
@pytest.mark.parametrize("t", [3, 1])
def test_fully_masked_row_gives_zeros_not_nan(rng, dtype, scores, t):
    query, value = make_inputs(rng, t, 4)
    mask = np.ones((2, t, 4), bool)
    mask[1] = False  # the second sentence sees no key at all (an all-padding source)
    layer = MultiHeadAttention(NUM_HEADS, KEY_DIM, dtype=dtype)
    result = layer(query, value, attention_mask=mask, return_attention_scores=scores)
    if scores:
        result, probs = result
        probs = to_numpy(keras.ops.cast(probs, "float32"))
        assert np.all(probs[1] == 0.0)
        np.testing.assert_allclose(probs[0].sum(-1), 1.0, atol=1e-2)
    out = to_numpy(keras.ops.cast(result, "float32"))
    assert np.all(np.isfinite(out))
    # Zero attention output, so only the output projection's bias remains.
    bias = to_numpy(keras.ops.cast(layer.output_dense.bias, "float32"))
    np.testing.assert_array_equal(out[1], np.broadcast_to(bias, out[1].shape))


def test_cache_step_by_step_equals_full_causal_pass(rng):
    query, _ = make_inputs(rng, 5, 5)
    layer = MultiHeadAttention(NUM_HEADS, KEY_DIM)
    full = to_numpy(layer(query, query, attention_mask=masks.causal_mask(5)))
    cache = keras.ops.zeros((2, 2, 5, NUM_HEADS, KEY_DIM))
    for i in range(5):
        step = query[:, i : i + 1]
        out, cache = layer(
            step, step, attention_mask=masks.causal_mask(1, 5, offset=i), cache=cache, cache_update_index=i
        )
        np.testing.assert_allclose(to_numpy(out)[:, 0], full[:, i], atol=1e-5)


def test_cross_attention_cache_is_used_as_is(rng):
    query, value = make_inputs(rng, 2, 6)
    layer = MultiHeadAttention(NUM_HEADS, KEY_DIM)
    expected = to_numpy(layer(query, value))
    cache = layer.compute_cross_attention_cache(value)
    out, returned = layer(query, None, cache=cache)
    np.testing.assert_allclose(to_numpy(out), expected, atol=1e-5)
    np.testing.assert_array_equal(to_numpy(returned), to_numpy(cache))


def test_masks_module():
    np.testing.assert_array_equal(
        to_numpy(masks.causal_mask(3)), np.array([[1, 0, 0], [1, 1, 0], [1, 1, 1]], bool)
    )
    np.testing.assert_array_equal(
        to_numpy(masks.causal_mask(1, 4, offset=2)), np.array([[1, 1, 1, 0]], bool)
    )
    np.testing.assert_array_equal(
        to_numpy(masks.padding_mask(np.array([[5, 6, 0]]))), np.array([[True, True, False]])
    )
    merged = masks.merge_masks(None, np.array([[True, False]]), np.array([[True, True]]), None)
    np.testing.assert_array_equal(to_numpy(merged), np.array([[True, False]]))
    assert masks.merge_masks(None, None) is None


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(num_heads=0, key_dim=4), "`num_heads` must be a positive integer. Received: num_heads=0"),
        (dict(num_heads=2, key_dim=-1), "`key_dim` must be a positive integer. Received: key_dim=-1"),
        (dict(num_heads=2, key_dim=4, dropout=1.5), r"`dropout` must be a number in \[0, 1\). Received: dropout=1.5"),
    ],
)
def test_invalid_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MultiHeadAttention(**kwargs)
