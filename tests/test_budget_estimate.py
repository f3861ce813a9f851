"""StepBudgetEstimator: the total of a BudgetSchedule estimated from the measured step time.

Time is a fake clock that a callback placed before the estimator advances by set
seconds per batch and per epoch, so every estimate is exact and nothing depends on how
fast this machine is. The models are one weight `w` (a bias-free Dense on the input 1)
trained by plain SGD on the loss `w`: its gradient is 1, so each update subtracts the
learning rate it was compiled with, and `-w` after `fit` is the sum of the rates the
compiled steps applied. Under TensorFlow and JAX that sum follows a new total only if
the train function was rebuilt; eager PyTorch reads the schedule every step.
"""

import csv
import json
import os
import re

import keras
import numpy as np
import pytest
from keras import ops

import keras_transformer as kt
from keras_transformer.train.accumulation import PerUpdateSchedule
from keras_transformer.train.budget_estimate import (
    LOG_KEY,
    STATE_FILE,
    StepBudgetEstimator,
    default_measure_steps,
    estimate_total_steps,
)
from keras_transformer.train.budget_schedule import PROVISIONAL_TOTAL_STEPS, BudgetSchedule
from keras_transformer.train.callbacks import current_learning_rate
from keras_transformer.train.compile import compile_transformer, make_optimizer, make_schedule
from conftest import once_on, tiny_config


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class Tick(keras.callbacks.Callback):
    """Moves the clock as if the first call of the train function (which compiles) took
    `first` seconds, every later batch `per_batch`, and each epoch's end `epoch_end`."""

    def __init__(self, clock, first, per_batch, epoch_end=0.0):
        super().__init__()
        self.clock, self.first, self.per_batch, self.epoch_end = clock, first, per_batch, epoch_end
        self.calls = 0

    def on_train_batch_end(self, batch, logs=None):
        self.clock.now += self.first if self.calls == 0 else self.per_batch
        self.calls += 1

    def on_epoch_end(self, epoch, logs=None):
        self.clock.now += self.epoch_end


def one_weight_model(warmup_steps, decay="linear", accumulation=1):
    """w (one weight, 0) under SGD on `make_schedule(16, ...)` with the estimate opt-in."""
    training = kt.TrainingConfig(warmup_steps=warmup_steps, decay=decay)
    schedule = make_schedule(16, training, estimate_total_steps=True)
    learning_rate = PerUpdateSchedule(schedule, accumulation) if accumulation > 1 else schedule
    inputs = keras.Input((1,))
    outputs = keras.layers.Dense(1, use_bias=False, kernel_initializer="zeros")(inputs)
    model = keras.Model(inputs, outputs)
    optimizer = keras.optimizers.SGD(
        learning_rate, gradient_accumulation_steps=accumulation if accumulation > 1 else None
    )
    model.compile(optimizer=optimizer, loss=lambda y_true, y_pred: ops.mean(y_pred))
    return model, schedule


def fit(model, callbacks, batches_per_epoch, epochs):
    x = np.ones((batches_per_epoch, 1), "float32")
    return model.fit(x, x, batch_size=1, epochs=epochs, verbose=0, shuffle=False, callbacks=callbacks)


def applied_sum(model):
    return -float(ops.convert_to_numpy(model.weights[0])[0, 0])


def linear(peak, warmup, total, step):
    """BudgetSchedule's linear rate at the paper's `step` (iteration + 1), by hand."""
    if step <= warmup:
        return peak * step / warmup
    return peak * (1 - min((step - warmup) / (total - warmup), 1.0))


# ------------------------------------------------------------------------ the formula
def test_the_formula_and_its_clamp():
    assert estimate_total_steps(100, 60.0, 0.5, warmup_steps=40) == (220, 220)
    assert estimate_total_steps(100, 60.9, 0.5, warmup_steps=40) == (221, 221)  # whole steps only
    assert estimate_total_steps(10, 4.0, 0.5, warmup_steps=40) == (41, 18)  # clamped to W + 1
    assert estimate_total_steps(50, -3.0, 0.5, warmup_steps=40) == (50, 50)  # budget spent: no more
    assert [default_measure_steps(w) for w in (1, 4, 5, 60, 100, 4000)] == [2, 2, 2, 30, 50, 50]


