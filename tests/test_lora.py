"""`Transformer.enable_lora`: LoRA on every Dense, only LoRA trains, decoders retrace.

Keras' `Dense.enable_lora` freezes a kernel `W` and computes with
`W + (alpha / rank) * A @ B`. The model's attention reads `dense.kernel` for its fused
projections, so the tests check that path against a model holding the merged kernels,
and that a `Translator` made before LoRA was enabled does not keep decoding with the
program it traced before.
"""

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy
from tiny_translation import MAX_EXTRA, MAX_LENGTH, model_dir, pick_sentences  # noqa: F401

import keras_transformer as kt
from keras_transformer.inference.translator import Translator, pad_batch
from keras_transformer.special_tokens import BOS_ID, EOS_ID
from keras_transformer.train.losses import LabelSmoothedCrossEntropy

BACKEND = keras.backend.backend()
RANK = 4
LORA_NAMES = ("lora_kernel_a", "lora_kernel_b")
INPUTS = {
    "encoder_inputs": np.array([[5, 6, 7, 8, 3, 0], [9, 10, 11, 3, 0, 0]], "int32"),
    "decoder_inputs": np.array([[2, 12, 13, 14, 15], [2, 16, 17, 0, 0]], "int32"),
}


def is_lora(weight):
    return weight.path.rsplit("/", 1)[-1] in LORA_NAMES


def merged_reference(model):
    """A new model of the same config whose kernels are `W + A @ B` (alpha = rank), in NumPy."""
    values = {weight.path: to_numpy(weight) for weight in model.weights}
    reference = kt.Transformer(model.config)
    for weight in reference.weights:
        value = values[weight.path]
        layer = weight.path.rsplit("/", 1)[0]
        if weight.path.endswith("/kernel") and f"{layer}/lora_kernel_a" in values:
            value = value + values[f"{layer}/lora_kernel_a"] @ values[f"{layer}/lora_kernel_b"]
        weight.assign(value)
    return reference


def test_enable_lora_leaves_only_the_lora_weights_trainable():
    model = kt.build_transformer(tiny_config(share_embeddings=False))
    logits = to_numpy(model(INPUTS))
    model.enable_lora(RANK)

    trainable = [weight.path for weight in model.trainable_weights]
    # Per Dense: A and B. Encoder 4 attention + 2 feed-forward, decoder 8 + 2, and
    # the untied output projection: 17 Dense layers.
    assert len(trainable) == 2 * 17
    assert all(path.rsplit("/", 1)[-1] in LORA_NAMES for path in trainable)
    assert "decoder_layer_0/cross_attention/value/lora_kernel_a" in trainable
    assert "output_projection/lora_kernel_b" in trainable
    frozen = {weight.path for weight in model.non_trainable_weights}
    for path in ("encoder_layer_0/self_attention/query/kernel", "encoder_layer_0/self_attention/query/bias",
                 "decoder_layer_0/feed_forward_norm/gamma", "decoder_token_embedding/embeddings"):
        assert path in frozen
    # B starts at zero: the model computes what it did.
    np.testing.assert_allclose(to_numpy(model(INPUTS)), logits, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda model: model.enable_lora(0), r"`rank` must be a positive integer. Received: rank=0"),
        (lambda model: model.enable_lora(-2), r"`rank` must be a positive integer. Received: rank=-2"),
        (lambda model: model.enable_lora(2.0), r"`rank` must be a positive integer. Received: rank=2.0"),
        (lambda model: model.enable_lora(2, lora_alpha=0), r"`lora_alpha` must be a finite number > 0"),
    ],
    ids=["zero", "negative", "float", "alpha_zero"],
)
def test_bad_lora_arguments_are_refused_before_anything_changes(call, message):
    model = kt.build_transformer(tiny_config())
    with pytest.raises(ValueError, match=message):
        call(model)
    assert not any(is_lora(weight) for weight in model.weights)
    assert len(model.trainable_weights) == len(model.weights)


def test_enabling_lora_twice_is_refused():
    model = kt.build_transformer(tiny_config())
    model.enable_lora(2)
    with pytest.raises(ValueError, match=r"LoRA is already enabled on this model.*Received: rank=3"):
        model.enable_lora(3)


def training_batch(tokenizer, sentences):
    """Every sentence as source, and one fixed target for all: `(inputs, labels)`."""
    sources = pad_batch([ids + [EOS_ID] for ids in tokenizer.encode(sentences)], MAX_LENGTH, len(sentences))
    target = tokenizer.encode(["birds paint gardens"])[0]
    decoder_inputs = np.array([[BOS_ID] + target] * len(sentences), "int32")
    labels = np.array([target + [EOS_ID]] * len(sentences), "int32")
    return {"encoder_inputs": sources, "decoder_inputs": decoder_inputs}, labels


def test_lora_training_changes_only_lora_weights_and_a_translator_made_before_retraces(model_dir, tmp_path):
    # Its own copy of the session's model directory: this test changes the model.
    translator = Translator(model_dir, beam_size=1, max_extra=MAX_EXTRA, batch_size=4, jit_compile=False)
    model, tokenizer = translator.model, translator.tokenizer
    sentences = pick_sentences(tokenizer, count=4)
    before = translator.translate(sentences)
    traces = translator.decoder.trace_count
    inputs, labels = training_batch(tokenizer, sentences)
    logits_before = to_numpy(model(inputs))

    model.enable_lora(RANK)
    frozen = {weight.path: to_numpy(weight) for weight in model.weights if not is_lora(weight)}
    model.compile(optimizer=keras.optimizers.Adam(3e-2), loss=LabelSmoothedCrossEntropy())
    model.fit(inputs, labels, batch_size=len(sentences), epochs=15, shuffle=False, verbose=0)

    for weight in model.weights:
        if is_lora(weight):
            continue
        np.testing.assert_array_equal(to_numpy(weight), frozen[weight.path], err_msg=weight.path)
    lora_b = {weight.path: to_numpy(weight) for weight in model.weights if weight.path.endswith("lora_kernel_b")}
    assert all(np.abs(value).max() > 0 for value in lora_b.values())  # B started at zero
    logits = to_numpy(model(inputs))
    assert np.abs(logits - logits_before).max() > 1e-2

    # The fused attention path reads `Dense.kernel`, which adds the LoRA term: the same
    # logits as a model holding the merged kernels, and as the saved model (merged too).
    np.testing.assert_allclose(to_numpy(merged_reference(model)(inputs)), logits, rtol=1e-5, atol=1e-5)
    model.save(str(tmp_path / "merged.keras"))
    loaded = keras.saving.load_model(str(tmp_path / "merged.keras"), compile=False)
    assert not any(is_lora(weight) for weight in loaded.weights)
    np.testing.assert_allclose(to_numpy(loaded(inputs)), logits, rtol=1e-5, atol=1e-5)

    after = translator.translate(sentences)
    fresh = Translator(model, tokenizer, beam_size=1, max_extra=MAX_EXTRA, batch_size=4, jit_compile=False)
    assert after == fresh.translate(sentences)
    assert after != before
    if BACKEND != "torch":  # PyTorch decodes eagerly: nothing was traced
        assert translator.decoder.trace_count > traces
