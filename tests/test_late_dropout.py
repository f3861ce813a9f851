"""LateDropout: dropouts off for the first updates, on from a step, in compiled steps.

Each test builds the test-sized model from one seed, with attention and activation
dropout 0.1 (residual dropout 0.1 too where it says so). The switch tests compare the
weights after `fit` against a copy trained by hand: the dropouts' rates set to 0, `fit`
over the updates before the start, the rates set back and the train function rebuilt,
`fit` over the rest. Equal weights mean the callback switched at exactly that update;
the steps run compiled (TensorFlow graphs, `jax.jit`), which keep the rate they were
traced with unless the step is rebuilt. Each Dropout layer draws from its own seed
generator, and a layer at rate 0 draws nothing, so the copies see the same random
masks. The other tests read the rate each batch runs with (`Rates`), which costs one
model instead of two; what they check (when the switch comes, which kinds it moves, the
estimated total it follows, the rates after an error) is the callback's own Python,
so they run once, in the PyTorch session, where fit compiles nothing.
"""

import keras
import numpy as np
import pytest
from conftest import once_on, tiny_config, to_numpy

import keras_transformer as kt
from keras_transformer.special_tokens import BOS_ID
from keras_transformer.train.budget_estimate import StepBudgetEstimator
from keras_transformer.train.late_dropout import LateDropout, dropout_layers
from keras_transformer.train.run_config import RunConfig

# The switch's effect on compiled steps is the weight tests' (every backend); these read rates.
CALLBACK_ARITHMETIC = once_on("torch", "the callback's arithmetic is plain Python, the same on every backend")

ROWS, LENGTH, BATCH = 12, 6, 2  # 6 batches of 2 sentences an epoch
EPOCHS, TOTAL = 2, 12  # every fit runs 12 updates; the cosine decay ends at the last


def data(epochs=1):
    rng = np.random.default_rng(0)
    labels = rng.integers(4, 32, (ROWS, LENGTH)).astype("int32")
    decoder = np.concatenate([np.full((ROWS, 1), BOS_ID, "int32"), labels[:, :-1]], axis=1)
    inputs = {"encoder_inputs": rng.integers(4, 32, (ROWS, LENGTH)).astype("int32"), "decoder_inputs": decoder}
    return {k: np.concatenate([v] * epochs) for k, v in inputs.items()}, np.concatenate([labels] * epochs)


def model_with_dropouts(dropout=0.0, decay="cosine"):
    keras.utils.set_random_seed(0)  # the same initial weights and seed generators for every copy
    model = kt.build_transformer(tiny_config(dropout=dropout, attention_dropout=0.1, activation_dropout=0.1))
    training = kt.TrainingConfig(warmup_steps=2, learning_rate_scale=5.0)
    if decay == "cosine":
        training = training.replace(decay="cosine", total_steps=TOTAL)
    # Compiled, not eager: the test is that a traced step follows the switch.
    kt.compile_transformer(model, training, jit_compile="auto" if keras.backend.backend() == "jax" else False)
    return model


def fit(model, inputs, labels, callbacks=(), epochs=1):
    model.fit(inputs, labels, batch_size=BATCH, epochs=epochs, shuffle=False, verbose=0, callbacks=list(callbacks))


def delayed(model, kinds=("attention", "activation")):
    found = dropout_layers(model)
    return [layer for kind in kinds for layer in found[kind]]


def by_hand(model, start, kinds=("attention", "activation")):
    """Trains the 12 updates (2 epochs' batches in one pass) with `kinds` off for the first `start`."""
    inputs, labels = data(EPOCHS)
    rows = start * BATCH
    layers = delayed(model, kinds)
    for layer in layers:
        layer.rate = 0.0
    if start:
        fit(model, {k: v[:rows] for k, v in inputs.items()}, labels[:rows])
    for layer in layers:
        layer.rate = 0.1
    model.make_train_function(force=True)
    if start < TOTAL:
        fit(model, {k: v[rows:] for k, v in inputs.items()}, labels[rows:])
    return [to_numpy(weight) for weight in model.weights]


@pytest.fixture(scope="module")
def reference():
    """The weights trained by hand with the dropouts on from update 8, and never (12)."""
    return {start: by_hand(model_with_dropouts(), start) for start in (8, TOTAL)}


def assert_same_weights(model, expected):
    for actual, wanted in zip([to_numpy(weight) for weight in model.weights], expected):
        np.testing.assert_allclose(actual, wanted, rtol=1e-5, atol=1e-6)


def largest_difference(first, second):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second))


def test_the_kinds_find_every_dropout_layer_of_the_blocks():
    model = kt.build_transformer(tiny_config(num_encoder_layers=2, num_decoder_layers=1))
    found = dropout_layers(model)
    # Encoder: 2 self-attentions; decoder: self- and cross-attention. Feed-forward: 3.
    assert len(found["attention"]) == 4 and len(found["activation"]) == 3
    # Residual: one after each sub-layer (2 + 2 + 3) and one per embedding (2).
    assert len(found["residual"]) == 9


