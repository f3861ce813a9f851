"""FusedAdam computes Keras' Adam: the same weights after the same steps, on every backend.

On TensorFlow its update is one `ResourceApplyAdam` kernel per weight; elsewhere it is
Keras' generic `Adam.update_step`, compared here with `keras.optimizers.Adam` (on PyTorch,
Keras' own `torch._foreach` Adam), and the TensorFlow-only test (that the fused kernel is
what runs) is skipped.
"""

import keras
import numpy as np
import pytest
from conftest import tiny_config

import keras_transformer as kt
from keras_transformer.train.compile import make_optimizer
from keras_transformer.train.fused_adam import FusedAdam
from keras_transformer.train.schedules import TransformerSchedule

ADAM_ARGS = dict(beta_1=0.9, beta_2=0.98, epsilon=1e-9)


def weights_and_gradients(seed=0, steps=6):
    rng = np.random.default_rng(seed)
    shapes = [(7, 5), (5,), (3, 4, 2)]
    weights = [rng.normal(size=shape).astype("float32") for shape in shapes]
    gradients = [[rng.normal(size=shape).astype("float32") * 3 for shape in shapes] for _ in range(steps)]
    return weights, gradients


def run_steps(optimizer, weights, gradients):
    variables = [keras.Variable(w) for w in weights]
    for step in gradients:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in step], variables)
    return [keras.ops.convert_to_numpy(v) for v in variables]


@pytest.mark.parametrize(
    "options",
    [
        {},
        {"clipnorm": 1.0, "weight_decay": 0.1},  # the Multi30k recipe's
        {"amsgrad": True},  # Keras' update, not the kernel's
    ],
    ids=["plain", "clipnorm_and_weight_decay", "amsgrad"],
)
def test_same_weights_as_keras_adam(options):
    weights, gradients = weights_and_gradients()
    expected = run_steps(keras.optimizers.Adam(TransformerSchedule(16, 3), **ADAM_ARGS, **options), weights, gradients)
    got = run_steps(FusedAdam(TransformerSchedule(16, 3), **ADAM_ARGS, **options), weights, gradients)
    for want, have, start in zip(expected, got, weights):
        assert np.abs(want - start).max() > 1e-2  # the steps moved the weights
        np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-6)  # float32 rounding of 6 steps of ~0.1


def make_keras_adam_method_raise(monkeypatch, name):
    """Keras Adam's `name` raises when called: a test sees whether FusedAdam took Keras' path."""

    def raising(*args, **kwargs):
        raise AssertionError(f"Keras' {name} ran")

    monkeypatch.setattr(keras.optimizers.Adam, name, raising)


def test_the_fused_kernel_is_what_runs_on_tensorflow(monkeypatch):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the fused kernel is TensorFlow's ResourceApplyAdam; other backends run Keras' Adam")
    make_keras_adam_method_raise(monkeypatch, "update_step")
    weights, gradients = weights_and_gradients(steps=2)
    run_steps(FusedAdam(1e-3, **ADAM_ARGS), weights, gradients)
    with pytest.raises(AssertionError, match="Keras' update_step ran"):
        run_steps(FusedAdam(1e-3, amsgrad=True), weights, gradients)


def test_clipnorm_clips_as_keras_does_below_at_and_above_the_norm():
    """Steps whose gradients sit under, over and at zero norm: Adam's moments see the clipped sizes."""
    weights, gradients = weights_and_gradients(seed=2)
    scales = [0.01, 1.0, 0.0, 0.05, 2.0, 0.02]  # norms from ~0.05 to ~20 against clipnorm 0.5
    gradients = [[g * scale for g in step] for step, scale in zip(gradients, scales)]
    for options in ({"clipnorm": 0.5}, {"clipnorm": 0.5, "weight_decay": 0.1}):
        expected = run_steps(keras.optimizers.Adam(1e-2, **ADAM_ARGS, **options), weights, gradients)
        got = run_steps(FusedAdam(1e-2, **ADAM_ARGS, **options), weights, gradients)
        unclipped = run_steps(FusedAdam(1e-2, **ADAM_ARGS), weights, gradients)
        for want, have, loose in zip(expected, got, unclipped):
            np.testing.assert_allclose(have, want, rtol=1e-6, atol=1e-6)
            assert np.abs(loose - want).max() > 1e-3  # clipping changed the steps


