"""PyTorch's captures and compilations never end a run: they fall back, warning once, or say why.

A model whose Python reads a tensor's value (here a `WordDropout` patched to branch on
one, as a user's custom layer might) cannot be captured: with `jit_compile="auto"` it
trains through Keras' eager step after one warning naming the reason and the layer;
with `jit_compile=True` it stops with `CaptureError` saying the same. Decoding falls
back the same way: to the eager `decode_step` when its capture fails, to the captured,
uncompiled graph when its compilation does.
"""

import warnings

import keras
import numpy as np
import pytest
from conftest import tiny_config

import keras_transformer as kt
from keras_transformer.graph_cache import CaptureError, CaptureFallbackWarning
from keras_transformer.layers import WordDropout
from keras_transformer.train.compile import compile_transformer

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="the captured steps are the PyTorch backend's"
)

VOCAB = 32
SOURCES = np.array([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]], "int32")


@pytest.fixture
def untraceable_word_dropout(monkeypatch):
    """WordDropout with Python control flow on a tensor's value, which a graph cannot hold."""
    original = WordDropout.call

    def call(self, inputs, training=False):
        if float(keras.ops.max(inputs)) > 1e9:  # reads the value on the host
            inputs = inputs * 0.5
        return original(self, inputs, training=training)

    monkeypatch.setattr(WordDropout, "call", call)


def batch(rows=2, length=5, seed=0):
    rng = np.random.default_rng(seed)
    x = {
        "encoder_inputs": rng.integers(4, VOCAB, (rows, length)).astype("int32"),
        "decoder_inputs": rng.integers(4, VOCAB, (rows, length + 1)).astype("int32"),
    }
    return x, rng.integers(0, VOCAB, (rows, length + 1)).astype("int32")


def model_with_word_dropout(jit_compile):
    keras.utils.set_random_seed(1)
    model = kt.Transformer(tiny_config(vocab_size=VOCAB, source_word_dropout=0.1))
    model = compile_transformer(model, jit_compile=jit_compile)
    model.captured_train_step.graphs.capture_after = 1
    return model


def fallback_messages(caught):
    return [str(w.message) for w in caught if issubclass(w.category, CaptureFallbackWarning)]


@pytest.mark.usefixtures("untraceable_word_dropout")
def test_auto_warns_once_naming_the_layer_and_trains_eagerly():
    model = model_with_word_dropout("auto")
    step = model.captured_train_step
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureFallbackWarning)
        logs = [model.train_on_batch(*batch(seed=seed), return_dict=True) for seed in range(3)]
        logs.append(model.train_on_batch(*batch(rows=3, seed=3), return_dict=True))  # a new shape: no retry
    assert fallback_messages(caught) == [
        "The PyTorch training step could not be captured as a graph (DataDependentError: the traced "
        "code reads a tensor's value on the host (`.item()`, `float()`, an `if` on a tensor), which a "
        "graph cannot hold, in layer 'encoder_word_dropout' (WordDropout)); it runs eagerly from now on."
    ]
    assert step.captures == 0 and step.graphs.failure.startswith("DataDependentError")
    assert all(np.isfinite(entry["loss"]) for entry in logs)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4  # every batch trained


@pytest.mark.usefixtures("untraceable_word_dropout")
def test_jit_compile_true_raises_naming_the_reason():
    model = model_with_word_dropout(True)
    with pytest.raises(
        CaptureError,
        match=r"^The PyTorch training step could not be captured as a graph \(DataDependentError: .*"
        r"in layer 'encoder_word_dropout' \(WordDropout\)\)\. With jit_compile='auto' it runs eagerly",
    ):
        model.train_on_batch(*batch())
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 0  # nothing half-applied


def decoders(model, **kwargs):
    from keras_transformer.inference.compiled import CompiledDecoder

    eager = CompiledDecoder(model, "greedy", jit_compile=False, max_length=6)
    captured = CompiledDecoder(model, "greedy", max_length=6)
    for name, value in kwargs.items():
        setattr(captured.captured_steps.graphs, name, value)
    return eager, captured


def tokens(decoder):
    return keras.ops.convert_to_numpy(decoder(SOURCES)[0])


def test_decoding_whose_capture_fails_decodes_eagerly_after_one_warning(monkeypatch):
    keras.utils.set_random_seed(0)
    model = kt.Transformer(tiny_config(vocab_size=VOCAB))
    original = kt.Transformer.decode_step

    def decode_step(self, token_ids, *args, **kwargs):
        if int(keras.ops.max(token_ids)) < 0:  # reads the value on the host
            token_ids = token_ids * 0
        return original(self, token_ids, *args, **kwargs)

    monkeypatch.setattr(kt.Transformer, "decode_step", decode_step)
    eager, captured = decoders(model, capture_after=1)
    expected = tokens(eager)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", CaptureFallbackWarning)
        results = [tokens(captured) for _ in range(2)]
    messages = fallback_messages(caught)
    assert len(messages) == 1 and messages[0].startswith(
        "The PyTorch decoding step could not be captured as a graph (DataDependentError: "
    ), messages
    assert captured.captured_steps.captures == 0
    for result in results:
        np.testing.assert_array_equal(result, expected)


def test_decoding_whose_compilation_fails_runs_the_captured_graph_after_one_warning():
    import torch

    from keras_transformer.inference import decoding
    from keras_transformer.inference.torch_decode_step import CapturedDecodeSteps

    def failing_compiler(graph_module, example_inputs):  # a torch.compile backend that cannot build
        raise RuntimeError("no C++ compiler found")

    keras.utils.set_random_seed(0)
    model = kt.Transformer(tiny_config(vocab_size=VOCAB))
    steps = CapturedDecodeSteps(model, model.variables, capture_after=1, compiler=failing_compiler, compile_after=2)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always", CaptureFallbackWarning)
        result = keras.ops.convert_to_numpy(decoding.greedy_decode(steps, SOURCES, max_length=6)[0])
    assert fallback_messages(caught) == [
        "The PyTorch decoding step could not be compiled (BackendCompilerFailed: backend='failing_compiler' "
        "raised: RuntimeError: no C++ compiler found); its captured graphs run uncompiled from now on."
    ]
    assert (steps.captures, steps.compiles) == (1, 0)
    eager, _ = decoders(model)
    np.testing.assert_array_equal(result, tokens(eager))