# -------------------------------------------------------------------- estimates in fit
def test_estimates_after_the_measured_steps_and_a_whole_epoch_and_the_compiled_steps_follow(tmp_path):
    # W 4, linear, peak (16 * 4)^-0.5 = 0.125; budget 40 s; 3 epochs of 5 batches.
    model, schedule = one_weight_model(warmup_steps=4)
    assert schedule.total_steps == PROVISIONAL_TOTAL_STEPS
    clock, printed = FakeClock(), []
    estimator = StepBudgetEstimator(40, state_dir=str(tmp_path / "backup"), clock=clock, print_fn=printed.append)
    history = fit(model, [Tick(clock, first=10, per_batch=1, epoch_end=6), estimator], 5, epochs=3)
    # Batch 1 ends at 10 s (compiling: not timed); batches 2-3 end at 11, 12 s: 1 s/step
    # over default_measure_steps(4) = 2 steps; 3 done, (40 - 12) / 1 = 28 more: step 31.
    # Epoch 1 (it compiled: not used) ends at 14 + 6 = 20 s. Epoch 2 runs whole on the
    # measured total: 20 -> 25 + 6 = 31 s for 5 batches = 2.2 s/step; 10 done,
    # (40 - 31) / 2.2 = 4.09, so 4 more: step 14.
    assert printed == [
        "budget: 1.00 s/step measured over 2 steps; the schedule decays to its floor at step 31",
        "budget: 2.20 s/step over epoch 2 (validation and callbacks included); "
        "the schedule decays to its floor at step 14",
    ]
    assert [(e["at_step"], e["seconds_per_step"], e["total_steps"], e["source"]) for e in estimator.estimates] == [
        (3, 1.0, 31, "measured"),
        (10, pytest.approx(2.2), 14, "epochs"),
    ]
    assert estimator.estimated_total_steps == 14
    assert schedule.total_steps == 14
    assert history.history[LOG_KEY] == [31, 31, 14]  # the total at each epoch's end, for the CSV log
    # What the compiled steps applied: iterations 0-2 (warmup) on the provisional total,
    # 3-9 on 31, 10-14 on 14. Without the rebuilt train function TF and JAX would apply
    # ~0.125 at iterations 3-14 (the provisional total's decay has not begun).
    expected = sum(linear(0.125, 4, 31, it + 1) for it in range(10)) + sum(
        linear(0.125, 4, 14, it + 1) for it in range(10, 15)
    )
    assert applied_sum(model) == pytest.approx(expected, rel=1e-5)
    assert expected < 0.125 * 12  # the decays took effect: a sum the old totals cannot give
    assert current_learning_rate(model.optimizer) == pytest.approx(linear(0.125, 4, 14, 16))
    # backup/ did not exist during epoch 1; made at epoch 2's start, it holds the latest.
    with open(tmp_path / "backup" / STATE_FILE) as file:
        saved = json.load(file)
    assert saved["total_steps"] == 14 and saved["source"] == "epochs"


class EpochTick(Tick):
    """A Tick whose seconds per batch (after the first) change with the epoch."""

    def __init__(self, clock, first, per_batch_by_epoch):
        super().__init__(clock, first, per_batch=None)
        self.per_batch_by_epoch = per_batch_by_epoch

    def on_epoch_begin(self, epoch, logs=None):
        self.per_batch = self.per_batch_by_epoch[epoch]


