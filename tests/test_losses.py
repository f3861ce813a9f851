"""LabelSmoothedCrossEntropy: hand-computed values, padding, dtypes, and use in model.compile."""

import re

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.train.losses import LabelSmoothedCrossEntropy
from keras_transformer.train.losses import smoothed_label_loss, token_cross_entropy
from keras_transformer.train.schedules import TransformerSchedule

# B=2, T=3, V=4. Label 0 is padding: the second sentence has one real token.
LOGITS = np.array(
    [
        [[2.0, 1.0, 0.0, -1.0], [0.5, 0.5, 3.0, 0.0], [1.0, 2.0, 3.0, 4.0]],
        [[0.0, 0.0, 0.0, 0.0], [9.0, -9.0, 4.0, 1.0], [5.0, 5.0, 5.0, 5.0]],
    ],
    dtype="float32",
)
LABELS = np.array([[1, 2, 3], [3, 0, 0]], dtype="int32")
NUM_REAL_TOKENS = 4


def hand_token_losses(logits, labels, eps):
    """-(1 - eps) * log_p[label] - eps * mean(log_p), in float64 numpy."""
    logits = logits.astype("float64")
    log_p = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    label_log_p = np.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]
    return -(1.0 - eps) * label_log_p - eps * log_p.mean(axis=-1)


def to_numpy(x):
    return ops.convert_to_numpy(x)


@pytest.mark.parametrize(
    "eps, expected_tokens",
    [
        # -log_p[label] of the 4 real tokens, e.g. token 1: logsumexp(2,1,0,-1) - 1.
        (0.0, [1.4401897, 0.19388533, 0.4401897, 1.38629436]),
        # + 0.1 * (-mean(log_p) - -log_p[label]); mean(-log_p) of row 1 is 1.9401897.
        (0.1, [1.4901897, 0.39388533, 0.5901897, 1.38629436]),
    ],
)
def test_loss_equals_hand_computed_value_on_a_padded_batch(eps, expected_tokens):
    np.testing.assert_allclose(
        hand_token_losses(LOGITS, LABELS, eps)[LABELS != 0], expected_tokens, rtol=1e-7
    )
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)(LABELS, LOGITS)
    # Token mean: divided by the 4 real tokens, not by B * T = 6.
    expected = sum(expected_tokens) / NUM_REAL_TOKENS
    assert expected == pytest.approx({0.0: 0.86513977, 0.1: 0.96513977}[eps], rel=1e-7)
    assert float(to_numpy(loss)) == pytest.approx(expected, rel=1e-6)