def test_clipnorm_is_one_vector_of_norms_on_tensorflow(monkeypatch):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the vectorised clipping is TensorFlow's; other backends clip as Keras does")
    make_keras_adam_method_raise(monkeypatch, "_clip_by_norm")  # Keras' per-gradient clip
    weights, gradients = weights_and_gradients(steps=2)
    run_steps(FusedAdam(1e-3, clipnorm=1.0, **ADAM_ARGS), weights, gradients)
    with pytest.raises(AssertionError, match="Keras' _clip_by_norm ran"):
        run_steps(keras.optimizers.Adam(1e-3, clipnorm=1.0, **ADAM_ARGS), weights, gradients)


def fit_weights(optimizer, weights, inputs, labels):
    model = kt.build_transformer(tiny_config())
    model.set_weights(weights)
    model.compile(optimizer=optimizer, loss=kt.LabelSmoothedCrossEntropy(0.1), jit_compile=False)
    model.fit(inputs, labels, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return {weight.path: keras.ops.convert_to_numpy(weight) for weight in model.weights}


def test_fit_gives_the_weights_of_keras_adam():
    """A Transformer's `fit` (compiled step, tied embedding gradients, clipping, weight decay)."""
    rng = np.random.default_rng(1)
    ids = rng.integers(4, 32, size=(16, 6)).astype("int32")
    inputs, labels = {"encoder_inputs": ids, "decoder_inputs": ids}, ids[:, ::-1].copy()
    start = kt.build_transformer(tiny_config())
    weights = start.get_weights()
    options = dict(clipnorm=1.0, weight_decay=0.1, **ADAM_ARGS)
    expected = fit_weights(keras.optimizers.Adam(TransformerSchedule(16, 2), **options), weights, inputs, labels)
    got = fit_weights(FusedAdam(TransformerSchedule(16, 2), **options), weights, inputs, labels)
    compared = 0
    for weight, initial in zip(start.weights, weights):
        # Softmax ignores a bias added to every key, so its exact gradient is 0 and what
        # backprop gives is float32 rounding, which Adam scales up to steps of ~lr in any
        # direction: two correct implementations disagree there, so it is not compared.
        if weight.path.endswith("key/bias"):
            continue
        assert np.abs(expected[weight.path] - initial).max() > 1e-3, weight.path  # the steps moved it
        np.testing.assert_allclose(got[weight.path], expected[weight.path], rtol=1e-5, atol=1e-5, err_msg=weight.path)
        compared += 1
    assert compared == len(weights) - 3  # the key biases of encoder self, decoder self and cross attention


def test_make_optimizer_gives_fused_adam_on_tensorflow():
    optimizer = make_optimizer(16, kt.TrainingConfig(warmup_steps=4, clipnorm=1.0, weight_decay=0.1))
    assert isinstance(optimizer, keras.optimizers.Adam)
    # Elsewhere Keras' own Adam: PyTorch's batches every weight's update in torch._foreach ops.
    assert isinstance(optimizer, FusedAdam) == (keras.backend.backend() == "tensorflow")
    assert (optimizer.beta_2, optimizer.epsilon, optimizer.clipnorm, optimizer.weight_decay) == (0.98, 1e-9, 1.0, 0.1)


def test_fused_adam_round_trips_through_keras_serialization():
    optimizer = FusedAdam(TransformerSchedule(16, 4), clipnorm=1.0, weight_decay=0.1, **ADAM_ARGS)
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(restored) is FusedAdam
    assert restored.get_config() == optimizer.get_config()