def test_later_epochs_refine_the_total_skipping_epochs_that_retraced():
    # W 4, linear, peak 0.125; budget 100 s; 6 epochs of 5 batches; 2 s a batch in
    # epochs 1-2, then 1 s (the machine got faster).
    model, schedule = one_weight_model(warmup_steps=4)
    clock, printed = FakeClock(), []
    estimator = StepBudgetEstimator(100, clock=clock, print_fn=printed.append)
    tick = EpochTick(clock, first=10, per_batch_by_epoch=[2, 2, 1, 1, 1, 1])
    history = fit(model, [tick, estimator], 5, epochs=6)
    # Epoch 1: batches 2-3 end at 12, 14 s: 2 s/step, 3 done, 86 s left: 3 + 43 = 46; a
    # rebuild mid-epoch, so epoch 1 is not timed (it compiled anyway). Epoch 2 (18-28 s)
    # runs whole: at 28 s, 2 s/step, 10 done + 72 / 2 = 46, kept (no rebuild).
    # Epoch 3 (28-33 s): at 33 s, epochs 2-3 give 15 s / 10 = 1.5 s/step: 15 + 44 = 59,
    # rebuilt at epoch 4's start, so epoch 4 (33-38 s) is left out. At 43 s, epochs 2, 3
    # and 5 give 20 s / 15: 25 done + floor(57 / 1.333) = 25 + 42 = 67.
    assert printed == [
        "budget: 2.00 s/step measured over 2 steps; the schedule decays to its floor at step 46",
        "budget: 2.00 s/step over epoch 2 (validation and callbacks included); the estimate, "
        "step 46, is within 2% of the schedule's: it keeps decaying to its floor at step 46",
        "budget: 1.50 s/step over epochs 2 and 3 (validation and callbacks included); "
        "the schedule decays to its floor at step 59",
        "budget: 1.33 s/step over epochs 2, 3 and 5 (validation and callbacks included); "
        "the schedule decays to its floor at step 67",
    ]
    assert history.history[LOG_KEY] == [46, 46, 46, 59, 59, 67]
    expected = (
        sum(linear(0.125, 4, 46, it + 1) for it in range(15))
        + sum(linear(0.125, 4, 59, it + 1) for it in range(15, 25))
        + sum(linear(0.125, 4, 67, it + 1) for it in range(25, 30))
    )
    assert applied_sum(model) == pytest.approx(expected, rel=1e-5)


def test_a_budget_shorter_than_the_warmup_is_clamped_and_says_so(tmp_path):
    model, schedule = one_weight_model(warmup_steps=4)
    clock, printed = FakeClock(), []
    estimator = StepBudgetEstimator(12.5, state_dir=str(tmp_path / "backup"), clock=clock, print_fn=printed.append)
    fit(model, [Tick(clock, first=10, per_batch=1), estimator], 5, epochs=1)
    # At 12 s, 3 steps done and 0.5 s left: 3 + 0 = 3 <= W; clamped to W + 1 = 5.
    assert printed == [
        "budget: 1.00 s/step measured over 2 steps; the schedule decays to its floor at step 5 "
        "(the budget fits 3 steps, fewer than warmup_steps + 1 = 5: clamped)"
    ]
    assert schedule.total_steps == 5 and estimator.estimates[0]["estimate"] == 3
    expected = sum(linear(0.125, 4, 5, it + 1) for it in range(5))  # 0.03125 + ... + 0.125 + 0
    assert applied_sum(model) == pytest.approx(expected, rel=1e-5)
    assert not os.path.exists(tmp_path / "backup")  # one epoch: no backup/ made for it


def test_with_gradient_accumulation_the_estimate_counts_updates():
    # N = 2 batches per update; W 2: peak (16 * 2)^-0.5; measure 2 updates = 4 batches.
    model, schedule = one_weight_model(warmup_steps=2, accumulation=2)
    clock, printed = FakeClock(), []
    estimator = StepBudgetEstimator(30, clock=clock, print_fn=printed.append)
    fit(model, [Tick(clock, first=10, per_batch=1), estimator], 8, epochs=1)
    # Batch 1 at 10 s, batch 5 at 14 s: 1 s/batch = 2 s/update; floor(5 / 2) = 2 updates
    # done, (30 - 14) / 2 = 8 more: update 10.
    assert printed == [
        "budget: 2.00 s/step measured over 2 steps; the schedule decays to its floor at step 10; "
        "a step is one update of 2 batches"
    ]
    assert schedule.total_steps == 10
    assert int(ops.convert_to_numpy(model.optimizer.iterations)) == 4
    # Updates 0-1 in the warmup; update 2 (applied at batch 6) and 3 on the total 10.
    peak = (16 * 2) ** -0.5
    expected = peak / 2 + peak + peak * 7 / 8 + peak * 6 / 8
    assert applied_sum(model) == pytest.approx(expected, rel=1e-5)