def logits_gradient(loss, labels, logits):
    """d loss(labels, logits) / d logits, through the backend's own autodiff."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        logits = tf.constant(logits)
        with tf.GradientTape() as tape:
            tape.watch(logits)
            value = loss(labels, logits)
        return tape.gradient(value, logits).numpy()
    if backend == "jax":
        import jax

        return np.asarray(jax.grad(lambda x: loss(labels, x))(logits))
    import torch

    logits = torch.tensor(logits, requires_grad=True)
    loss(torch.tensor(labels), logits).backward()
    return logits.grad.numpy()


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_gradient_is_softmax_minus_the_smoothed_target_over_the_real_tokens(eps):
    # The loss reads the label differently per backend (a dense target on TensorFlow, a
    # gather elsewhere); the gradient must be the same closed form on every one.
    loss = LabelSmoothedCrossEntropy(label_smoothing=eps)
    gradient = logits_gradient(loss, LABELS, LOGITS)
    logits = LOGITS.astype("float64")
    softmax = np.exp(logits) / np.exp(logits).sum(axis=-1, keepdims=True)
    target = (1.0 - eps) * np.eye(4)[LABELS] + eps / 4
    expected = (softmax - target) / NUM_REAL_TOKENS * (LABELS != 0)[..., None]
    np.testing.assert_allclose(gradient, expected, atol=1e-6)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_both_label_readings_give_the_hand_values_and_the_same_gradient(eps):
    # The dense target and the gather, each on every backend (the loss picks one per backend).
    labels = np.where(LABELS == 0, 1, LABELS)  # valid labels everywhere: no padding here

    def reading(dense):
        return lambda y, logits: ops.sum(smoothed_label_loss(ops.log_softmax(logits, axis=-1), y, eps, dense=dense))

    for dense in (False, True):
        values = smoothed_label_loss(ops.log_softmax(LOGITS, axis=-1), labels, eps, dense=dense)
        np.testing.assert_allclose(to_numpy(values), hand_token_losses(LOGITS, labels, eps), rtol=1e-6)
    np.testing.assert_allclose(logits_gradient(reading(True), labels, LOGITS),
                               logits_gradient(reading(False), labels, LOGITS), atol=1e-6)


def test_the_per_token_loss_is_the_same_whether_or_not_it_is_differentiated():
    # A metric reads it with differentiated=False (a gather on every backend).
    for eps in (0.0, 0.1):
        loss = token_cross_entropy(LABELS, LOGITS, eps)
        forward = token_cross_entropy(LABELS, LOGITS, eps, differentiated=False)
        np.testing.assert_allclose(to_numpy(loss), to_numpy(forward), rtol=1e-6)
        np.testing.assert_allclose(to_numpy(loss), hand_token_losses(LOGITS, LABELS, eps) * (LABELS != 0),
                                   rtol=1e-6)


def test_call_returns_per_token_losses_with_zeros_at_padding():
    per_token = to_numpy(LabelSmoothedCrossEntropy().call(LABELS, LOGITS))
    expected = np.where(LABELS != 0, hand_token_losses(LOGITS, LABELS, 0.1), 0.0)
    assert per_token.dtype == np.float32
    np.testing.assert_allclose(per_token, expected, rtol=1e-6)


def test_logits_at_padded_positions_do_not_matter():
    loss_fn = LabelSmoothedCrossEntropy()
    changed = LOGITS.copy()
    changed[1, 1] = [-50.0, 80.0, np.inf, np.nan]
    changed[1, 2] = 1000.0
    assert float(to_numpy(loss_fn(LABELS, changed))) == float(
        to_numpy(loss_fn(LABELS, LOGITS))
    )


def test_all_padding_batch_gives_zero():
    loss = LabelSmoothedCrossEntropy()(np.zeros((2, 3), "int32"), LOGITS)
    assert float(to_numpy(loss)) == 0.0


def test_equals_keras_sparse_cross_entropy_without_smoothing_or_padding():
    labels = np.array([[1, 2, 3], [3, 1, 2]], dtype="int32")
    ours = LabelSmoothedCrossEntropy(label_smoothing=0.0)(labels, LOGITS)
    keras_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)(
        labels, LOGITS
    )
    assert float(to_numpy(ours)) == pytest.approx(float(to_numpy(keras_loss)), rel=1e-6)


def test_smoothing_matches_keras_categorical_cross_entropy_convention():
    # Keras spreads eps uniformly over all V classes, as the loss here does; the
    # one-hot labels are built only in the test, for Keras' dense loss.
    labels = np.array([[1, 2, 3], [3, 1, 2]], dtype="int32")
    ours = LabelSmoothedCrossEntropy(label_smoothing=0.1, ignore_id=None)(labels, LOGITS)
    keras_loss = keras.losses.CategoricalCrossentropy(
        from_logits=True, label_smoothing=0.1
    )(np.eye(4, dtype="float32")[labels], LOGITS)
    assert float(to_numpy(ours)) == pytest.approx(float(to_numpy(keras_loss)), rel=1e-6)


def test_label_formats_and_a_custom_ignore_id_give_the_same_loss():
    loss_fn = LabelSmoothedCrossEntropy()
    expected = float(to_numpy(loss_fn(LABELS, LOGITS)))
    as_float_column = LABELS[..., None].astype("float32")
    assert float(to_numpy(loss_fn(as_float_column, LOGITS))) == pytest.approx(expected)
    # PyTorch-style padding label: not a valid class index, still ignored.
    minus_100 = np.where(LABELS == 0, -100, LABELS)
    custom = LabelSmoothedCrossEntropy(ignore_id=-100)(minus_100, LOGITS)
    assert float(to_numpy(custom)) == pytest.approx(expected, rel=1e-6)


def test_sample_weight_scales_tokens_but_the_divisor_stays_the_real_token_count():
    per_token = np.where(LABELS != 0, hand_token_losses(LOGITS, LABELS, 0.1), 0.0)
    weights = np.array([2.0, 0.5], dtype="float32")
    expected = (2.0 * per_token[0].sum() + 0.5 * per_token[1].sum()) / NUM_REAL_TOKENS
    loss = LabelSmoothedCrossEntropy()(LABELS, LOGITS, sample_weight=weights)
    assert float(to_numpy(loss)) == pytest.approx(expected, rel=1e-6)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_logits_give_a_float32_loss(dtype):
    rng = np.random.default_rng(0)
    logits = rng.normal(scale=8.0, size=(2, 5, 32)).astype("float32")
    labels = rng.integers(1, 32, size=(2, 5)).astype("int32")
    labels[1, 3:] = 0
    half_logits = ops.cast(logits, dtype)
    # The reference uses the same rounded logits, in float64.
    rounded = to_numpy(ops.cast(half_logits, "float32"))
    real = labels != 0
    expected = hand_token_losses(rounded, labels, 0.1)[real].sum() / real.sum()
    loss = LabelSmoothedCrossEntropy()(labels, half_logits)
    assert ops.convert_to_numpy(loss).dtype == np.float32
    # Half-precision arithmetic is off by ~6e-5 (float16) or ~1e-3 (bfloat16) here.
    assert float(to_numpy(loss)) == pytest.approx(expected, rel=1e-6)
    assert to_numpy(token_cross_entropy(labels, half_logits)).dtype == np.float32


@pytest.mark.parametrize("eps", [-0.1, 1.0, 1.5, "0.1", True])
def test_label_smoothing_outside_zero_one_raises(eps):
    message = f"`label_smoothing` must be a number in [0, 1). Received: label_smoothing={eps!r}"
    with pytest.raises(ValueError, match=re.escape(message)):
        LabelSmoothedCrossEntropy(label_smoothing=eps)


def test_ignore_id_must_be_an_integer_or_none():
    with pytest.raises(ValueError, match=re.escape("Received: ignore_id='<pad>'")):
        LabelSmoothedCrossEntropy(ignore_id="<pad>")


def test_serialization_round_trip():
    loss_fn = LabelSmoothedCrossEntropy(label_smoothing=0.2, ignore_id=-1, name="ls")
    config = loss_fn.get_config()
    assert config == {"name": "ls", "label_smoothing": 0.2, "ignore_id": -1}
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(loss_fn)
    )
    assert isinstance(restored, LabelSmoothedCrossEntropy)
    assert restored.get_config() == config


def tiny_model():
    ids = keras.Input(shape=(None,), dtype="int32")
    hidden = keras.layers.Embedding(32, 8)(ids)
    logits = keras.layers.Dense(32)(hidden)
    return keras.Model(ids, logits)


def test_train_on_batch_reports_the_token_mean_loss():
    keras.utils.set_random_seed(0)
    model = tiny_model()
    model.compile(
        optimizer=keras.optimizers.SGD(TransformerSchedule(d_model=8, warmup_steps=4)),
        loss=LabelSmoothedCrossEntropy(),
    )
    ids = np.array([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]], dtype="int32")
    labels = np.array([[6, 7, 8, 9, 3], [11, 12, 3, 0, 0]], dtype="int32")
    logits = to_numpy(model(ids))
    real = labels != 0
    expected = hand_token_losses(logits, labels, 0.1)[real].sum() / real.sum()
    # The step's loss comes from the weights before the update.
    logs = model.train_on_batch(ids, labels, return_dict=True)
    assert logs["loss"] == pytest.approx(expected, rel=1e-5)
    assert not np.allclose(to_numpy(model(ids)), logits)  # the weights did move
    # After one update the optimizer is at iteration 1, i.e. the paper's step 2.
    assert float(to_numpy(model.optimizer.learning_rate)) == pytest.approx(
        8**-0.5 * min(2**-0.5, 2 * 4**-1.5), rel=1e-6
    )


def test_an_all_padding_batch_trains_to_a_zero_loss_and_zero_update():
    keras.utils.set_random_seed(0)
    model = tiny_model()
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LabelSmoothedCrossEntropy())
    ids = np.array([[5, 6, 0], [7, 0, 0]], dtype="int32")
    before = [to_numpy(w) for w in model.weights]
    logs = model.train_on_batch(ids, np.zeros((2, 3), "int32"), return_dict=True)
    assert logs["loss"] == 0.0
    for old, new in zip(before, model.weights):
        np.testing.assert_array_equal(old, to_numpy(new))  # finite, zero gradients


_MIRRORED_SCRIPT = """
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras, numpy as np
from keras_transformer.train.losses import LabelSmoothedCrossEntropy
ids = np.array([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]] * 2, dtype="int32")
labels = np.array([[6, 7, 8, 9, 3], [11, 12, 3, 0, 0]] * 2, dtype="int32")
def weights_after_one_step(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(0)
        ids_in = keras.Input((None,), dtype="int32")
        logits = keras.layers.Dense(32)(keras.layers.Embedding(32, 8)(ids_in))
        model = keras.Model(ids_in, logits)
        model.compile(optimizer=keras.optimizers.SGD(1.0), loss=LabelSmoothedCrossEntropy())
    model.fit(ids, labels, batch_size=4, epochs=1, verbose=0, shuffle=False)
    return [w.numpy() for w in model.weights]
mirrored = weights_after_one_step(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
single = weights_after_one_step(tf.distribute.get_strategy())
print("MAX_DIFF", max(float(np.abs(a - b).max()) for a, b in zip(mirrored, single)))
"""


def test_two_tf_replicas_with_equal_halves_update_like_one_device():
    # Keras sums replica gradients and expects each replica's loss pre-divided by the
    # replica count; without that division this update would be twice as large.
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.distribute replica scaling only applies to the TensorFlow backend")
    import os
    import subprocess
    import sys

    # A fresh process: logical devices must be set before TensorFlow starts.
    import keras_transformer

    repo_root = os.path.dirname(os.path.dirname(os.path.abspath(keras_transformer.__file__)))
    python_path = os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")]))
    env = {
        **os.environ,
        "KERAS_BACKEND": "tensorflow",
        "TF_CPP_MIN_LOG_LEVEL": "3",
        "PYTHONPATH": python_path,
    }
    result = subprocess.run(
        [sys.executable, "-c", _MIRRORED_SCRIPT],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    max_diff = float(result.stdout.split("MAX_DIFF")[-1])
    assert max_diff < 1e-6
