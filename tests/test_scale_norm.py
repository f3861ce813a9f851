"""ScaleNorm and FixNorm (Nguyen and Salazar, 2019): values, the model built with them, and training."""

import math

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy
from tiny_translation import MAX_LENGTH, VOCAB_SIZE, tiny_sentences

import keras_transformer as kt
from keras_transformer import layers
from keras_transformer.layers.scale_norm import ScaleNorm
from keras_transformer.train.compile import make_optimizer

ENCODER = np.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]], "int32")
DECODER = np.array([[2, 15, 16, 17, 0], [2, 18, 19, 20, 21]], "int32")


def logits_of(model):
    return to_numpy(model({"encoder_inputs": ENCODER, "decoder_inputs": DECODER}))


def test_scale_norm_scales_each_vector_to_the_gain():
    norm = ScaleNorm(name="probe")
    x = np.array([[[3.0, 4.0, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]], "float32")
    out = to_numpy(norm(x))
    assert float(to_numpy(norm.gain)) == 2.0  # sqrt(4): the length of a unit-variance vector
    # 2 * (3, 4) / 5; a zero vector stays zero (its norm is floored at epsilon), not NaN.
    np.testing.assert_allclose(out, [[[1.2, 1.6, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]]], rtol=1e-6)
    norm.gain.assign(0.5)
    np.testing.assert_allclose(to_numpy(norm(x))[0, 0], [0.3, 0.4, 0.0, 0.0], rtol=1e-6)
    assert [w.path for w in norm.weights] == ["probe/scale_norm_gain"]


def test_scale_norm_under_bfloat16_returns_bfloat16_from_a_float32_norm():
    norm = ScaleNorm(dtype="mixed_bfloat16")
    x = np.full((1, 256), 100.0, "float32")  # its squares sum to 2.56e6, past bfloat16's precision
    out = norm(keras.ops.cast(x, "bfloat16"))
    assert keras.backend.standardize_dtype(out.dtype) == "bfloat16"
    assert keras.backend.standardize_dtype(norm.gain.dtype) == "float32"
    np.testing.assert_allclose(to_numpy(keras.ops.cast(out, "float32")), np.ones((1, 256)), rtol=1e-2)


def test_bad_scale_norm_arguments_are_refused():
    with pytest.raises(ValueError, match=r"epsilon.*Received: epsilon=0"):
        ScaleNorm(epsilon=0)
    with pytest.raises(ValueError, match=r"known last dimension"):
        ScaleNorm().build((2, None))
    with pytest.raises(ValueError, match=r"`normalization` must be one of \('layer', 'scale'\)\. Received: normalization='rms'"):
        layers.EncoderBlock(num_heads=2, intermediate_dim=16, normalization="rms")
    with pytest.raises(ValueError, match=r"`normalization` must be one of .* Received: normalization='rms'"):
        kt.TransformerConfig(normalization="rms")
    with pytest.raises(ValueError, match=r"`fix_norm` must be True or False. Received: fix_norm=1"):
        layers.TokenEmbedding(8, 4, fix_norm=1)


def test_fix_norm_embeds_and_projects_with_unit_rows():
    embedding = layers.TokenEmbedding(vocab_size=5, d_model=4, fix_norm=True)
    embedding.build()
    table = np.array([[0, 0, 0, 0], [3, 4, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0.5], [2, 0, 0, 0]], "float32")
    embedding.embeddings.assign(table)
    unit = np.array([[0, 0, 0, 0], [0.6, 0.8, 0, 0], [0.5, 0.5, 0.5, 0.5], [0, 0, 0, 1], [1, 0, 0, 0]], "float32")
    out = to_numpy(embedding(np.array([[1, 2, 3, 0]], "int32")))
    # sqrt(d_model) = 2 times each unit row; the all-zero row (padding) stays zero.
    np.testing.assert_allclose(out[0], 2.0 * unit[[1, 2, 3, 0]], rtol=1e-6)
    x = np.array([[[1.0, 2.0, 3.0, 4.0]]], "float32")
    np.testing.assert_allclose(to_numpy(embedding(x, reverse=True)), x @ unit.T, rtol=1e-6)
    # An id outside the vocabulary still embeds as NaN, not as a normalized row.
    assert np.isnan(to_numpy(embedding(np.array([[7]], "int32")))).all()


def test_encoder_block_with_scale_norm_equals_hand_wired_sublayers():
    block = layers.EncoderBlock(num_heads=2, intermediate_dim=16, dropout=0.0, normalization="scale")
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32"))
    block.build(x.shape)
    assert type(block.self_attention_norm) is ScaleNorm and type(block.feed_forward_norm) is ScaleNorm
    block.feed_forward_norm.gain.assign(1.5)  # two gains that differ, so a swapped norm shows
    out = to_numpy(block(x))

    def scale_norm(v, gain):
        v = to_numpy(v)
        return gain * v / np.linalg.norm(v, axis=-1, keepdims=True)

    h = scale_norm(x + block.self_attention(x, x), math.sqrt(8))
    expected = scale_norm(h + to_numpy(block.feed_forward(h)), 1.5)
    np.testing.assert_allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
def test_cached_decoding_equals_teacher_forced_pass_with_scale_norm_and_fix_norm(norm_first):
    model = kt.build_transformer(
        tiny_config(num_decoder_layers=2, norm_first=norm_first, normalization="scale", fix_norm=True)
    )
    assert not any("gamma" in w.path or "beta" in w.path for w in model.weights)  # no LayerNorm left
    full = logits_of(model)
    encoder_outputs, encoder_mask = model.encode(ENCODER)
    self_caches, cross_caches = model.initial_cache(encoder_outputs, DECODER.shape[1])
    for i in range(DECODER.shape[1]):
        step, self_caches = model.decode_step(DECODER[:, i : i + 1], i, self_caches, cross_caches, encoder_mask)
        rows = [0, 1] if i < 4 else [1]  # row 0 is padding from position 4
        np.testing.assert_allclose(to_numpy(step)[rows], full[rows, i], atol=1e-5)


def test_post_norm_logits_are_the_last_gain_times_cosines():
    """Post-norm ScaleNorm + FixNorm: a decoder state has length g, so |logit| <= g, and the
    logits do not change when embedding rows are rescaled (only their directions count)."""
    model = kt.build_transformer(tiny_config(normalization="scale", fix_norm=True))
    model.get_layer("decoder_layer_0").feed_forward_norm.gain.assign(3.0)
    logits = logits_of(model)
    assert 1.0 < np.abs(logits).max() <= 3.0 + 1e-5
    embeddings = model.get_layer("token_embedding").embeddings
    row_scales = np.random.default_rng(4).uniform(0.1, 10.0, size=(embeddings.shape[0], 1))
    embeddings.assign(to_numpy(embeddings) * row_scales.astype("float32"))
    np.testing.assert_allclose(logits_of(model), logits, atol=1e-4)


def test_keras_file_round_trip_with_scale_norm_and_fix_norm(tmp_path):
    config = tiny_config(norm_first=True, normalization="scale", fix_norm=True)
    model = kt.build_transformer(config)
    for weight in model.weights:
        if weight.path.endswith("scale_norm_gain"):
            weight.assign(keras.random.uniform((), 1.0, 5.0, seed=len(weight.path)))
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.models.load_model(path, safe_mode=True)
    assert restored.config == config
    np.testing.assert_array_equal(logits_of(restored), logits_of(model))


def test_weight_decay_leaves_scale_norm_gains_alone():
    model = kt.build_transformer(tiny_config(normalization="scale"))
    optimizer = make_optimizer(16, kt.TrainingConfig(warmup_steps=4, weight_decay=0.1, clipnorm=None))
    variables = model.trainable_variables
    before = {v.path: to_numpy(v) for v in variables}
    optimizer.build(variables)
    rate = float(to_numpy(optimizer.learning_rate))  # the rate of the step below
    # Zero gradients: Adam's step is zero, so all that moves a weight is its decay.
    optimizer.apply([keras.ops.zeros(v.shape) for v in variables], variables)
    gains = {v.path for v in variables if v.path.endswith("scale_norm_gain")}
    assert len(gains) == 5  # 2 in the encoder layer, 3 in the decoder layer
    for variable in variables:
        expected = before[variable.path]
        if variable.path not in gains:
            expected = expected * (1 - rate * 0.1)
        np.testing.assert_allclose(to_numpy(variable), expected, rtol=1e-6, err_msg=variable.path)


def test_ctranslate2_export_refuses_scale_norm(tmp_path):
    pytest.importorskip("ctranslate2", reason="the export needs the optional ctranslate2 package")
    tokenizer = kt.train_tokenizer(tiny_sentences(), vocab_size=VOCAB_SIZE, model_type="bpe")
    model = kt.Transformer(tiny_config(vocab_size=VOCAB_SIZE, max_length=MAX_LENGTH, normalization="scale"))
    with pytest.raises(ValueError, match=r"does not carry over the model option normalization='scale'"):
        kt.export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    assert not (tmp_path / "ct2").exists()