def test_a_resumed_run_starts_from_the_saved_step_time_and_its_own_budget(tmp_path):
    model, schedule = one_weight_model(warmup_steps=4)
    model.optimizer.build(model.trainable_variables)
    model.optimizer.iterations.assign(6)  # what BackupAndRestore restored
    (tmp_path / STATE_FILE).write_text(json.dumps({"seconds_per_step": 2.0, "measured_steps": 50.0}))
    clock, printed = FakeClock(), []
    # measure_steps 100: the run ends before it measures; the saved 2 s/step decides.
    estimator = StepBudgetEstimator(30, 100, state_dir=str(tmp_path), clock=clock, print_fn=printed.append)
    fit(model, [Tick(clock, first=10, per_batch=1), estimator], 5, epochs=1)
    # 6 steps restored, this process's 30 s at 2 s/step: 15 more, step 21.
    assert printed == [
        "budget: 2.00 s/step measured before the run was resumed at step 6; "
        "the schedule decays to its floor at step 21"
    ]
    expected = sum(linear(0.125, 4, 21, it + 1) for it in range(6, 11))
    assert applied_sum(model) == pytest.approx(expected, rel=1e-5)
    with open(tmp_path / STATE_FILE) as file:
        assert json.load(file)["total_steps"] == 21


def test_a_run_too_short_to_measure_keeps_the_provisional_total_and_says_so():
    model, schedule = one_weight_model(warmup_steps=4)
    printed = []
    fit(model, [StepBudgetEstimator(30, clock=FakeClock(), print_fn=printed.append)], 2, epochs=1)
    assert printed == [
        "budget: training ended before 2 steps were timed; the schedule kept its total, step 1,000,000,000"
    ]
    assert schedule.total_steps == PROVISIONAL_TOTAL_STEPS


# ------------------------------------------------------------------------ bad inputs
@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(seconds=0), r"`seconds` must be a finite number > 0. Received: seconds=0"),
        (dict(seconds=10, measure_steps=0), r"`measure_steps` must be a positive integer. Received: measure_steps=0"),
        (dict(seconds=10, clock=3.0), r"`clock` must be callable. Received: clock=3.0"),
    ],
)
def test_bad_estimator_arguments_name_what_was_received(kwargs, message):
    with pytest.raises(ValueError, match=message):
        StepBudgetEstimator(**kwargs)


def test_the_estimator_refuses_a_schedule_it_cannot_end():
    inputs = keras.Input((1,))
    model = keras.Model(inputs, keras.layers.Dense(1)(inputs))
    model.compile(optimizer=make_optimizer(16, kt.TrainingConfig(warmup_steps=4)), loss="mse")
    message = r"sets the total of a BudgetSchedule.*Received: learning rate TransformerSchedule"
    with pytest.raises(ValueError, match=message):
        fit(model, [StepBudgetEstimator(30)], 2, epochs=1)


@pytest.mark.parametrize(
    "training, estimate, message",
    [
        (dict(decay="cosine"), False, r"needs `total_steps` .* or estimate_total_steps=True .* total_steps=None"),
        (dict(), True, r"decay='rsqrt' \(eq. 3\) never ends. Received: decay='rsqrt'"),
        (dict(decay="cosine", total_steps=5000), True, r"already set: .* total_steps=5000, estimate_total_steps=True"),
        (dict(decay="cosine"), "yes", r"`estimate_total_steps` must be True or False. .*estimate_total_steps='yes'"),
    ],
)
def test_make_schedule_needs_total_steps_or_the_estimate_opt_in(training, estimate, message):
    with pytest.raises(ValueError, match=message):
        make_schedule(64, kt.TrainingConfig(**training), estimate_total_steps=estimate)


