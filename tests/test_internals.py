"""Every accessor of `keras_transformer.internals` works on the installed Keras, PyTorch, tf-text.

The adapter is the one place that reads other libraries' private attributes; a version
that moves one must fail here, loudly, not in a user's run (or, worse, not at all). Each
accessor is called on the real object it serves; PyTorch's run where it is installed,
tf-text's where TensorFlow is (every backend's test environment has both).
"""

import importlib.util

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer import internals
from keras_transformer.train.compile import compile_transformer

VOCAB = 32


def tiny_model():
    from conftest import tiny_config

    keras.utils.set_random_seed(0)
    return kt.Transformer(tiny_config(vocab_size=VOCAB))


def test_every_accessor_is_tested_here():
    tested = {name.removeprefix("test_") for name in globals() if name.startswith("test_")}
    assert set(internals.__all__) - {"InternalsError"} <= tested


def test_variable_tensors():
    variables = tiny_model().trainable_variables
    tensors = internals.variable_tensors(variables)
    assert len(tensors) == len(variables)
    for tensor, variable in zip(tensors, variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(tensor), keras.ops.convert_to_numpy(variable))


def test_loss_tracker():
    model = compile_transformer(tiny_model(), jit_compile=False)
    tracker = internals.loss_tracker(model)
    assert isinstance(tracker, keras.metrics.Mean) and tracker in model.metrics


def test_initial_epoch():
    model = tiny_model()
    assert internals.initial_epoch(model) == 0


def test_set_initial_epoch():
    model = compile_transformer(tiny_model(), jit_compile=False)
    internals.set_initial_epoch(model, 2)
    assert internals.initial_epoch(model) == 2
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, (2, 4)).astype("int32")
    history = model.fit({"encoder_inputs": ids, "decoder_inputs": ids}, ids, epochs=3, verbose=0)
    assert history.epoch == [2]  # fit started at the epoch set
    internals.set_initial_epoch(model, 0)
    assert internals.initial_epoch(model) == 0


def test_learning_rate_object():
    from keras_transformer.train.schedules import TransformerSchedule

    model = compile_transformer(tiny_model(), kt.TrainingConfig(warmup_steps=7), jit_compile=False)
    schedule = internals.learning_rate_object(model.optimizer)
    assert isinstance(schedule, TransformerSchedule) and schedule.warmup_steps == 7


def test_construction_strategy():
    if keras.backend.backend() != "tensorflow":
        pytest.skip("only Keras' TensorFlow trainer records the strategy a model was made under")
    assert internals.construction_strategy(tiny_model()) is None


def test_all_layers():
    names = {layer.name for layer in internals.all_layers(tiny_model())}
    assert {"encoder_layer_0", "decoder_layer_0"} <= names  # nested inside the stacks


def test_replace_dtype_policy():
    layer = keras.layers.Dense(2, dtype=keras.dtype_policies.DTypePolicyMap(default_policy="float32"))
    internals.replace_dtype_policy(layer, keras.dtype_policies.get("mixed_bfloat16"))
    assert layer.dtype_policy.name == "mixed_bfloat16"


def test_stored_kernel():
    layer = keras.layers.Dense(3)
    layer.build((None, 4))
    layer.quantize("int8")
    layer.enable_lora(2)
    stored = keras.ops.convert_to_numpy(internals.stored_kernel(layer))
    assert stored.dtype == np.int8 and stored.shape == (4, 3)


torch_only = pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="PyTorch is not installed")


@torch_only
def test_assert_tensor_metadata_op():
    import torch

    assert isinstance(internals.assert_tensor_metadata_op(), torch._ops.OpOverload)


@torch_only
def test_foreach_copy():
    import torch

    destinations, sources = [torch.zeros(2), torch.zeros(3)], [torch.ones(2), torch.arange(3.0)]
    internals.foreach_copy(destinations, sources)
    assert [d.tolist() for d in destinations] == [[1.0, 1.0], [0.0, 1.0, 2.0]]


def test_jax_distributed_client():
    pytest.importorskip("jax", reason="JAX is not installed")  # the jax extra
    # One process that never called jax.distributed.initialize: the state is there, its client not yet.
    assert internals.jax_distributed_client() is None


def test_replace_sentencepiece_resource():
    from tiny_translation import tiny_sentences

    tokenizer = kt.train_tokenizer(tiny_sentences(), vocab_size=32, model_type="bpe")  # made on the replaced resource
    keras.utils.set_random_seed(2)  # clears TensorFlow's eager kernels: tf-text's own resource would go
    ids = tokenizer.tokenize(["cats like bread"])
    assert tokenizer.detokenize(ids).numpy().tolist() == [b"cats like bread"]
    assert tokenizer.tokenize_sampled(["cats like bread"], alpha=0.1).shape[0] == 1  # keyed by the resource's name


def test_a_moved_attribute_raises_naming_the_library_and_its_version():
    class Renamed:
        pass

    with pytest.raises(internals.InternalsError, match=rf"Renamed\._learning_rate of keras, which keras {keras.__version__} does not have"):
        internals.learning_rate_object(Renamed())
    with pytest.raises(internals.InternalsError, match=r"Renamed\._model_resource of tensorflow_text"):
        internals.replace_sentencepiece_resource(Renamed(), object())
    assert not isinstance(internals.InternalsError("x"), AttributeError)  # no getattr default swallows it
