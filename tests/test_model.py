"""The functional Transformer: causality, padding, cache, serialization, precision."""

import json
import os
import pathlib
import subprocess
import sys

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy

import keras_transformer as kt

FIXTURES = pathlib.Path(__file__).resolve().parent / "fixtures"
ENCODER = np.array([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]], "int32")
DECODER = np.array([[2, 15, 16, 17, 0], [2, 18, 19, 20, 21]], "int32")


def logits_of(model, encoder=ENCODER, decoder=DECODER, training=False):
    return to_numpy(model({"encoder_inputs": encoder, "decoder_inputs": decoder}, training=training))


def test_inputs_outputs_and_layer_names():
    model = kt.build_transformer(tiny_config(num_encoder_layers=2, num_decoder_layers=2))
    assert isinstance(model, keras.Model)
    assert sorted(model.input.keys()) == ["decoder_inputs", "encoder_inputs"]
    logits = model({"encoder_inputs": ENCODER, "decoder_inputs": DECODER})
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert tuple(logits.shape) == (2, 5, 32)
    assert model.get_layer("encoder_layer_1") is model.encoder_layers[1]
    assert model.get_layer("decoder_layer_0") is model.decoder_layers[0]


def test_stacks_are_plain_objects_over_the_named_layers():
    model = kt.build_transformer(
        tiny_config(num_decoder_layers=2, share_embeddings=False, norm_first=True)
    )
    encoder, decoder = model.encoder_stack, model.decoder_stack
    assert not isinstance(encoder, keras.layers.Layer)
    assert not isinstance(decoder, keras.layers.Layer)
    assert encoder.token_embedding is model.get_layer("encoder_token_embedding")
    assert decoder.position_encoding is model.get_layer("decoder_position_encoding")
    assert decoder.output_projection is model.get_layer("output_projection")
    assert encoder.final_norm is model.get_layer("encoder_final_norm")
    blocks = [model.get_layer("decoder_layer_0"), model.get_layer("decoder_layer_1")]
    assert decoder.blocks == model.decoder_layers == blocks
    # Weights files are keyed by these names: the same since 0.1.
    assert sorted(layer.name for layer in model.layers) == [
        "decoder_embedding_dropout",
        "decoder_final_norm",
        "decoder_inputs",
        "decoder_layer_0",
        "decoder_layer_1",
        "decoder_position_encoding",
        "decoder_token_embedding",
        "encoder_embedding_dropout",
        "encoder_final_norm",
        "encoder_inputs",
        "encoder_layer_0",
        "encoder_position_encoding",
        "encoder_token_embedding",
        "output_projection",
    ]


def test_shared_embedding_is_one_matrix():
    model = kt.build_transformer(tiny_config())
    embeddings = [w for w in model.weights if "embeddings" in w.path]
    assert len(embeddings) == 1 and tuple(embeddings[0].shape) == (32, 16)
    untied = kt.build_transformer(tiny_config(share_embeddings=False))
    assert len([w for w in untied.weights if w.path.endswith("embeddings")]) == 2
    assert untied.get_layer("output_projection") is not None


def expected_parameter_count(c):
    """Hand count: embeddings, 4 attention projections, FFN and LayerNorms per block."""
    d, f, v = c.d_model, c.d_ff, c.vocab_size
    attention = 4 * (d * d + d)
    ffn = d * f + f + f * d + d
    norm = 2 * d
    encoder = c.num_encoder_layers * (attention + ffn + 2 * norm)
    decoder = c.num_decoder_layers * (2 * attention + ffn + 3 * norm)
    embeddings = v * d if c.share_embeddings else 2 * v * d + d * v + v
    return embeddings + encoder + decoder


@pytest.mark.parametrize("share", [True, False])
def test_parameter_count_matches_hand_count(share):
    config = tiny_config(num_encoder_layers=2, num_decoder_layers=3, share_embeddings=share)
    assert kt.build_transformer(config).count_params() == expected_parameter_count(config)


def test_base_preset_parameter_count_by_formula():
    # The README's table: base at a 37k shared vocabulary is 63,082,496 (paper: ~65M).
    base = kt.TransformerConfig.from_preset("base")
    assert expected_parameter_count(base) == 63_082_496
    big = kt.TransformerConfig.from_preset("big")
    assert expected_parameter_count(big) == 214_245_376


def test_causality(rng):
    model = kt.build_transformer(tiny_config(num_decoder_layers=2))
    before = logits_of(model)
    for i in range(DECODER.shape[1] - 1):
        changed = DECODER.copy()
        changed[:, i + 1 :] = rng.integers(4, 32, size=changed[:, i + 1 :].shape)
        after = logits_of(model, decoder=changed)
        np.testing.assert_allclose(after[:, : i + 1], before[:, : i + 1], atol=1e-5)
        assert not np.allclose(after[1, i + 1 :], before[1, i + 1 :], atol=1e-5)