def test_compile_transformer_passes_the_opt_in():
    model = kt.build_transformer(tiny_config())
    training = kt.TrainingConfig(warmup_steps=10, decay="cosine", gradient_accumulation_steps=2)
    with pytest.raises(ValueError, match="needs `total_steps`"):
        compile_transformer(model, training)
    compile_transformer(model, training, estimate_total_steps=True)
    schedule = model.optimizer._learning_rate.schedule  # inside the PerUpdateSchedule
    assert isinstance(schedule, BudgetSchedule) and schedule.total_steps == PROVISIONAL_TOTAL_STEPS


def test_a_run_config_with_a_budgeted_decay_needs_total_steps_or_a_time_budget():
    from keras_transformer.train.run_config import RunConfig

    with pytest.raises(
        ValueError,
        match=r"\[training\] decay='cosine' .* set `\[training\] total_steps` \(updates\), or "
        r"`max_train_seconds` .* Received: total_steps=None, max_train_seconds=0",
    ):
        RunConfig(training={"decay": "cosine"})
    assert RunConfig(training={"decay": "cosine"}, max_train_seconds=2700).estimates_total_steps
    with_total = RunConfig(training={"decay": "cosine", "total_steps": 9000}, max_train_seconds=2700)
    assert not with_total.estimates_total_steps
    assert not RunConfig(max_train_seconds=2700).estimates_total_steps  # rsqrt: nothing to estimate


# ------------------------------------------------------------------------ a whole run
SOURCE = "red blue green black white small big old".split()
TARGET = "rot blau gruen schwarz weiss klein gross alt".split()


@once_on("torch", "a run's wiring of the estimator is Python, the same on every backend (the compiled "
         "steps following a new total are this file's fake-clock tests, on every backend)")
def test_a_run_with_only_a_time_budget_estimates_its_steps(tmp_path, capsys):
    from keras_transformer.model.directory import CHECKPOINT_DIR, CSV_LOG_FILE, MODEL_FILE
    from keras_transformer.train.run import run_training
    from keras_transformer.train.run_config import RunConfig

    rng = np.random.default_rng(0)
    words = [rng.integers(0, len(SOURCE), size=1 + i % 2) for i in range(60)]
    (tmp_path / "train.en").write_text("".join(" ".join(SOURCE[w] for w in ws) + "\n" for ws in words))
    (tmp_path / "train.de").write_text("".join(" ".join(TARGET[w] for w in ws[::-1]) + "\n" for ws in words))
    config = RunConfig(
        name="budget", output_dir=str(tmp_path / "out"), corpus="files", data_dir=str(tmp_path),
        validation_split="", test_split="", vocab_size=48, epochs=2, steps_per_epoch=3,
        max_train_seconds=3600,  # far more than the run takes: the epochs end it
        bleu_every_epochs=0, sample_translations=0, verbose=0,
        jit_compile=False,
        keep_checkpoints=2, checkpoint_every_steps=2, tokens_per_batch=64,
        model=dict(d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                   max_length=8, dropout=0.0),
        training={"decay": "cosine", "warmup_steps": 4},
    )
    result = run_training(config)
    out = capsys.readouterr().out
    assert "cosine decay to the floor at the end of the budget (steps estimated as it trains)" in out
    # Measured after 1 + 2 steps, in epoch 1; this machine's speed sets the numbers.
    lines = re.findall(r"^budget: [\d.]+ s/step .*step ([\d,]+)$", out, re.MULTILINE)
    assert lines and result.estimated_total_steps == int(lines[-1].replace(",", "")) > 4
    assert result.seconds_per_step > 0 and result.steps == 6
    with open(os.path.join(result.model_dir, CSV_LOG_FILE)) as file:
        rows = list(csv.DictReader(file))
    assert int(rows[-1][LOG_KEY]) == result.estimated_total_steps
    model = keras.saving.load_model(os.path.join(result.model_dir, MODEL_FILE))
    assert model.optimizer._learning_rate.total_steps == result.estimated_total_steps  # saved with it
    # Checkpoints every 2 updates (2, 4, 6), the last 2 kept.
    assert sorted(os.listdir(os.path.join(result.model_dir, CHECKPOINT_DIR))) == [
        "step_0000004.weights.h5", "step_0000006.weights.h5"]
