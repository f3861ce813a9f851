"""Gradient accumulation: N micro-batches make the update one batch of all N would make.

Each test builds the test-sized model twice from one seed and trains one copy on
micro-batches with `gradient_accumulation_steps=N`, the other on whole batches without;
the weights after the updates are compared. The micro-batches hold equal numbers of
real target tokens unless the test says otherwise (the loss is a mean over real tokens,
so only then is the mean of the micro-batch gradients the whole batch's gradient).
"""

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy

import keras_transformer as kt
from keras_transformer.special_tokens import BOS_ID, PAD_ID
from keras_transformer.train.accumulation import PerUpdateSchedule
from keras_transformer.train.compile import compile_transformer, make_optimizer
from keras_transformer.train.schedules import TransformerSchedule

ROWS, LENGTH = 4, 5  # a whole batch: 4 sentences of 5 real target tokens, no padding


def jit():
    """XLA costs more than it saves for a few tiny steps on TensorFlow; JAX needs its jit."""
    return "auto" if keras.backend.backend() == "jax" else False


def eager(model):
    """A few tiny steps run faster eagerly than traced on TensorFlow (PyTorch is eager
    anyway); JAX op by op is slower than its one compilation."""
    if keras.backend.backend() != "jax":
        model.run_eagerly = True
    return model


def batch(seed=0, pad_last_row_from=None):
    rng = np.random.default_rng(seed)
    labels = rng.integers(4, 32, (ROWS, LENGTH)).astype("int32")
    if pad_last_row_from is not None:
        labels[-1, pad_last_row_from:] = PAD_ID
    decoder = np.concatenate([np.full((ROWS, 1), BOS_ID, "int32"), labels[:, :-1]], axis=1)
    return {"encoder_inputs": rng.integers(4, 32, (ROWS, LENGTH)).astype("int32"), "decoder_inputs": decoder}, labels


def repeated(inputs, labels, times):
    return {key: np.concatenate([value] * times) for key, value in inputs.items()}, np.concatenate([labels] * times)


def fitted(compile_fn, inputs, labels, batch_size):
    keras.utils.set_random_seed(0)  # the same initial weights for every copy
    model = kt.build_transformer(tiny_config())
    compile_fn(model)
    eager(model)
    model.fit(inputs, labels, batch_size=batch_size, epochs=1, shuffle=False, verbose=0)
    return model


def weights(model):
    return [to_numpy(weight) for weight in model.weights]


def largest_difference(first, second):
    return max(float(np.max(np.abs(a - b))) for a, b in zip(first, second))


def test_accumulated_half_batches_give_the_update_of_whole_batches_through_compile_transformer():
    """The package's path: Adam on the warmup schedule, 3 updates of 2 half-batches each.

    Adam's epsilon is raised from the paper's 1e-9 for the comparison only: at 1e-9 an
    update is ~lr * sign(gradient), so float32 rounding in a gradient near zero flips
    its sign in one copy and not the other (a difference of 2 * lr, not of the method).
    """
    inputs, labels = repeated(*batch(), times=3)
    training = kt.TrainingConfig(warmup_steps=4, adam_epsilon=1e-3)
    whole = fitted(lambda m: compile_transformer(m, training, jit_compile=jit()), inputs, labels, ROWS)
    halves = fitted(
        lambda m: compile_transformer(m, training, jit_compile=jit(), gradient_accumulation_steps=2),
        inputs, labels, ROWS // 2,
    )
    keras.utils.set_random_seed(0)
    initial = weights(kt.build_transformer(tiny_config()))
    assert largest_difference(weights(whole), initial) > 0.05  # the updates moved the weights
    assert largest_difference(weights(halves), weights(whole)) < 2e-6
    # Three updates each: the schedule and Adam's bias correction counted updates, not batches.
    for model in (whole, halves):
        assert int(to_numpy(model.optimizer.iterations)) == 3
    assert float(to_numpy(halves.optimizer.learning_rate)) == float(to_numpy(whole.optimizer.learning_rate))


def test_unequal_token_counts_weigh_each_micro_batch_equally():
    """The documented limit: micro-batches of 10 and 7 real tokens weigh the same.

    With SGD (linear in the gradient, so the mean and not the sum shows), the
    accumulated update is the mean of the two single-batch updates from the same
    weights; one batch of both (a mean over its 17 tokens) differs from it.
    """
    inputs, labels = batch(seed=2, pad_last_row_from=2)  # the second half: 5 + 2 real tokens

    def sgd(steps):
        return lambda model: model.compile(
            optimizer=keras.optimizers.SGD(0.5, gradient_accumulation_steps=steps),
            loss=kt.LabelSmoothedCrossEntropy(), jit_compile=jit(),
        )

    halves = [{key: value[rows] for key, value in inputs.items()} for rows in (slice(0, 2), slice(2, 4))]
    alone = [weights(fitted(sgd(None), half, labels[rows], 2)) for half, rows in zip(halves, (slice(0, 2), slice(2, 4)))]
    expected = [(a + b) / 2 for a, b in zip(*alone)]
    accumulated = weights(fitted(sgd(2), inputs, labels, 2))
    whole = weights(fitted(sgd(None), inputs, labels, ROWS))
    assert largest_difference(accumulated, expected) < 1e-6
    assert largest_difference(accumulated, whole) > 1e-4


