"""Attention maps: what the model attends to, as numbers and as a PNG with tokens on its axes."""

import os

import numpy as np
import pytest
from matplotlib import image as mpimg
from tiny_translation import model_dir, sentences, translator  # noqa: F401

from keras_transformer.inference.attention_maps import AttentionMaps, attention_maps
from keras_transformer.inference.attention_maps import plot_attention_maps
from training import visualize

SOURCE = "cats see trees"
TARGET = "dogs find bread"


@pytest.fixture(scope="module")
def maps(translator):
    return attention_maps(translator.model, translator.tokenizer, SOURCE, TARGET)


def test_maps_have_one_matrix_per_layer_and_head_on_the_tokens(maps, translator):
    tokenizer = translator.tokenizer
    source = [tokenizer.id_to_piece(i) for i in tokenizer.encode([SOURCE])[0]] + ["</s>"]
    target = ["<s>"] + [tokenizer.id_to_piece(i) for i in tokenizer.encode([TARGET])[0]]
    assert maps.source_tokens == source and maps.target_tokens == target
    s, t = len(source), len(target)
    assert [m.shape for m in maps.encoder_self_attention] == [(2, s, s)]  # 1 layer, 2 heads
    assert [m.shape for m in maps.decoder_self_attention] == [(2, t, t)]
    assert [m.shape for m in maps.cross_attention] == [(2, t, s)]


def test_maps_are_probabilities_and_the_decoder_cannot_look_ahead(maps):
    for matrices in (maps.encoder_self_attention, maps.decoder_self_attention, maps.cross_attention):
        np.testing.assert_allclose(matrices[0].sum(axis=-1), 1.0, atol=1e-5)
    decoder = maps.decoder_self_attention[0]
    future = np.triu(np.ones(decoder.shape[1:], bool), k=1)
    assert np.all(decoder[:, future] == 0.0)
    np.testing.assert_allclose(decoder[:, 0, 0], [1.0, 1.0], atol=1e-6)  # BOS sees only itself


def test_without_a_target_the_models_own_translation_is_used(translator):
    maps = attention_maps(translator.model, translator.tokenizer, SOURCE)
    assert maps.target_tokens[0] == "<s>" and len(maps.target_tokens) >= 2


def test_bad_inputs_are_refused(translator, tmp_path):
    with pytest.raises(TypeError, match="`source` must be a str. Received: bytes"):
        attention_maps(translator.model, translator.tokenizer, b"cats")
    with pytest.raises(ValueError, match="`source` is empty"):
        attention_maps(translator.model, translator.tokenizer, "  ")
    wrong = AttentionMaps(["a", "</s>"], ["<s>"], [np.ones((2, 3, 3))], [], [])
    message = r"encoder_self_attention\[0\] must have shape \[heads, 2, 2\].*Received: shape=\(2, 3, 3\)"
    with pytest.raises(ValueError, match=message):
        plot_attention_maps(wrong, tmp_path / "x.png")


def test_visualize_command_writes_a_real_picture(model_dir, tmp_path, capsys):
    output = tmp_path / "plots" / "attention.png"
    status = visualize.main(
        ["--model-dir", str(model_dir), "--source", SOURCE, "--target", TARGET, "--output", str(output)]
    )
    assert status == 0
    assert "written to" in capsys.readouterr().out
    assert os.path.getsize(output) > 20_000
    height, width, channels = mpimg.imread(output).shape
    # 3 rows (encoder, decoder, cross-attention) of 2 heads, each at least 2.4 in at 100 dpi.
    assert height >= 3 * 240 and width >= 2 * 240 and channels in (3, 4)
