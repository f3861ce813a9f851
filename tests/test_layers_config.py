"""Every public layer: get_config round trip and argument validation."""

import keras
import numpy as np
import pytest
from conftest import to_numpy

from keras_transformer import layers

LAYERS = [
    (layers.MultiHeadAttention, dict(num_heads=2, key_dim=4, value_dim=4, dropout=0.1, use_bias=False, output_dim=8)),
    (layers.PositionwiseFeedForward, dict(hidden_dim=8, intermediate_dim=16, dropout=0.1, activation="gelu")),
    (layers.TokenEmbedding, dict(vocab_size=32, d_model=8, scale=False)),
    pytest.param(layers.TokenEmbedding, dict(vocab_size=32, d_model=8, output_bias=True), id="TokenEmbedding_output_bias"),
    pytest.param(layers.FixedPositionEmbedding, dict(max_length=12), id="FixedPositionEmbedding"),
    (layers.SinusoidalPositionEncoding, dict(max_length=12)),
    (layers.LearnedPositionEmbedding, dict(max_length=12)),
    (
        layers.EncoderBlock,
        dict(num_heads=2, intermediate_dim=16, dropout=0.2, attention_dropout=0.1, norm_first=True, layer_norm_epsilon=1e-5),
    ),
    (layers.DecoderBlock, dict(num_heads=2, intermediate_dim=16, activation_dropout=0.1, activation="gelu")),
    pytest.param(layers.EncoderBlock, dict(num_heads=2, intermediate_dim=16, activation="silu"), id="EncoderBlock_silu"),
    pytest.param(
        layers.PositionwiseFeedForward, dict(hidden_dim=8, intermediate_dim=16, activation="silu", gated=True), id="FFN_gated"
    ),
    pytest.param(layers.DecoderBlock, dict(num_heads=2, intermediate_dim=16, gated_ffn=True), id="DecoderBlock_gated"),
    pytest.param(layers.ScaleNorm, dict(epsilon=1e-4), id="ScaleNorm"),
    pytest.param(layers.TokenEmbedding, dict(vocab_size=32, d_model=8, fix_norm=True), id="TokenEmbedding_fix_norm"),
    pytest.param(
        layers.DecoderBlock, dict(num_heads=2, intermediate_dim=16, normalization="scale"), id="DecoderBlock_scale_norm"
    ),
]


@pytest.mark.parametrize("cls, kwargs", LAYERS, ids=[entry[0].__name__ if type(entry) is tuple else None for entry in LAYERS])
def test_get_config_round_trip(cls, kwargs):
    layer = cls(**kwargs, name="probe")
    config = layer.get_config()
    for key, value in kwargs.items():
        stored = config[key]
        if key == "activation":
            assert keras.activations.get(stored).__name__ == value
        else:
            assert stored == value, key
    clone = cls.from_config(config)
    assert clone.get_config() == config
    # Registered for serialization: the generic deserializer finds the class by name.
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(restored) is cls and restored.get_config() == config


def test_blocks_build_sublayers_in_build_with_stable_names():
    block = layers.DecoderBlock(num_heads=2, intermediate_dim=16)
    assert not hasattr(block, "self_attention")
    block(np.zeros((1, 3, 8), "float32"), np.zeros((1, 4, 8), "float32"))
    names = sorted(w.path for w in block.weights)
    assert "probe" not in names[0]
    assert any("cross_attention/query/kernel" in n for n in names)
    assert any("feed_forward/intermediate_dense/kernel" in n for n in names)


@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_block_equals_hand_wired_sublayers(norm_first):
    """Post-norm LayerNorm(x + Sublayer(x)) as in the paper; pre-norm x + Sublayer(LayerNorm(x))."""
    block = layers.EncoderBlock(num_heads=2, intermediate_dim=16, dropout=0.0, norm_first=norm_first)
    x = keras.ops.convert_to_tensor(np.random.default_rng(0).normal(size=(2, 4, 8)).astype("float32"))
    out = to_numpy(block(x))
    attn, ffn = block.self_attention, block.feed_forward
    norm1, norm2 = block.self_attention_norm, block.feed_forward_norm
    if norm_first:
        h = x + attn(norm1(x), norm1(x))
        expected = h + ffn(norm2(h))
    else:
        h = norm1(x + attn(x, x))
        expected = norm2(h + ffn(h))
    np.testing.assert_allclose(out, to_numpy(expected), atol=1e-5)


