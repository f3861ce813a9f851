"""The PyTorch training step captured once per batch shape (`train.torch_step`)."""

import keras
import numpy as np
import pytest

import keras_transformer as kt
from keras_transformer.train.compile import compile_transformer

pytestmark = pytest.mark.skipif(
    keras.backend.backend() != "torch", reason="the captured training step is the PyTorch backend's"
)

VOCAB = 64


def _batch(rng, batch, length):
    x = {
        "encoder_inputs": rng.integers(4, VOCAB, (batch, length)).astype("int32"),
        "decoder_inputs": rng.integers(4, VOCAB, (batch, length + 1)).astype("int32"),
    }
    return x, rng.integers(0, VOCAB, (batch, length + 1)).astype("int32")


def _train(batches, compiler, dropout=0.0):
    """Trains a seeded tiny model on `batches`; returns (logs, weights, step or None)."""
    from keras_transformer.train.torch_step import CapturedTrainStep

    keras.utils.set_random_seed(1)
    config = kt.TransformerConfig.from_preset("tiny", vocab_size=VOCAB).replace(dropout=dropout)
    model = compile_transformer(kt.Transformer(config), jit_compile=False)
    step = None if compiler == "keras" else CapturedTrainStep(model, compiler=compiler)
    model.captured_train_step = step
    logs = [model.train_on_batch(x, y, return_dict=True) for x, y in batches]
    return logs, [keras.ops.convert_to_numpy(v) for v in model.trainable_variables], step


def test_captured_step_equals_keras_eager_step_and_captures_each_shape_once():
    rng = np.random.default_rng(0)
    shape_a, shape_b = _batch(rng, 2, 5), _batch(rng, 3, 4)
    batches = [shape_a, shape_b, _batch(rng, 2, 5), shape_b]
    eager_logs, eager_weights, _ = _train(batches, "keras")
    logs, weights, step = _train(batches, None)
    assert step.captures == 2  # two shapes, each captured at its first batch, never again
    assert logs == eager_logs  # the same float32 ops in the same order: equal, not close
    for expected, actual in zip(eager_weights, weights):
        np.testing.assert_array_equal(actual, expected)


def test_captured_step_under_dynamo_does_not_recompile_after_warm_up():
    """Each shape's graph is compiled once; later batches of known shapes reuse it."""
    from torch._dynamo.utils import counters

    rng = np.random.default_rng(1)
    shapes = [_batch(rng, 2, 5), _batch(rng, 3, 4)]
    batches = shapes + [_batch(rng, 2, 5), _batch(rng, 3, 4), _batch(rng, 2, 5)]
    eager_logs, eager_weights, _ = _train(batches[:2], "keras")
    frames_before = counters["stats"]["unique_graphs"]
    # aot_eager runs dynamo and AOTAutograd as inductor does, without its C++ codegen
    # (minutes on this CPU); docs/benchmarks.md times inductor itself.
    logs, weights, step = _train(batches[:2], "aot_eager")
    # One graph per shape, and the optimizer's update (shape-free) once.
    assert counters["stats"]["unique_graphs"] - frames_before == 3
    assert step.optimizer_update.captures == 1
    for actual, expected in zip(logs, eager_logs):
        assert actual == pytest.approx(expected, rel=1e-6)
    for expected, actual in zip(eager_weights, weights):
        np.testing.assert_allclose(actual, expected, atol=1e-6)
    frames_after_warm_up = counters["stats"]["unique_graphs"]
    model_step = step
    for x, y in batches[2:]:
        model_step.model.train_on_batch(x, y)
    assert counters["stats"]["unique_graphs"] == frames_after_warm_up
    assert model_step.captures == 2
    assert model_step.optimizer_update.captures == 1


def test_dropout_differs_between_steps_in_the_captured_graph():
    """Dropout is drawn afresh each step inside the graph, not baked in at capture."""
    import torch

    rng = np.random.default_rng(2)
    x, y = _batch(rng, 2, 5)
    _, _, step = _train([(x, y)], None, dropout=0.5)
    graph = next(iter(step.graphs.graphs().values()))
    model = step.model
    x_t, y_t = keras.tree.map_structure(keras.ops.convert_to_tensor, (x, y))

    def loss_of_one_step():
        values = [
            [v.value for v in variables]
            for variables in (model.trainable_variables, model.non_trainable_variables, model.metrics_variables)
        ]
        with torch.no_grad():
            return float(graph(*values, x_t, y_t)[0])

    losses = {loss_of_one_step() for _ in range(4)}
    assert len(losses) == 4  # the same weights and batch, four different dropout masks


