"""Keras' own `model.quantize("int8")` on a Transformer: right answers, not silent garbage.

Attention projects Q, K and V with one fused matmul over its `Dense` kernels; a
quantized `Dense` keeps an int8 kernel and a separate scale, so after `quantize` the
projections must go through each `Dense`'s own call. These tests would fail if the
int8 kernel were read as weights (logits off by orders of magnitude).

Not covered yet: saving a quantized model as `.keras` and loading it back (the blocks
build their `Dense` layers with the block's float policy, so loading refuses the int8
weights with Keras' "expected 2 variables" error; docs/errors_and_limits.md says so).
"""

import warnings

import numpy as np
from conftest import tiny_config, to_numpy

import keras_transformer as kt
from keras_transformer.inference import decoding

INPUTS = {
    "encoder_inputs": np.array([[5, 6, 7, 8, 3, 0], [9, 10, 11, 3, 0, 0]], "int32"),
    "decoder_inputs": np.array([[2, 12, 13, 14, 15], [2, 16, 17, 0, 0]], "int32"),
}


def _quantized_model():
    model = kt.build_transformer(tiny_config(vocab_size=64, d_model=32, d_ff=64, num_heads=4))
    float_logits = to_numpy(model(INPUTS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras names each layer it leaves in float
        model.quantize("int8")
    return model, float_logits


def test_int8_logits_stay_close_to_the_float_model():
    model, float_logits = _quantized_model()
    quantized = [layer.name for layer in model._flatten_layers() if getattr(layer, "quantization_mode", None)]
    # Every projection of attention and the feed-forward network is int8 now.
    assert {"query", "key", "value", "attention_output", "intermediate_dense", "output_dense"} <= set(quantized)
    logits = to_numpy(model(INPUTS))
    scale = np.abs(float_logits).max()
    assert np.abs(logits - float_logits).max() < 0.05 * scale


def test_int8_cached_decoding_equals_the_teacher_forced_pass():
    model, _ = _quantized_model()
    cached, _ = decoding.greedy_decode(model, INPUTS["encoder_inputs"], max_length=6)
    uncached, _ = decoding.greedy_decode_uncached(model, INPUTS["encoder_inputs"], max_length=6)
    np.testing.assert_array_equal(to_numpy(cached), to_numpy(uncached))