def test_steps_per_execution_does_not_change_accumulation():
    if keras.backend.backend() == "torch":
        pytest.skip("Keras' PyTorch trainer runs one step per execution (steps_per_execution must be 1)")
    inputs, labels = repeated(*batch(seed=3), times=2)
    training = kt.TrainingConfig(warmup_steps=4, adam_epsilon=1e-3, gradient_accumulation_steps=2)
    one = fitted(lambda m: compile_transformer(m, training, jit_compile=jit()), inputs, labels, 2)
    two = fitted(lambda m: compile_transformer(m, training, jit_compile=jit(), steps_per_execution=2), inputs, labels, 2)
    assert largest_difference(weights(one), weights(two)) < 1e-6
    assert int(to_numpy(two.optimizer.iterations)) == 2


def test_the_schedule_advances_once_per_update():
    schedule = make_optimizer(16, kt.TrainingConfig(warmup_steps=4, gradient_accumulation_steps=3))._learning_rate
    assert isinstance(schedule, PerUpdateSchedule)
    inner = TransformerSchedule(16, warmup_steps=4)
    # Keras calls the schedule with the batches seen: batches 0-2 are update 0, 3-5 update 1.
    got = [float(to_numpy(schedule(batch))) for batch in range(7)]
    want = [float(to_numpy(inner(update))) for update in (0, 0, 0, 1, 1, 1, 2)]
    assert got == want
    # Without accumulation the schedule is the paper's, unwrapped.
    assert isinstance(make_optimizer(16)._learning_rate, TransformerSchedule)
    restored = PerUpdateSchedule.from_config(schedule.get_config())
    assert float(to_numpy(restored(5))) == got[5]


def test_mixed_float16_wraps_the_accumulating_optimizer():
    """Loss scaling wraps the optimizer that accumulates: each micro-batch is unscaled first."""
    if keras.backend.backend() == "jax":
        import jax

        if jax.default_backend() == "cpu":
            pytest.skip("mixed_float16 cannot run on JAX on CPU (XLA:CPU has no float16 matmul)")
    model = compile_transformer(kt.build_transformer(tiny_config(dtype_policy="mixed_float16")), gradient_accumulation_steps=4)
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert model.optimizer.inner_optimizer.gradient_accumulation_steps == 4
    assert isinstance(model.optimizer.inner_optimizer._learning_rate, PerUpdateSchedule)


def test_a_compiled_model_with_accumulation_saves_and_loads(tmp_path):
    model = compile_transformer(kt.build_transformer(tiny_config()), gradient_accumulation_steps=2, jit_compile=jit())
    inputs, labels = batch()
    eager(model)
    model.train_on_batch({k: v[:2] for k, v in inputs.items()}, labels[:2])  # half an update
    path = str(tmp_path / "model.keras")
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    assert restored.optimizer.gradient_accumulation_steps == 2
    assert isinstance(restored.optimizer._learning_rate, PerUpdateSchedule)
    # The accumulated half-update travels with the optimizer's variables.
    assert int(to_numpy(restored.optimizer._iterations)) == 1
    saved = {v.path: to_numpy(v) for v in model.optimizer.variables}
    assert all(np.array_equal(saved[v.path], to_numpy(v)) for v in restored.optimizer.variables)


@pytest.mark.parametrize(
    "value, message",
    [
        (0, r"`gradient_accumulation_steps` must be a positive integer. Received: gradient_accumulation_steps=0"),
        (-2, r"`gradient_accumulation_steps` must be a positive integer. Received: gradient_accumulation_steps=-2"),
        (2.0, r"`gradient_accumulation_steps` must be of type int. Received: gradient_accumulation_steps=2.0"),
        (True, r"`gradient_accumulation_steps` must be of type int. Received: gradient_accumulation_steps=True"),
    ],
    ids=["zero", "negative", "float", "bool"],
)
def test_bad_accumulation_steps_are_refused_naming_the_value(value, message):
    with pytest.raises(ValueError, match=message):
        kt.TrainingConfig(gradient_accumulation_steps=value)
    with pytest.raises(ValueError, match=message):
        compile_transformer(kt.build_transformer(tiny_config()), gradient_accumulation_steps=value)
    from keras_transformer.train.run_config import RunConfig

    with pytest.raises(ValueError, match=r"\[training\]: " + message):
        RunConfig(training={"gradient_accumulation_steps": value})


def test_the_run_config_key_reaches_the_optimizer():
    from keras_transformer.train.run import build_and_compile
    from keras_transformer.train.run_config import RunConfig

    run = RunConfig(vocab_size=32).with_overrides(["training.gradient_accumulation_steps=3"])
    assert run.training_config().gradient_accumulation_steps == 3
    model = build_and_compile(run, run.model_config())
    assert model.optimizer.gradient_accumulation_steps == 3
    # A trained setting: a run interrupted under 1 does not resume under 3.
    assert ("training.gradient_accumulation_steps", 1, 3) in RunConfig(vocab_size=32).differences(run)