def test_padding_length_does_not_change_logits():
    model = kt.build_transformer(tiny_config())
    short = logits_of(model)
    encoder = np.pad(ENCODER, [(0, 0), (0, 7)])
    decoder = np.pad(DECODER, [(0, 0), (0, 4)])
    long = logits_of(model, encoder=encoder, decoder=decoder)
    np.testing.assert_allclose(long[0, :4], short[0, :4], atol=1e-5)
    np.testing.assert_allclose(long[1, :5], short[1, :5], atol=1e-5)


def test_sentence_alone_equals_sentence_in_batch_with_longer_one(rng):
    model = kt.build_transformer(tiny_config(max_length=64))
    alone = logits_of(model, ENCODER[:1, :4], DECODER[:1, :4])
    longer_source = rng.integers(4, 32, size=(1, 40)).astype("int32")
    longer_target = rng.integers(4, 32, size=(1, 30)).astype("int32")
    encoder = np.concatenate([np.pad(ENCODER[:1, :4], [(0, 0), (0, 36)]), longer_source])
    decoder = np.concatenate([np.pad(DECODER[:1, :4], [(0, 0), (0, 26)]), longer_target])
    batched = logits_of(model, encoder, decoder)
    np.testing.assert_allclose(batched[0, :4], alone[0], atol=1e-5)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_cached_decoding_equals_teacher_forced_pass(norm_first, positions):
    model = kt.build_transformer(
        tiny_config(num_decoder_layers=2, norm_first=norm_first, position_encoding=positions)
    )
    full = logits_of(model)
    encoder_outputs, encoder_mask = model.encode(ENCODER)
    self_caches, cross_caches = model.initial_cache(encoder_outputs, DECODER.shape[1])
    for i in range(DECODER.shape[1]):
        step, self_caches = model.decode_step(
            DECODER[:, i : i + 1], i, self_caches, cross_caches, encoder_mask
        )
        # Row 0 ends in padding at position 4; its logits there are never used.
        rows = [0, 1] if i < 4 else [1]
        np.testing.assert_allclose(to_numpy(step)[rows], full[rows, i], atol=1e-5)


def test_dropout_only_in_training():
    model = kt.build_transformer(tiny_config(dropout=0.5))
    np.testing.assert_array_equal(logits_of(model), logits_of(model))
    assert not np.allclose(logits_of(model, training=True), logits_of(model), atol=1e-4)


def test_keras_file_round_trip_gives_identical_outputs(tmp_path):
    model = kt.build_transformer(tiny_config(share_embeddings=False, norm_first=True))
    path = tmp_path / "model.keras"
    model.save(path)
    restored = keras.models.load_model(path, safe_mode=True)
    assert isinstance(restored, kt.Transformer)
    assert restored.config == model.config
    np.testing.assert_array_equal(logits_of(restored), logits_of(model))


def test_keras_file_written_by_version_0_1_loads_with_the_same_logits():
    """A `model.keras` of the 0.1 code: its config still carries training and decoding fields."""
    model = keras.saving.load_model(str(FIXTURES / "model_v0_1.keras"), compile=False)
    assert isinstance(model, kt.Transformer)
    io = np.load(FIXTURES / "model_v0_1_io.npz")
    logits = logits_of(model, io["encoder_inputs"], io["decoder_inputs"])
    np.testing.assert_allclose(logits, io["logits"], atol=1e-5)


# Written by a subprocess on another backend; read here.
_WRITER = """
import json, sys
import numpy as np, keras
import keras_transformer as kt
config = kt.TransformerConfig.from_dict(json.loads(sys.argv[1]))
keras.utils.set_random_seed(7)
model = kt.build_transformer(config)
model.save_weights(sys.argv[2])
enc = np.array(json.loads(sys.argv[3]), "int32"); dec = np.array(json.loads(sys.argv[4]), "int32")
np.save(sys.argv[5], keras.ops.convert_to_numpy(model({"encoder_inputs": enc, "decoder_inputs": dec})))
"""