def test_the_dropouts_come_on_at_the_start_step_in_a_later_epoch(reference):
    printed = []
    model = model_with_dropouts()
    callback = LateDropout(start_step=8, print_fn=printed.append)  # batch 3 of epoch 2
    fit(model, *data(), callbacks=[callback], epochs=EPOCHS)
    assert_same_weights(model, reference[8])
    assert callback.switched_at == 8
    assert printed == ["late dropout: attention and activation dropout on from step 8"]
    # The dropouts after the switch show in the weights (those before it: a copy trained
    # with them on throughout differs too, checked when this test was written).
    assert largest_difference(reference[8], reference[TOTAL]) > 1e-4


class Rates(keras.callbacks.Callback):
    """The rate of the first Dropout layer of `kind` that each batch runs with."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.seen = kind, []

    def on_train_batch_begin(self, batch, logs=None):
        self.seen.append(dropout_layers(self.model)[self.kind][0].rate)


@CALLBACK_ARITHMETIC
def test_a_start_fraction_is_a_share_of_the_budget_schedules_total():
    printed = []
    model = model_with_dropouts()
    callback, rates = LateDropout(start_fraction=0.65, print_fn=printed.append), Rates("attention")
    fit(model, *data(), callbacks=[callback, rates])  # one epoch: updates 1-6 of the schedule's 12
    assert callback.start() == 8  # ceil(0.65 * 12)
    assert callback.switched_at is None and rates.seen == [0.0] * 6 and printed == []
    fit(model, *data(), callbacks=[callback, rates])  # updates 7-12
    assert callback.switched_at == 8 and rates.seen[6:] == [0.0, 0.0, 0.1, 0.1, 0.1, 0.1]
    assert printed == ["late dropout: attention and activation dropout on from step 8 of 12"]


def test_a_start_after_the_run_trains_as_if_the_rates_were_zero_and_restores_them(reference, tmp_path):
    model = model_with_dropouts()
    callback = LateDropout(start_step=100)
    fit(model, *data(), callbacks=[callback], epochs=EPOCHS)
    assert callback.switched_at is None
    assert_same_weights(model, reference[TOTAL])
    # The model leaves fit with its own rates, and its config never lost them.
    assert {layer.rate for layer in delayed(model)} == {0.1}
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.config.attention_dropout == 0.1 and loaded.config.activation_dropout == 0.1
    assert {layer.rate for layer in delayed(loaded)} == {0.1}


@CALLBACK_ARITHMETIC
def test_a_fit_stopped_by_an_error_does_not_lose_the_rates():
    class Fail(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            raise RuntimeError("stopped")

    model = model_with_dropouts()
    with pytest.raises(RuntimeError, match="stopped"):  # on_train_end never runs: rates left at 0
        fit(model, *data(), callbacks=[LateDropout(start_step=8), Fail()], epochs=EPOCHS)
    assert {layer.rate for layer in delayed(model)} == {0.0}
    # A new callback still finds the built rates (not 0, "nothing to delay"), and restores them.
    callback, rates = LateDropout(start_step=3), Rates("attention")
    fit(model, *data(), callbacks=[callback, rates])
    # The stopped fit applied update 1, so update 3 is this fit's third batch (index 2).
    assert callback.switched_at == 3 and rates.seen == [0.0, 0.0, 0.1, 0.1, 0.1, 0.1]
    assert {layer.rate for layer in delayed(model)} == {0.1}


@CALLBACK_ARITHMETIC
def test_the_residual_kind_delays_the_papers_dropout_too():
    # The switch itself (rates, rebuilt step) is the one the weight tests check; here,
    # that the paper's residual dropouts follow it and the other kinds do not.
    model = model_with_dropouts(dropout=0.1)
    residual, attention = Rates("residual"), Rates("attention")
    fit(model, *data(), callbacks=[LateDropout(start_step=3, kinds=("residual",)), residual, attention])
    assert residual.seen == [0.0, 0.0, 0.0, 0.1, 0.1, 0.1] and attention.seen == [0.1] * 6  # on from update 3
    assert {layer.rate for layer in dropout_layers(model)["residual"]} == {0.1}


@CALLBACK_ARITHMETIC
def test_a_start_fraction_follows_the_estimated_total():
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    class Tick(keras.callbacks.Callback):  # 1 s a batch
        def on_train_batch_end(self, batch, logs=None):
            clock.now += 1.0

    clock, printed = Clock(), []
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(tiny_config(attention_dropout=0.1, activation_dropout=0.1))
    training = kt.TrainingConfig(warmup_steps=2, decay="cosine")
    kt.compile_transformer(model, training, estimate_total_steps=True, jit_compile=False)
    estimator = StepBudgetEstimator(20, clock=clock, print_fn=lambda line: None)
    callback = LateDropout(start_fraction=0.2, print_fn=printed.append)
    fit(model, *data(), callbacks=[Tick(), estimator, callback])
    # Timed over steps 2-3 (1 s each): 3 done at 3 s, 17 s left: total 20, start ceil(4.0).
    assert estimator.estimated_total_steps == 20
    assert printed == ["late dropout: attention and activation dropout on from step 4 of 20"]


@CALLBACK_ARITHMETIC
def test_an_epoch_rebuilt_by_another_callback_is_not_timed_by_the_estimator():
    # 5 epochs of 6 batches, 1 s a batch. The dropouts come on before step 13, the first
    # batch of epoch 3, which traces again (10 s more here): the estimator times epochs 2
    # and 4, not 3. Timing epoch 3 would give (6 + 10) / 6 s a step there.
    class Clock:
        now = 0.0

        def __call__(self):
            return self.now

    class Tick(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            clock.now += 1.0

        def on_epoch_end(self, epoch, logs=None):
            clock.now += 10.0 if epoch == 2 else 0.0

    clock, printed = Clock(), []
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(tiny_config(attention_dropout=0.1, activation_dropout=0.1))
    kt.compile_transformer(model, kt.TrainingConfig(warmup_steps=2, decay="cosine"), estimate_total_steps=True,
                           jit_compile=False)
    estimator = StepBudgetEstimator(1000, clock=clock, print_fn=printed.append)
    fit(model, *data(), callbacks=[Tick(), estimator, LateDropout(start_step=12)], epochs=5)
    windows = [line.split(" (")[0] for line in printed if " over epoch" in line]
    assert windows == ["budget: 1.00 s/step over epoch 2", "budget: 1.00 s/step over epochs 2 and 4"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(), r"exactly one of `start_step` and `start_fraction`. Received: start_step=None"),
        (dict(start_step=3, start_fraction=0.5), r"exactly one .* start_step=3, start_fraction=0.5"),
        (dict(start_step=-1), r"start_step"),
        (dict(start_fraction=1.0), r"start_fraction"),
        (dict(start_step=1, kinds="attention"), r"`kinds` must be a non-empty list .* kinds='attention'"),
        (dict(start_step=1, kinds=("attention", "embedding")), r"kinds.*'embedding'"),
        (dict(start_step=1, print_fn=3), r"`print_fn` must be callable"),
    ],
)
def test_bad_arguments_name_what_was_received(kwargs, message):
    with pytest.raises(ValueError, match=message):
        LateDropout(**kwargs)


def test_a_model_without_those_dropouts_or_a_budget_is_refused_when_fit_starts():
    keras.utils.set_random_seed(0)
    plain = kt.build_transformer(tiny_config())
    kt.compile_transformer(plain, kt.TrainingConfig(warmup_steps=2), jit_compile=False)
    with pytest.raises(ValueError, match=r"nothing to delay: the model's attention, activation dropout rates are all 0"):
        fit(plain, *data(), callbacks=[LateDropout(start_step=1)])
    rsqrt = model_with_dropouts(decay="rsqrt")  # the paper's schedule has no total to take a share of
    with pytest.raises(ValueError, match=r"not a `?BudgetSchedule|Received: learning rate TransformerSchedule"):
        fit(rsqrt, *data(), callbacks=[LateDropout(start_fraction=0.5)])


def test_the_run_config_key_is_checked_and_adds_the_callback(tmp_path):
    from keras_transformer.train.run import _run_callbacks

    dropouts = dict(attention_dropout=0.1, activation_dropout=0.1)
    budget = dict(max_train_seconds=60, training={"decay": "cosine"})
    config = RunConfig(late_dropout_start=0.5, model=dropouts, **budget)
    callbacks = _run_callbacks(config, str(tmp_path), {}, tokenizer=None, print_fn=lambda line: None)
    late = [c for c in callbacks if isinstance(c, LateDropout)]
    assert len(late) == 1 and late[0].start_fraction == 0.5 and late[0].kinds == ("attention", "activation")
    assert not any(isinstance(c, LateDropout) for c in _run_callbacks(
        RunConfig(model=dropouts, **budget), str(tmp_path), {}, tokenizer=None, print_fn=lambda line: None))
    with pytest.raises(ValueError, match=r"only a budgeted \[training\] decay .* late_dropout_start=0.5, decay='rsqrt'"):
        RunConfig(late_dropout_start=0.5, model=dropouts)
    with pytest.raises(ValueError, match=r"both are 0: .* attention_dropout=0, activation_dropout=0"):
        RunConfig(late_dropout_start=0.5, **budget)
    with pytest.raises(ValueError, match=r"late_dropout_start"):
        RunConfig(late_dropout_start=1.5, model=dropouts, **budget)
