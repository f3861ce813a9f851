"""Keras' own `model.quantize("int8")` on a Transformer: right answers, not silent garbage.

Attention projects Q, K and V with one fused matmul over its `Dense` kernels; a
quantized `Dense` keeps an int8 kernel and a separate scale, so after `quantize` the
projections must go through each `Dense`'s own call. These tests would fail if the
int8 kernel were read as weights (logits off by orders of magnitude).

A quantized model saves as `.keras` and loads back quantized (the model's config
carries a `DTypePolicyMap` of its int8 layers), on every backend, and exports as a
SavedModel whose variables are int8 (TensorFlow).
"""

import gc
import os
import shutil
import warnings

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy
from tiny_translation import MAX_EXTRA, make_tiny_model_dir, pick_sentences

import keras_transformer as kt
from keras_transformer.inference import decoding
from keras_transformer.model.directory import load_model_file

INPUTS = {
    "encoder_inputs": np.array([[5, 6, 7, 8, 3, 0], [9, 10, 11, 3, 0, 0]], "int32"),
    "decoder_inputs": np.array([[2, 12, 13, 14, 15], [2, 16, 17, 0, 0]], "int32"),
}


def quantize_int8(model, monkeypatch):
    """`model.quantize("int8")`, quietly: Keras names each layer it leaves in float in a warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.quantize("int8")
    return model


def _quantized_model(monkeypatch):
    model = kt.build_transformer(tiny_config(vocab_size=64, d_model=32, d_ff=64, num_heads=4))
    float_logits = to_numpy(model(INPUTS))
    return quantize_int8(model, monkeypatch), float_logits


def _int8_variables(model):
    return {weight.path for weight in model.weights if keras.backend.standardize_dtype(weight.dtype) == "int8"}


def test_int8_logits_stay_close_to_the_float_model(monkeypatch):
    model, float_logits = _quantized_model(monkeypatch)
    quantized = [layer.name for layer in model._flatten_layers() if getattr(layer, "quantization_mode", None)]
    # Every projection of attention and the feed-forward network is int8 now.
    assert {"query", "key", "value", "attention_output", "intermediate_dense", "output_dense"} <= set(quantized)
    logits = to_numpy(model(INPUTS))
    scale = np.abs(float_logits).max()
    assert np.abs(logits - float_logits).max() < 0.05 * scale


def test_int8_cached_decoding_equals_the_teacher_forced_pass(monkeypatch):
    model, _ = _quantized_model(monkeypatch)
    cached, _ = decoding.greedy_decode(model, INPUTS["encoder_inputs"], max_length=6)
    uncached, _ = decoding.greedy_decode_uncached(model, INPUTS["encoder_inputs"], max_length=6)
    np.testing.assert_array_equal(to_numpy(cached), to_numpy(uncached))


def test_an_int8_model_saves_and_loads_quantized_with_identical_outputs(tmp_path, monkeypatch):
    model, _ = _quantized_model(monkeypatch)
    logits = to_numpy(model(INPUTS))
    model.save(str(tmp_path / "int8.keras"))

    loaded = keras.saving.load_model(str(tmp_path / "int8.keras"))
    # Every projection is int8 again: 4 attention + 2 feed-forward kernels per encoder
    # layer, 8 + 2 per decoder layer; the tied embedding stays float.
    assert _int8_variables(loaded) == _int8_variables(model)
    assert len(_int8_variables(loaded)) == 16
    np.testing.assert_array_equal(to_numpy(loaded(INPUTS)), logits)
    # Each layer holds its own policy again (not the map it was built from), so the
    # loaded model saves again, and the copy loads through the model-directory loader.
    assert loaded.get_layer("decoder_layer_0").cross_attention.key_dense.dtype_policy.name == "int8_from_float32"
    loaded.save(str(tmp_path / "again.keras"))
    again = load_model_file(tmp_path / "again.keras")
    np.testing.assert_array_equal(to_numpy(again(INPUTS)), logits)
    # A float model's config is unchanged: no dtype entry.
    assert "dtype" not in kt.build_transformer(tiny_config()).get_config()


def test_an_int8_model_directory_loads_quantized(tmp_path, monkeypatch):
    from keras_transformer.model.directory import load_model_and_tokenizer

    model, tokenizer = make_tiny_model_dir(tmp_path)
    quantize_int8(model, monkeypatch)
    model.save(str(tmp_path / "model.keras"))
    loaded, loaded_tokenizer = load_model_and_tokenizer(tmp_path)
    assert loaded_tokenizer.fingerprint == tokenizer.fingerprint
    assert _int8_variables(loaded) == _int8_variables(model)
    inputs = {key: value[:, :4] for key, value in INPUTS.items()}  # ids within the tiny vocabulary
    np.testing.assert_array_equal(to_numpy(loaded(inputs)), to_numpy(model(inputs)))


@pytest.mark.skipif(keras.backend.backend() != "tensorflow", reason="SavedModel export needs the TensorFlow backend")
def test_an_int8_saved_model_holds_int8_weights_and_translates_as_the_translator(tmp_path, monkeypatch):
    import tensorflow as tf

    from keras_transformer.inference import export
    from keras_transformer.inference.translator import Translator

    (tmp_path / "model").mkdir()
    model, tokenizer = make_tiny_model_dir(tmp_path / "model")
    quantize_int8(model, monkeypatch)
    model.save(str(tmp_path / "model" / "model.keras"))
    path = export.export_saved_model(tmp_path / "model", base_dir=str(tmp_path / "exports"), name="int8", beam_size=1, max_extra=MAX_EXTRA)

    variables = tf.train.load_checkpoint(os.path.join(path, "variables", "variables"))
    dtypes = variables.get_variable_to_dtype_map()
    assert sum(dtype == tf.int8 for dtype in dtypes.values()) == 16
    assert not export.saved_model_op_types(path) & export.PYTHON_FUNCTION_OPS
    sentences = pick_sentences(tokenizer, count=4)
    served, _ = export.translate_with_saved_model(path, sentences)
    expected = Translator(tmp_path / "model", beam_size=1, max_extra=MAX_EXTRA, batch_size=4, jit_compile=False)
    assert served == expected.translate(sentences)
    shutil.rmtree(tmp_path / "exports")


def test_transformer_quantize_collects_once_and_equals_keras_quantize():
    # Transformer.quantize defers Keras' per-kernel gc.collect to one at the end; the
    # result must be what keras.Model.quantize gives, and gc.collect must be restored.
    config = tiny_config(vocab_size=64, d_model=32, d_ff=64, num_heads=4)
    ours = kt.build_transformer(config)
    reference = kt.build_transformer(config)
    reference.set_weights(ours.get_weights())
    collect = gc.collect
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ours.quantize("int8")
        assert gc.collect is collect
        # Keras' own path collects after every kernel it drops, a second each late in a
        # test session; a collection cannot change the weights, so the reference skips it.
        gc.collect = lambda generation=2: 0
        try:
            keras.Model.quantize(reference, "int8")
        finally:
            gc.collect = collect
    np.testing.assert_array_equal(to_numpy(ours(INPUTS)), to_numpy(reference(INPUTS)))
    assert sorted(v.path for v in ours.variables) == sorted(v.path for v in reference.variables)