def test_weights_saved_under_another_backend_load_here(tmp_path):
    backends = ["tensorflow", "jax", "torch"]
    here = keras.backend.backend()
    other = backends[(backends.index(here) + 1) % 3]
    config = tiny_config(num_decoder_layers=2)
    weights, logits = tmp_path / "w.weights.h5", tmp_path / "logits.npy"
    env = dict(os.environ, KERAS_BACKEND=other, TF_CPP_MIN_LOG_LEVEL="3")
    args = [json.dumps(config.to_dict()), str(weights), json.dumps(ENCODER.tolist()), json.dumps(DECODER.tolist()), str(logits)]
    subprocess.run([sys.executable, "-c", _WRITER, *args], check=True, env=env, timeout=300)
    model = kt.build_transformer(config)
    model.load_weights(weights)
    np.testing.assert_allclose(logits_of(model), np.load(logits), atol=1e-5)


def _fit_step_is_finite(policy):
    keras.config.set_dtype_policy(policy)
    model = kt.build_transformer(tiny_config())
    logits = model({"encoder_inputs": ENCODER, "decoder_inputs": DECODER})
    assert keras.backend.standardize_dtype(logits.dtype) == "float32"
    assert np.all(np.isfinite(to_numpy(logits)))
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    labels = np.concatenate([DECODER[:, 1:], np.zeros((2, 1), "int32")], axis=1)
    inputs = {"encoder_inputs": ENCODER, "decoder_inputs": DECODER}
    losses = [float(model.train_on_batch(inputs, labels)) for _ in range(3)]
    assert all(np.isfinite(losses)), losses
    assert all(np.all(np.isfinite(to_numpy(w))) for w in model.weights)


def test_mixed_bfloat16_forward_and_fit_step_are_finite():
    _fit_step_is_finite("mixed_bfloat16")


def test_mixed_float16_forward_and_fit_step_are_finite():
    if keras.backend.backend() == "jax":
        pytest.skip("XLA:CPU has no float16 x float16 -> float32 dot_general (F16_F16_F32 precision)")
    _fit_step_is_finite("mixed_float16")


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(d_model=30, num_heads=8), "`d_model` must be divisible by `num_heads`. Received: d_model=30, num_heads=8"),
        (dict(num_heads=0), "`num_heads` must be a positive integer. Received: num_heads=0"),
        (dict(vocab_size=-5), "`vocab_size` must be a positive integer. Received: vocab_size=-5"),
        (dict(dropout=1.0), r"`dropout` must be a number in \[0, 1\). Received: dropout=1.0"),
        (dict(num_encoder_layers=0), "`num_encoder_layers` must be a positive integer. Received: num_encoder_layers=0"),
        (dict(d_model="512"), "`d_model` must be of type int. Received: d_model='512'"),
        (dict(share_embeddings=1), "`share_embeddings` must be of type bool. Received: share_embeddings=1"),
        (dict(position_encoding="rotary"), "`position_encoding` must be one of"),
        (dict(d_modle=512), r"Unknown TransformerConfig field\(s\): \['d_modle'\]"),
        (dict(activation="tanh"), r"`activation` must be one of \('relu', 'gelu', 'swish'\). Received: activation='tanh'"),
        (dict(scale_embeddings="yes"), "`scale_embeddings` must be of type bool"),
        (dict(gated_ffn="yes"), "`gated_ffn` must be of type bool. Received: gated_ffn='yes'"),
        (dict(output_bias=True, share_embeddings=False), "untied `output_projection` has its own bias"),
    ],
)
def test_invalid_config_raises_before_any_model_is_built(overrides, message):
    with pytest.raises(ValueError, match=message):
        kt.TransformerConfig.from_preset("base", **overrides)


def test_presets_and_replace():
    base = kt.TransformerConfig.from_preset("base")
    assert base == kt.TransformerConfig()
    assert (base.d_model, base.d_ff, base.num_heads, base.head_dim) == (512, 2048, 8, 64)
    big = kt.TransformerConfig.from_preset("big")
    assert (big.d_model, big.d_ff, big.num_heads, big.dropout) == (1024, 4096, 16, 0.3)
    assert base.replace(dropout=0.2).dropout == 0.2
    with pytest.raises(ValueError, match="Unknown preset 'huge'"):
        kt.TransformerConfig.from_preset("huge")
    with pytest.raises(ValueError, match="Received: d_model=512, num_heads=3"):
        base.replace(num_heads=3)


# --------------------------------------------------- options for pretrained models
def test_new_options_default_to_the_paper():
    config = kt.TransformerConfig()
    assert (config.activation, config.scale_embeddings, config.output_bias) == ("relu", True, False)
    model = kt.build_transformer(tiny_config())
    assert not [w.path for w in model.weights if "output_bias" in w.path]


