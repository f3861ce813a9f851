"""BudgetSchedule: the paper's warmup and peak, then a tail that ends at total_steps."""

import math

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from keras_transformer.train.budget_schedule import BudgetSchedule


def lr(schedule, iteration):
    return float(ops.convert_to_numpy(schedule(iteration)))


def test_warmup_and_peak_are_the_papers():
    budget = BudgetSchedule(d_model=512, total_steps=10_000, warmup_steps=4000)
    paper = kt.TransformerSchedule(d_model=512, warmup_steps=4000)
    assert budget.peak_learning_rate == pytest.approx(6.9877124e-04, rel=1e-7)
    for iteration in (0, 1, 1999, 3999):  # the whole warmup equals eq. 3's
        assert lr(budget, iteration) == pytest.approx(lr(paper, iteration), rel=1e-6)


def test_cosine_by_hand():
    # d_model 16, W 4, T 12: peak = 0.5 * (16 * 4)^-0.5 = 0.0625; p = (step - 4) / 8.
    schedule = BudgetSchedule(16, total_steps=12, warmup_steps=4, scale=0.5)
    assert schedule.peak_learning_rate == pytest.approx(0.0625)
    expected = {
        0: 0.0625 / 4,  # step 1 of the warmup
        3: 0.0625,  # step 4: the peak
        5: 0.0625 * (1 + math.cos(math.pi * 2 / 8)) / 2,  # step 6: p = 1/4
        7: 0.03125,  # step 8: p = 1/2
        11: 0.0,  # step 12 == T: the floor
        40: 0.0,  # past T: stays at the floor
    }
    for iteration, value in expected.items():
        assert lr(schedule, iteration) == pytest.approx(value, rel=1e-6, abs=1e-9)


def test_linear_with_a_floor_by_hand():
    # peak = (16 * 4)^-0.5 = 0.125, floor = 0.1 * peak = 0.0125; p = (step - 4) / 6.
    schedule = BudgetSchedule(16, total_steps=10, warmup_steps=4, decay="linear", final_fraction=0.1)
    assert lr(schedule, 6) == pytest.approx(0.125 + (0.0125 - 0.125) * 3 / 6)  # step 7
    assert lr(schedule, 9) == pytest.approx(0.0125)  # step 10 == T
    assert lr(schedule, 100) == pytest.approx(0.0125)


def test_rsqrt_cooldown_follows_the_paper_then_cools_to_zero():
    # W 4, T 24: 20 post-warmup steps, the last 0.25 * 20 = 5 of them cool down.
    schedule = BudgetSchedule(16, total_steps=24, warmup_steps=4, decay="rsqrt_cooldown", cooldown_fraction=0.25)
    paper = kt.TransformerSchedule(16, warmup_steps=4)
    for iteration in (3, 8, 18):  # steps 4, 9, 19: before the cool-down starts at step 19
        assert lr(schedule, iteration) == pytest.approx(lr(paper, iteration), rel=1e-6)
    # step 22: p = 18/20, factor = (1 - 0.9) / 0.25 = 0.4
    assert lr(schedule, 21) == pytest.approx(0.4 * lr(paper, 21), rel=1e-6)
    assert lr(schedule, 23) == pytest.approx(0.0, abs=1e-9)


def test_it_drives_adam_inside_a_compiled_fit():
    config = kt.TransformerConfig.from_preset(
        "tiny", vocab_size=20, d_model=8, d_ff=16, num_heads=2, num_encoder_layers=1,
        num_decoder_layers=1, max_length=8, dropout=0.0,
    )
    model = kt.build_transformer(config)
    schedule = BudgetSchedule(8, total_steps=3, warmup_steps=1)
    model.compile(optimizer=keras.optimizers.Adam(schedule), loss=kt.LabelSmoothedCrossEntropy())
    ids = np.random.default_rng(0).integers(4, 20, (4, 6)).astype("int32")
    model.fit({"encoder_inputs": ids, "decoder_inputs": ids}, ids, epochs=1, batch_size=2, verbose=0)
    model.fit({"encoder_inputs": ids, "decoder_inputs": ids}, ids, epochs=1, batch_size=2, verbose=0)
    # Four updates: iterations 0-3 ran at steps 1-4; the next one (step 5 > T) is at the floor.
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 4
    assert float(ops.convert_to_numpy(model.optimizer.learning_rate)) == pytest.approx(0.0, abs=1e-12)


def test_serializes_and_restores_the_same_curve():
    schedule = BudgetSchedule(32, total_steps=50, warmup_steps=5, decay="linear", scale=2.0, final_fraction=0.05)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(schedule))
    assert isinstance(restored, BudgetSchedule)
    assert restored.get_config() == schedule.get_config()
    np.testing.assert_allclose([lr(restored, i) for i in range(60)], [lr(schedule, i) for i in range(60)])


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(total_steps=4, warmup_steps=4), "`total_steps` must be greater than `warmup_steps`"),
        (dict(total_steps=10, warmup_steps=4, decay="exp"), "decay"),
        (dict(total_steps=10, warmup_steps=4, final_fraction=1.0), r"`final_fraction` must be in \[0, 1\)"),
        (dict(total_steps=10, warmup_steps=4, cooldown_fraction=1.5), r"`cooldown_fraction` must be in \(0, 1\]"),
        (dict(total_steps=0, warmup_steps=4), "total_steps"),
    ],
)
def test_bad_arguments_name_what_was_received(kwargs, message):
    with pytest.raises(ValueError, match=message):
        BudgetSchedule(16, **kwargs)


def test_training_config_decay_picks_the_schedule():
    from keras_transformer.train.compile import make_schedule

    assert isinstance(make_schedule(64), kt.TransformerSchedule)
    config = kt.TrainingConfig(warmup_steps=10, decay="linear", total_steps=110)
    schedule = make_schedule(64, config)
    assert isinstance(schedule, BudgetSchedule)
    assert (schedule.total_steps, schedule.warmup_steps, schedule.decay) == (110, 10, "linear")
    assert lr(schedule, 59) == pytest.approx(schedule.peak_learning_rate / 2, rel=1e-6)  # step 60: p = 1/2


@pytest.mark.parametrize(
    "changes, message",
    [
        (dict(decay="cosine", total_steps=100, warmup_steps=100), "greater than `warmup_steps`"),
        (dict(decay="step"), "decay"),
        (dict(total_steps=-5), "total_steps"),
    ],
)
def test_training_config_refuses_a_budget_it_cannot_end(changes, message):
    with pytest.raises(ValueError, match=message):
        kt.TrainingConfig(**changes)


def test_a_budgeted_decay_without_total_steps_is_refused_where_it_is_compiled():
    # The config alone cannot tell: a run config with max_train_seconds estimates the
    # total (tests/test_budget_estimate.py); make_schedule refuses it without the opt-in.
    from keras_transformer.train.compile import make_schedule

    config = kt.TrainingConfig(decay="cosine")
    assert config.total_steps is None
    with pytest.raises(ValueError, match=r"decay='cosine' .* needs `total_steps` .* Received: total_steps=None"):
        make_schedule(64, config)