def test_fit_with_jit_compile_true_trains_as_keras_eager_fit():
    rng = np.random.default_rng(3)
    x, y = _batch(rng, 8, 5)
    config = kt.TransformerConfig.from_preset("tiny", vocab_size=VOCAB).replace(dropout=0.0)
    histories = {}
    for jit_compile in (False, True):
        keras.utils.set_random_seed(1)
        # compiled by $KERAS_TRANSFORMER_TORCH_COMPILER: aot_eager in the tests (conftest.py)
        model = compile_transformer(kt.Transformer(config), jit_compile=jit_compile)
        histories[jit_compile] = model.fit(x, y, batch_size=4, epochs=2, verbose=0, shuffle=False).history
    step = model.captured_train_step
    assert (step.captures, step.graphs.compiles, step.optimizer_update.captures) == (1, 1, 1)  # one shape: batches of 4
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 4
    for name, values in histories[False].items():
        assert histories[True][name] == pytest.approx(values, rel=1e-6), name


def test_capture_after_runs_keras_eager_step_until_a_shape_recurs():
    from keras_transformer.train.torch_step import CapturedTrainStep

    rng = np.random.default_rng(4)
    common, rare = _batch(rng, 2, 5), _batch(rng, 3, 4)
    batches = [common, rare, common, common, common]
    eager_logs, eager_weights, _ = _train(batches, "keras")
    keras.utils.set_random_seed(1)
    config = kt.TransformerConfig.from_preset("tiny", vocab_size=VOCAB).replace(dropout=0.0)
    model = compile_transformer(kt.Transformer(config), jit_compile=False)
    model.captured_train_step = step = CapturedTrainStep(model, capture_after=3)
    captures = []
    for x, y in batches:
        logs = model.train_on_batch(x, y, return_dict=True)
        captures.append(step.captures)
    assert captures == [0, 0, 0, 1, 1]  # the common shape at its 3rd batch; the rare one never
    assert logs == eager_logs[-1]
    for expected, variable in zip(eager_weights, model.trainable_variables):
        np.testing.assert_array_equal(keras.ops.convert_to_numpy(variable), expected)


def test_new_variables_drop_the_captured_graphs():
    """After `enable_lora` the step trains the new adapter weights, not the old graph's."""
    rng = np.random.default_rng(5)
    x, y = _batch(rng, 2, 5)
    _, _, step = _train([(x, y)], None)
    model = step.model
    assert step.captures == 1
    model.enable_lora(2)
    compile_transformer(model, jit_compile=False)  # Keras needs a new optimizer for new weights
    model.captured_train_step = step  # the same step object, which captured the old weights
    lora = [v for v in model.trainable_variables if "lora" in v.path]
    before = [keras.ops.convert_to_numpy(v).copy() for v in lora]
    model.train_on_batch(x, y)
    assert step.captures == 2
    assert any(not np.array_equal(keras.ops.convert_to_numpy(v), b) for v, b in zip(lora, before))


def test_default_jit_compile_captures_only_recurring_shapes_and_falls_back():
    from keras_transformer.train.torch_step import AUTO_CAPTURE_AFTER

    model = compile_transformer(kt.Transformer(kt.TransformerConfig.from_preset("tiny", vocab_size=VOCAB)))
    step = model.captured_train_step
    assert (step.graphs.compile, step.capture_after, step.graphs.strict) == (None, AUTO_CAPTURE_AFTER, False)
    assert step.optimizer_update is None
    # jit_compile=True: every shape captured and compiled at once, and a failure is an error.
    step = compile_transformer(model, jit_compile=True).captured_train_step
    assert (step.capture_after, step.graphs.strict, step.optimizer_update.graphs.strict) == (1, True, True)
    assert step.graphs.compile is not None
    assert compile_transformer(model, jit_compile=False).captured_train_step is None