@pytest.mark.parametrize("activation", ["gelu", "swish"])
def test_activation_option_reaches_every_feed_forward(activation):
    model = kt.build_transformer(tiny_config(activation=activation))
    block = model.get_layer("decoder_layer_0")
    ffn = block.feed_forward
    x = np.random.default_rng(0).normal(size=(1, 3, 16)).astype("float32")
    hidden = x @ to_numpy(ffn.intermediate_dense.kernel) + to_numpy(ffn.intermediate_dense.bias)
    if activation == "swish":
        hidden = hidden / (1.0 + np.exp(-hidden))  # x * sigmoid(x)
    else:  # exact GELU: x * Phi(x)
        from math import erf

        hidden = hidden * 0.5 * (1.0 + np.vectorize(erf)(hidden / np.sqrt(2.0)))
    expected = hidden @ to_numpy(ffn.output_dense.kernel) + to_numpy(ffn.output_dense.bias)
    np.testing.assert_allclose(to_numpy(ffn(x)), expected, atol=1e-5)


def test_gated_ffn_option_gates_every_feed_forward_and_only_when_asked():
    plain = kt.build_transformer(tiny_config())
    gated = kt.build_transformer(tiny_config(gated_ffn=True, activation="swish"))
    assert not [w.path for w in plain.weights if "gate_dense" in w.path]
    gate_paths = sorted(w.path for w in gated.weights if "gate_dense/kernel" in w.path)
    assert gate_paths == [f"{side}_layer_0/feed_forward/gate_dense/kernel" for side in ("decoder", "encoder")]
    # d_model x d_ff more weights and d_ff more biases per block.
    assert gated.count_params() - plain.count_params() == 2 * (16 * 32 + 32)


def test_output_bias_is_added_to_the_tied_logits():
    keras.utils.set_random_seed(3)
    plain = kt.build_transformer(tiny_config())
    keras.utils.set_random_seed(3)
    biased = kt.build_transformer(tiny_config(output_bias=True))
    bias = np.arange(32, dtype="float32") / 10.0
    biased.get_layer("token_embedding").logits_bias.assign(bias)
    np.testing.assert_allclose(logits_of(biased), logits_of(plain) + bias, atol=1e-5)


def test_unscaled_embeddings_are_the_rows_themselves():
    model = kt.build_transformer(tiny_config(scale_embeddings=False))
    embedding = model.get_layer("token_embedding")
    np.testing.assert_array_equal(
        to_numpy(embedding(np.array([[5, 6]], "int32")))[0], to_numpy(embedding.embeddings)[[5, 6]]
    )


def test_fixed_position_table_starts_as_the_sinusoids_and_is_never_trained(tmp_path):
    keras.utils.set_random_seed(4)
    sinusoidal = kt.build_transformer(tiny_config())
    keras.utils.set_random_seed(4)
    fixed = kt.build_transformer(tiny_config(position_encoding="fixed"))
    np.testing.assert_allclose(logits_of(fixed), logits_of(sinusoidal), atol=1e-5)
    table = fixed.get_layer("encoder_position_encoding").position_embeddings
    assert not table.trainable
    fixed.trainable = True  # what a user does to unfreeze a model: the table stays fixed
    assert all(weight is not table for weight in fixed.trainable_weights)
    # A loaded table is what it computes with, and saving keeps it.
    loaded = np.random.default_rng(0).normal(size=tuple(table.shape)).astype("float32")
    table.assign(loaded)
    before = logits_of(fixed)
    path = tmp_path / "model.keras"
    fixed.save(path)
    restored = keras.models.load_model(path)
    np.testing.assert_array_equal(to_numpy(restored.get_layer("encoder_position_encoding").position_embeddings), loaded)
    np.testing.assert_allclose(logits_of(restored), before, atol=1e-6)


@pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="only TensorFlow's trainer builds the optimizer inside the traced step (JAX and PyTorch build it before)",
)
@pytest.mark.parametrize("entry", ["fit", "train_on_batch"])
def test_the_first_training_step_is_traced_once_on_tensorflow(entry):
    # An optimizer built inside tf.function makes TensorFlow trace the step twice.
    model = kt.compile_transformer(kt.build_transformer(tiny_config()), kt.TrainingConfig(warmup_steps=4))
    ids = np.random.default_rng(0).integers(4, 32, size=(4, 8)).astype("int32")
    calls = []
    traced = model.call
    model.call = lambda *args, **kwargs: calls.append(1) or traced(*args, **kwargs)
    inputs = {"encoder_inputs": ids, "decoder_inputs": ids}
    if entry == "fit":
        model.fit(inputs, ids, batch_size=4, epochs=1, verbose=0)
    else:
        model.train_on_batch(inputs, ids)
    assert len(calls) == 1
    assert model.optimizer.built and int(to_numpy(model.optimizer.iterations)) == 1