def test_feed_forward_is_relu_two_layer_network():
    ffn = layers.PositionwiseFeedForward(hidden_dim=8, intermediate_dim=16)
    x = np.random.default_rng(1).normal(size=(2, 3, 8)).astype("float32")
    out = to_numpy(ffn(x))
    w1, b1 = to_numpy(ffn.intermediate_dense.kernel), to_numpy(ffn.intermediate_dense.bias)
    w2, b2 = to_numpy(ffn.output_dense.kernel), to_numpy(ffn.output_dense.bias)
    np.testing.assert_allclose(out, np.maximum(0, x @ w1 + b1) @ w2 + b2, atol=1e-5)


@pytest.mark.parametrize("activation", ["relu", "swish"])
def test_gated_feed_forward_multiplies_the_activation_by_a_linear_gate(activation):
    """ReGLU / SwiGLU (Shazeer, 2020): (act(x W1 + b1) * (x V + c)) W2 + b2."""
    ffn = layers.PositionwiseFeedForward(hidden_dim=8, intermediate_dim=16, activation=activation, gated=True)
    x = np.random.default_rng(2).normal(size=(2, 3, 8)).astype("float32")
    ffn.build(x.shape)
    # Nonzero biases, so a gate applied before its bias (or to the wrong projection) shows.
    for dense in (ffn.intermediate_dense, ffn.gate_dense, ffn.output_dense):
        dense.bias.assign(np.random.default_rng(3).normal(size=dense.bias.shape).astype("float32"))
    out = to_numpy(ffn(x))
    w1, b1 = to_numpy(ffn.intermediate_dense.kernel), to_numpy(ffn.intermediate_dense.bias)
    v, c = to_numpy(ffn.gate_dense.kernel), to_numpy(ffn.gate_dense.bias)
    w2, b2 = to_numpy(ffn.output_dense.kernel), to_numpy(ffn.output_dense.bias)
    hidden = x @ w1 + b1
    hidden = np.maximum(0, hidden) if activation == "relu" else hidden / (1.0 + np.exp(-hidden))
    np.testing.assert_allclose(out, (hidden * (x @ v + c)) @ w2 + b2, atol=1e-5)
    # Three matrices of 8 x 16: the paper's two plus the gate's.
    assert sorted(w.path.split("/")[-2] for w in ffn.weights if w.path.endswith("kernel")) == [
        "gate_dense",
        "intermediate_dense",
        "output_dense",
    ]


def test_an_ungated_feed_forward_has_the_papers_two_matrices_only():
    ffn = layers.PositionwiseFeedForward(hidden_dim=8, intermediate_dim=16)
    ffn.build((1, 8))
    assert ffn.gate_dense is None and len(ffn.weights) == 4


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda: layers.PositionwiseFeedForward(0, 16), "`hidden_dim` must be a positive integer. Received: hidden_dim=0"),
        (lambda: layers.PositionwiseFeedForward(8, 16, dropout=-0.1), r"`dropout` must be a number in \[0, 1\). Received: dropout=-0.1"),
        (lambda: layers.PositionwiseFeedForward(8, 16, gated="yes"), "`gated` must be True or False. Received: gated='yes'"),
        (lambda: layers.EncoderBlock(num_heads=2, intermediate_dim=16, gated_ffn=1), "`gated_ffn` must be True or False. Received: gated_ffn=1"),
        (lambda: layers.TokenEmbedding(0, 8), "`vocab_size` must be a positive integer. Received: vocab_size=0"),
        (lambda: layers.TokenEmbedding(32, 8.0), "`d_model` must be a positive integer. Received: d_model=8.0"),
        (lambda: layers.SinusoidalPositionEncoding(-3), "`max_length` must be a positive integer. Received: max_length=-3"),
        (lambda: layers.EncoderBlock(num_heads=2, intermediate_dim=16, dropout=1.0), r"`dropout` must be a number in \[0, 1\). Received: dropout=1.0"),
        (lambda: layers.DecoderBlock(num_heads=True, intermediate_dim=16), "`num_heads` must be a positive integer. Received: num_heads=True"),
    ],
)
def test_invalid_layer_arguments(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_block_refuses_width_not_divisible_by_heads():
    with pytest.raises(ValueError, match="Received: hidden size=10, num_heads=4"):
        layers.EncoderBlock(num_heads=4, intermediate_dim=16)(np.zeros((1, 3, 10), "float32"))