def _train_with_optimizer(batches, compiled_update, **training):
    """A tiny model trained on `batches` by `TrainingConfig(**training)`'s optimizer.

    `compiled_update`: the step's forward graph runs as it is, and the optimizer's update
    either through Keras' `apply` (False) or captured and compiled (True; aot_eager, see above).
    """
    from keras_transformer.train.torch_optimizer_update import CompiledOptimizerUpdate
    from keras_transformer.train.torch_step import CapturedTrainStep

    keras.utils.set_random_seed(1)
    config = kt.TransformerConfig.from_preset("tiny", vocab_size=VOCAB).replace(dropout=0.0)
    model = compile_transformer(kt.Transformer(config), kt.TrainingConfig(**training), jit_compile=False)
    step = model.captured_train_step = CapturedTrainStep(model)
    if compiled_update:
        step.optimizer_update = CompiledOptimizerUpdate(model, compiler="aot_eager")
    logs = [model.train_on_batch(x, y, return_dict=True) for x, y in batches]
    weights = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables + model.optimizer.variables]
    return logs, weights, step


def test_compiled_optimizer_update_gives_keras_apply_weights():
    """The captured update is Keras' own arithmetic: decay, clipping, schedule, moments, step.

    Two optimizers in one process, one after the other: each compiled update runs its own
    graph, never the other's (their closures share one code object, and guards are off).
    """
    rng = np.random.default_rng(6)
    batches = [_batch(rng, 2, 5) for _ in range(4)]
    for training in ({}, {"weight_decay": 0.1, "clipnorm": 0.01, "warmup_steps": 2}):
        eager_logs, eager_weights, _ = _train_with_optimizer(batches, False, **training)
        logs, weights, step = _train_with_optimizer(batches, True, **training)
        assert step.optimizer_update.captures == 1
        for actual, expected in zip(logs, eager_logs):
            assert actual == pytest.approx(expected, rel=1e-6), training
        for actual, expected in zip(weights, eager_weights):  # weights, then Adam's moments and step
            np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-7, err_msg=str(training))


def test_optimizer_whose_update_branches_on_values_keeps_keras_apply():
    """Gradient accumulation applies every N-th step, a data-dependent branch: not captured."""
    from keras_transformer.train.torch_optimizer_update import untraceable_reason

    rng = np.random.default_rng(7)
    batches = [_batch(rng, 2, 5) for _ in range(4)]
    eager_logs, eager_weights, _ = _train_with_optimizer(batches, False, gradient_accumulation_steps=2)
    logs, weights, step = _train_with_optimizer(batches, True, gradient_accumulation_steps=2)
    assert "every N-th step" in untraceable_reason(step.model.optimizer)
    assert step.optimizer_update.captures == 0
    assert logs == eager_logs
    for actual, expected in zip(weights, eager_weights):
        np.testing.assert_array_equal(actual, expected)
    loss_scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam())
    assert "not finite" in untraceable_reason(loss_scaled)


def test_mixed_bfloat16_captured_step_with_compiled_update_trains_as_keras_eager():
    """The GPU recipe's policy: bfloat16 layers, float32 weights, Adam and loss."""
    from keras_transformer.train.torch_optimizer_update import CompiledOptimizerUpdate
    from keras_transformer.train.torch_step import CapturedTrainStep

    rng = np.random.default_rng(8)
    batches = [_batch(rng, 2, 5) for _ in range(3)]
    results = {}
    for captured in (False, True):
        keras.utils.set_random_seed(1)
        config = kt.TransformerConfig.from_preset("tiny", vocab_size=VOCAB).replace(
            dropout=0.0, dtype_policy="mixed_bfloat16"
        )
        model = compile_transformer(kt.Transformer(config), jit_compile=False)
        if captured:
            step = model.captured_train_step = CapturedTrainStep(model)
            step.optimizer_update = CompiledOptimizerUpdate(model, compiler="aot_eager")
        logs = [model.train_on_batch(x, y, return_dict=True) for x, y in batches]
        results[captured] = logs, [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    assert (step.captures, step.optimizer_update.captures) == (1, 1)
    assert {str(v.dtype) for v in step.model.trainable_variables} == {"float32"}
    for actual, expected in zip(results[True][0], results[False][0]):
        assert actual == pytest.approx(expected, rel=1e-5)
    for actual, expected in zip(results[True][1], results[False][1]):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-6)


