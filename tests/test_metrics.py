"""MaskedAccuracy and Perplexity: hand-computed across batches, padding ignored, reset, compile."""

import math
import re

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.train.metrics import MaskedAccuracy
from keras_transformer.train.metrics import Perplexity

# Padded rows have their arg-max at 0 == the padding label: counted, they would be "correct".
LABELS_1 = np.array([[1, 2, 0]], dtype="int32")
LOGITS_1 = np.array(
    [[[0.0, 3.0, 1.0, 0.0], [0.0, 0.0, 0.0, 2.0], [5.0, 0.0, 0.0, 0.0]]], dtype="float32"
)  # arg-max 1 (right), 3 (wrong), padding
LABELS_2 = np.array([[3, 3, 3], [1, 0, 0]], dtype="int32")
LOGITS_2 = np.array(
    [
        [[0.0, 0.0, 0.0, 1.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.0, 0.0, 2.0]],
        [[0.0, 4.0, 0.0, 0.0], [9.0, 0.0, 0.0, 0.0], [9.0, 0.0, 0.0, 0.0]],
    ],
    dtype="float32",
)  # arg-max 3 (right), 0 (wrong), 3 (right); 1 (right), padding, padding


def hand_nll(logits, labels):
    """-log softmax(logits)[label] of the real tokens, float64 numpy."""
    logits = logits.astype("float64")
    log_p = logits - np.log(np.exp(logits).sum(axis=-1, keepdims=True))
    nll = -np.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]
    return nll[labels != 0]


def value(metric):
    return float(ops.convert_to_numpy(metric.result()))


def test_masked_accuracy_accumulates_real_tokens_across_batches():
    metric = MaskedAccuracy()
    assert value(metric) == 0.0
    metric.update_state(LABELS_1, LOGITS_1)
    assert value(metric) == pytest.approx(1 / 2)  # 2/3 if padding counted
    metric.update_state(LABELS_2, LOGITS_2)
    # (1 + 3) right of (2 + 4) real tokens; the mean of batch means would be 0.625.
    assert value(metric) == pytest.approx(4 / 6)
    metric.reset_state()
    assert value(metric) == 0.0
    metric.update_state(LABELS_2, LOGITS_2)
    assert value(metric) == pytest.approx(3 / 4)


def test_masked_accuracy_weighs_tokens_by_sample_weight():
    metric = MaskedAccuracy()
    # Row 0: 2 of 3 right, weight 1; row 1: its one real token right, weight 3.
    metric.update_state(LABELS_2, LOGITS_2, sample_weight=np.array([1.0, 3.0]))
    assert value(metric) == pytest.approx((2 * 1 + 1 * 3) / (3 * 1 + 1 * 3))


def test_perplexity_is_exp_of_total_nll_over_total_tokens():
    nll_1, nll_2 = hand_nll(LOGITS_1, LABELS_1), hand_nll(LOGITS_2, LABELS_2)
    # Token 1 of batch 1: logsumexp(0, 3, 1, 0) - 3.
    assert nll_1[0] == pytest.approx(math.log(2 + math.exp(3) + math.e) - 3, rel=1e-12)
    metric = Perplexity()
    assert value(metric) == 1.0
    metric.update_state(LABELS_1, LOGITS_1)
    assert value(metric) == pytest.approx(math.exp(nll_1.mean()), rel=1e-6)
    metric.update_state(LABELS_2, LOGITS_2)
    expected = math.exp((nll_1.sum() + nll_2.sum()) / 6)
    assert expected == pytest.approx(2.4733045, rel=1e-6)  # mean of batch values: 2.82
    assert value(metric) == pytest.approx(expected, rel=1e-6)
    metric.reset_state()
    assert value(metric) == 1.0


def test_perplexity_of_uniform_logits_is_the_vocabulary_size():
    metric = Perplexity()
    metric.update_state(np.array([[5, 9, 0]]), np.zeros((1, 3, 32), "float32"))
    assert value(metric) == pytest.approx(32.0, rel=1e-6)


def test_a_custom_ignore_id_is_honoured():
    metric = MaskedAccuracy(ignore_id=-1)
    metric.update_state(np.where(LABELS_2 == 0, -1, LABELS_2), LOGITS_2)
    assert value(metric) == pytest.approx(3 / 4)


@pytest.mark.parametrize("metric_class", [MaskedAccuracy, Perplexity])
def test_serialization_round_trip(metric_class):
    metric = metric_class(ignore_id=7, name="m")
    restored = keras.saving.deserialize_keras_object(
        keras.saving.serialize_keras_object(metric)
    )
    assert isinstance(restored, metric_class)
    assert restored.get_config() == metric.get_config()
    assert restored.get_config()["ignore_id"] == 7


def test_ignore_id_must_be_an_integer_or_none():
    with pytest.raises(ValueError, match=re.escape("Received: ignore_id=0.5")):
        Perplexity(ignore_id=0.5)


def test_metrics_work_inside_model_compile_and_accumulate_over_batches():
    keras.utils.set_random_seed(0)
    ids = keras.Input(shape=(None,), dtype="int32")
    logits = keras.layers.Dense(32)(keras.layers.Embedding(32, 8)(ids))
    model = keras.Model(ids, logits)
    model.compile(loss="sparse_categorical_crossentropy", metrics=[MaskedAccuracy(), Perplexity()])
    inputs = np.array([[5, 6, 7, 8, 9], [10, 11, 12, 0, 0]], dtype="int32")
    labels = np.array([[6, 7, 8, 9, 3], [11, 12, 3, 0, 0]], dtype="int32")
    predictions = ops.convert_to_numpy(model(inputs))
    real = labels != 0
    accuracy = (predictions.argmax(-1) == labels)[real].mean()
    perplexity = math.exp(hand_nll(predictions, labels).mean())
    # batch_size=1: two batches of 5 and 3 real tokens, pooled as 8 tokens.
    logs = model.evaluate(inputs, labels, batch_size=1, return_dict=True, verbose=0)
    assert logs["masked_accuracy"] == pytest.approx(accuracy, rel=1e-6)
    assert logs["perplexity"] == pytest.approx(perplexity, rel=1e-5)
