"""TransformerSchedule: the paper's eq. 3, step counting from 1, serialization, validation."""

import math
import re

import keras
import numpy as np
import pytest
from keras import ops

from keras_transformer.train.schedules import TransformerSchedule


def lr_at_iteration(schedule, iteration):
    return float(ops.convert_to_numpy(schedule(iteration)))


def test_values_at_step_1_warmup_and_four_times_warmup_match_the_paper():
    schedule = TransformerSchedule(d_model=512, warmup_steps=4000)
    # Keras passes iterations 0, 1, ...; the paper's step is iteration + 1.
    step_1 = 512**-0.5 * min(1**-0.5, 1 * 4000**-1.5)
    at_warmup = 512**-0.5 * min(4000**-0.5, 4000 * 4000**-1.5)
    at_four_warmups = 512**-0.5 * min(16000**-0.5, 16000 * 4000**-1.5)
    # The same numbers written out by hand.
    assert step_1 == pytest.approx(1.7469281e-07, rel=1e-7)
    assert at_warmup == pytest.approx(6.9877124e-04, rel=1e-7)
    assert at_four_warmups == pytest.approx(at_warmup / 2, rel=1e-12)
    assert lr_at_iteration(schedule, 0) == pytest.approx(step_1, rel=1e-6)
    assert lr_at_iteration(schedule, 3999) == pytest.approx(at_warmup, rel=1e-6)
    assert lr_at_iteration(schedule, 15999) == pytest.approx(at_four_warmups, rel=1e-6)
    assert schedule.peak_learning_rate == pytest.approx(at_warmup, rel=1e-12)


def test_iteration_zero_is_step_one_and_the_curve_turns_at_warmup():
    schedule = TransformerSchedule(d_model=8, warmup_steps=4, scale=2.0)
    # step 1: 2 * 8^-0.5 * 1 * 4^-1.5 = 2 * 0.35355339 * 0.125
    assert lr_at_iteration(schedule, 0) == pytest.approx(0.08838835, rel=1e-6)
    expected = [2.0 * 8**-0.5 * min(s**-0.5, s * 4**-1.5) for s in range(1, 9)]
    got = [lr_at_iteration(schedule, i) for i in range(8)]
    np.testing.assert_allclose(got, expected, rtol=1e-6)
    assert int(np.argmax(got)) == 3  # the peak is at step == warmup_steps
    assert max(got) == pytest.approx(schedule.peak_learning_rate, rel=1e-6)


def test_accepts_a_tensor_iteration_as_the_optimizer_passes_it():
    schedule = TransformerSchedule(d_model=8, warmup_steps=4)
    iteration = ops.convert_to_tensor(np.array(5, dtype="int64"))
    assert lr_at_iteration(schedule, iteration) == pytest.approx(
        8**-0.5 * 6**-0.5, rel=1e-6
    )


def test_get_config_round_trip_gives_the_same_values():
    schedule = TransformerSchedule(d_model=16, warmup_steps=10, scale=0.5)
    assert schedule.get_config() == {"d_model": 16, "warmup_steps": 10, "scale": 0.5}
    restored = TransformerSchedule.from_config(schedule.get_config())
    serialized = keras.saving.serialize_keras_object(schedule)
    deserialized = keras.saving.deserialize_keras_object(serialized)
    assert isinstance(deserialized, TransformerSchedule)
    for iteration in (0, 9, 39):
        value = lr_at_iteration(schedule, iteration)
        assert lr_at_iteration(restored, iteration) == value
        assert lr_at_iteration(deserialized, iteration) == value


def test_survives_an_optimizer_config_round_trip():
    optimizer = keras.optimizers.Adam(
        TransformerSchedule(d_model=16, warmup_steps=10), beta_1=0.9, beta_2=0.98
    )
    restored = keras.optimizers.Adam.from_config(optimizer.get_config())
    assert restored.get_config()["learning_rate"] == optimizer.get_config()["learning_rate"]
    # A fresh optimizer is at iteration 0, i.e. the paper's step 1.
    assert float(ops.convert_to_numpy(restored.learning_rate)) == pytest.approx(
        16**-0.5 * 10**-1.5, rel=1e-6
    )


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"d_model": 0}, "`d_model` must be a positive integer. Received: d_model=0"),
        ({"d_model": 2.5}, "`d_model` must be a positive integer. Received: d_model=2.5"),
        ({"d_model": True}, "`d_model` must be a positive integer. Received: d_model=True"),
        (
            {"d_model": 8, "warmup_steps": 0},
            "`warmup_steps` must be a positive integer. Received: warmup_steps=0",
        ),
        (
            {"d_model": 8, "warmup_steps": -5},
            "`warmup_steps` must be a positive integer. Received: warmup_steps=-5",
        ),
        ({"d_model": 8, "scale": 0.0}, "`scale` must be a finite number > 0. Received: scale=0.0"),
        (
            {"d_model": 8, "scale": math.nan},
            "`scale` must be a finite number > 0. Received: scale=nan",
        ),
    ],
)
def test_invalid_arguments_raise_with_the_received_value(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        TransformerSchedule(**kwargs)