def test_forced_train_function_recaptures_the_schedule_a_callback_changed():
    """`StepBudgetEstimator` sets the schedule's `total_steps` (a Python number the compiled
    update baked in), then forces a new train function: the update must use the new total."""
    from keras_transformer.train.budget_estimate import budget_schedule_of
    from keras_transformer.train.torch_optimizer_update import CompiledOptimizerUpdate
    from keras_transformer.train.torch_step import CapturedTrainStep

    rng = np.random.default_rng(9)
    batches = [_batch(rng, 2, 5) for _ in range(4)]
    results = {}
    for compiled in (False, True):
        keras.utils.set_random_seed(1)
        config = kt.TransformerConfig.from_preset("tiny", vocab_size=VOCAB).replace(dropout=0.0)
        training = kt.TrainingConfig(warmup_steps=2, decay="linear", total_steps=1000)
        model = compile_transformer(kt.Transformer(config), training, jit_compile=False)
        step = model.captured_train_step = CapturedTrainStep(model)
        if compiled:
            step.optimizer_update = CompiledOptimizerUpdate(model, compiler="aot_eager")
        for index, (x, y) in enumerate(batches):
            if index == 2:  # what the estimator does: from near the peak to the floor at once
                budget_schedule_of(model.optimizer)[0].total_steps = 3
                model.make_train_function(force=True)
            model.train_on_batch(x, y)
        results[compiled] = [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    for actual, expected in zip(results[True], results[False]):
        np.testing.assert_allclose(actual, expected, rtol=1e-5, atol=1e-7)
    assert step.optimizer_update.captures == 2  # once, then again after the forced rebuild


def test_compile_graph_keeps_dynamo_guards_where_pytorch_cannot_isolate_them(monkeypatch):
    """Without `isolate_recompiles` guards stay on: a new shape recompiles instead of misrunning."""
    import torch

    from keras_transformer import torch_capture

    monkeypatch.setattr(torch_capture, "_can_drop_guards", lambda: False)

    def double(x):
        return x * 2

    compiled = torch_capture.compile_graph(double, "aot_eager")
    np.testing.assert_array_equal(compiled(torch.ones(2)).numpy(), [2.0, 2.0])
    np.testing.assert_array_equal(compiled(torch.arange(3.0)).numpy(), [0.0, 2.0, 4.0])


def test_inductor_builds_the_step_jit_compile_true_runs():
    """The suite's one inductor build (every other compiled test runs aot_eager, see conftest.py):
    the smallest model, so that its kernels build in seconds, trains as Keras' eager step."""
    from keras_transformer.train.torch_step import CapturedTrainStep

    config = kt.TransformerConfig.from_preset("tiny", vocab_size=VOCAB).replace(
        d_model=8, num_heads=2, d_ff=16, num_encoder_layers=1, num_decoder_layers=1, dropout=0.0, max_length=8
    )
    rng = np.random.default_rng(10)
    batches = [_batch(rng, 2, 3) for _ in range(2)]
    results = {}
    for compiler in (None, "inductor"):
        keras.utils.set_random_seed(1)
        model = compile_transformer(kt.Transformer(config), jit_compile=False)
        if compiler is not None:
            model.captured_train_step = step = CapturedTrainStep(model, compiler=compiler, strict=True)
        logs = [model.train_on_batch(x, y, return_dict=True) for x, y in batches]
        results[compiler] = logs, [keras.ops.convert_to_numpy(v) for v in model.trainable_variables]
    assert (step.captures, step.graphs.compiles, step.optimizer_update.captures) == (1, 1, 1)
    for actual, expected in zip(results["inductor"][0], results[None][0]):
        assert actual == pytest.approx(expected, rel=1e-5)
    for actual, expected in zip(results["inductor"][1], results[None][1]):
        np.testing.assert_allclose(actual, expected, rtol=1e-4, atol=1e-5)  # Adam moves ~0 weights by ~lr
