"""Tests of the training callbacks: learning-rate log, keep-last-K, time budget, resume, BLEU."""

import csv
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_transformer.train import callbacks as kt_callbacks
from keras_transformer.model import directory as model_directory
from keras_transformer.train.callbacks import (
    StopOnInterrupt,
    StopOnNaN,
    BleuCallback,
    KeepLastCheckpoints,
    LearningRateLogger,
    SampleTranslations,
    TimeBudget,
    default_callbacks,
)

# Built the same way in this process and in the subprocess of the resume test: a small
# dense model on the Transformer's optimizer and schedule (the callbacks do not care
# what the model is, and it traces in a fraction of the time), 4 steps per epoch.
FIT_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import keras
    import keras_transformer as kt
    from keras_transformer.train.callbacks import default_callbacks
    from keras_transformer.train.compile import make_optimizer

    class RecordEpochs(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs = []
        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(epoch)

    class DieAfterFirstEpoch(keras.callbacks.Callback):
        # Placed after BackupAndRestore, so the backup of epoch 0 is on disk.
        def on_epoch_end(self, epoch, logs=None):
            os._exit(3)

    def fit(model_dir, die=False):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        model.compile(optimizer=make_optimizer(16, kt.TrainingConfig(warmup_steps=4)), loss="mse")
        x = np.arange(96, dtype="float32").reshape(32, 3) / 96
        recorder = RecordEpochs()
        callbacks = [recorder] + default_callbacks(model_dir, keep_checkpoints=5, tensorboard=False)
        if die:
            callbacks.append(DieAfterFirstEpoch())
        model.fit(x, x.sum(axis=1), batch_size=8, epochs=3, callbacks=callbacks, verbose=0, shuffle=False)
        return recorder.epochs, model

    if __name__ == "__main__":
        fit(sys.argv[1], die=True)
    """
)


def run_fit_script(tmp_path):
    script = tmp_path / "fit_script.py"
    script.write_text(FIT_SCRIPT)
    namespace = {"__name__": "fit_script"}
    exec(compile(FIT_SCRIPT, str(script), "exec"), namespace)
    return script, namespace["fit"]


def test_backup_and_restore_resumes_a_killed_run_at_the_next_epoch(tmp_path):
    model_dir = tmp_path / "run"
    script, fit = run_fit_script(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    killed = subprocess.run(
        [sys.executable, str(script), str(model_dir)], env=env, capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == 3, killed.stderr[-3000:]
    assert os.path.isdir(model_dir / model_directory.BACKUP_DIR)

    epochs, model = fit(str(model_dir))
    assert epochs == [1, 2]  # resumed at the second epoch, not the first
    # The optimizer state came back too: 4 steps per epoch, 3 epochs in all.
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 12
    with open(model_dir / model_directory.CSV_LOG_FILE) as file:
        rows = list(csv.DictReader(file))
    assert [row["epoch"] for row in rows] == ["0", "1", "2"]  # appended after the killed run's row
    checkpoints = sorted(os.listdir(model_dir / model_directory.CHECKPOINT_DIR))
    assert checkpoints == ["epoch_001.weights.h5", "epoch_002.weights.h5", "epoch_003.weights.h5"]
    assert not os.path.exists(model_dir / model_directory.BACKUP_DIR)


class _FakeOptimizerModel:
    def __init__(self, optimizer):
        self.optimizer = optimizer


def test_learning_rate_logger_logs_the_schedule_at_the_current_step():
    from keras_transformer.train.schedules import TransformerSchedule

    optimizer = keras.optimizers.Adam(TransformerSchedule(16, warmup_steps=4))
    optimizer.iterations.assign(8)
    logger = LearningRateLogger()
    logger.set_model(_FakeOptimizerModel(keras.optimizers.LossScaleOptimizer(optimizer)))
    logs = {"loss": 1.0}
    logger.on_epoch_end(0, logs)
    # Paper's step 9 (iteration 8): 16^-0.5 * min(9^-0.5, 9 * 4^-1.5) = 0.25 / 3.
    assert logs["learning_rate"] == pytest.approx(0.25 / 3)


def test_keep_last_checkpoints_deletes_older_files(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    directory = tmp_path / "checkpoints"
    keeper = KeepLastCheckpoints(str(directory), keep=2)
    model.fit(np.zeros((4, 2)), np.zeros((4, 1)), epochs=4, verbose=0, callbacks=[keeper])
    assert sorted(os.listdir(directory)) == ["epoch_003.weights.h5", "epoch_004.weights.h5"]
    with pytest.raises(ValueError, match="`keep` must be a positive integer. Received: keep=0"):
        KeepLastCheckpoints(str(directory), keep=0)


class _RecordWeights(keras.callbacks.Callback):
    """The weights after every batch, in order (placed before the checkpoint callback)."""

    def __init__(self):
        super().__init__()
        self.after_batch = []

    def on_train_batch_end(self, batch, logs=None):
        self.after_batch.append([np.array(w) for w in self.model.get_weights()])


def _fit_with_step_checkpoints(directory, keeper, accumulation=None, steps_per_execution=1):
    """3 epochs x 3 batches of one sample: SGD moves the weights at every update."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1, gradient_accumulation_steps=accumulation)
    model.compile(optimizer=optimizer, loss="mse", steps_per_execution=steps_per_execution)
    x = np.array([[1.0, 2.0], [3.0, -1.0], [0.5, 0.5]], "float32")
    y = np.array([[1.0], [-2.0], [4.0]], "float32")
    recorder = _RecordWeights()
    model.fit(x, y, batch_size=1, epochs=3, verbose=0, shuffle=False, callbacks=[recorder, keeper])
    return model, recorder.after_batch


def test_step_checkpoints_keep_the_last_k_and_average_to_their_weights(tmp_path):
    from keras_transformer.train.checkpoints import average_checkpoints, latest_checkpoints

    directory = tmp_path / "checkpoints"
    directory.mkdir()
    # Left by a killed process after steps this run trains again: deleted when fit starts.
    (directory / "step_0000050.weights.h5").write_text("a lost step")
    (directory / "notes.txt").write_text("not a checkpoint")
    keeper = KeepLastCheckpoints(str(directory), keep=3, every_steps=2)
    model, after_batch = _fit_with_step_checkpoints(directory, keeper)
    # 9 updates: checkpoints at 2, 4, 6, 8 (across epoch ends), the newest 3 kept.
    assert sorted(os.listdir(directory)) == [
        "notes.txt", "step_0000004.weights.h5", "step_0000006.weights.h5", "step_0000008.weights.h5"]
    paths = latest_checkpoints(directory, 3)
    average_checkpoints(model, paths)
    for i, averaged in enumerate(model.get_weights()):
        expected = np.mean([after_batch[step - 1][i] for step in (4, 6, 8)], axis=0)
        np.testing.assert_allclose(averaged, expected, rtol=1e-6)
    assert not np.allclose(after_batch[3][0], after_batch[7][0])  # the three differ: a real mean
    with pytest.raises(ValueError, match=r"`every_steps` must be an integer >= 0. Received: every_steps=-1"):
        KeepLastCheckpoints(str(directory), every_steps=-1)


def test_step_checkpoints_count_updates_with_gradient_accumulation(tmp_path):
    directory = tmp_path / "checkpoints"
    keeper = KeepLastCheckpoints(str(directory), keep=5, every_steps=2)
    _, after_batch = _fit_with_step_checkpoints(directory, keeper, accumulation=2)
    # 9 batches, 2 per update: updates at batches 2, 4, 6, 8 (the accumulator carries
    # over epoch ends); update 2 is batch 4 (epoch 2), update 4 is batch 8 (epoch 3).
    assert sorted(os.listdir(directory)) == ["step_0000002.weights.h5", "step_0000004.weights.h5"]
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    for name, batch in (("step_0000002.weights.h5", 4), ("step_0000004.weights.h5", 8)):
        model.load_weights(str(directory / name))
        for saved, expected in zip(model.get_weights(), after_batch[batch - 1]):
            np.testing.assert_array_equal(saved, expected)


@pytest.mark.skipif(
    keras.backend.backend() == "torch", reason="Keras allows steps_per_execution > 1 on TF and JAX only"
)
def test_step_checkpoints_with_several_steps_per_call_are_named_by_the_step_reached(tmp_path):
    directory = tmp_path / "checkpoints"
    keeper = KeepLastCheckpoints(str(directory), keep=5, every_steps=2)
    _fit_with_step_checkpoints(directory, keeper, steps_per_execution=2)
    # Calls of 2, 1 batches per epoch end at steps 2, 3 | 5, 6 | 8, 9: step 4 is seen at 5.
    assert sorted(os.listdir(directory)) == [
        "step_0000002.weights.h5", "step_0000005.weights.h5", "step_0000006.weights.h5", "step_0000008.weights.h5"]


def test_time_budget_stops_after_the_batch_that_spends_it():
    seen = []
    recorder = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: seen.append(batch))
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    budget = TimeBudget(1e-9)
    model.fit(np.zeros((8, 2)), np.zeros((8, 1)), batch_size=2, epochs=3, verbose=0,
              callbacks=[budget, recorder])
    assert seen == [0]
    assert budget.stopped_early
    with pytest.raises(ValueError, match="`seconds` must be a finite number > 0. Received: seconds=0"):
        TimeBudget(0)


PAIRS = [
    ("one two three four five", "eins zwei drei vier fuenf"),
    ("two three four five six", "zwei drei vier fuenf sechs"),
    ("three four five six seven", "drei vier fuenf sechs sieben"),
    ("four five six seven eight", "vier fuenf sechs sieben acht"),
]
REFERENCES = [reference for _, reference in PAIRS]


def test_bleu_callback_logs_sacrebleu_of_its_translations_on_schedule(monkeypatch):
    bleu = BleuCallback(PAIRS, tokenizer=None, every_n_epochs=2, num_samples=None)
    outputs = iter([REFERENCES, ["x y"] * 4, REFERENCES])
    monkeypatch.setattr(bleu, "_translate", lambda: next(outputs))
    bleu.on_train_begin()
    logged = []
    for epoch in range(4):
        logs = {}
        bleu.on_epoch_end(epoch, logs)
        logged.append(logs.get("val_bleu"))
    # Runs at the first epoch of the fit, then every second epoch (1-based 2 and 4).
    assert logged == [pytest.approx(100.0), 0.0, None, pytest.approx(100.0)]


def test_bleu_callback_samples_a_fixed_subset():
    first = BleuCallback(PAIRS, tokenizer=None, num_samples=2, seed=3)
    second = BleuCallback(PAIRS, tokenizer=None, num_samples=2, seed=3)
    assert first.pairs == second.pairs and len(first.pairs) == 2
    with pytest.raises(ValueError, match="every_n_epochs.*Received: every_n_epochs=0"):
        BleuCallback(PAIRS, tokenizer=None, every_n_epochs=0)


def test_sample_translations_prints_source_reference_and_output(monkeypatch):
    printed = []
    samples = SampleTranslations(PAIRS[:2], tokenizer=None, num_samples=2, print_fn=printed.append)
    monkeypatch.setattr(samples, "_translate", lambda: [REFERENCES[0], "drei"])
    samples.on_train_begin()
    samples.on_epoch_end(0, {})
    text = printed[0]
    assert "after epoch 1" in text
    assert f"source:    {PAIRS[0][0]}" in text and f"reference: {REFERENCES[0]}" in text
    assert f"output:  = {REFERENCES[0]}" in text
    assert "output:  x drei" in text


def test_default_callbacks_order_and_files(tmp_path):
    callbacks = default_callbacks(
        str(tmp_path), validation_pairs=PAIRS, tokenizer=object(), max_train_seconds=10
    )
    kinds = [type(c) for c in callbacks]
    expected = [
        StopOnInterrupt,
        TimeBudget,
        StopOnNaN,
        LearningRateLogger,
        BleuCallback,
        SampleTranslations,
        KeepLastCheckpoints,
        keras.callbacks.BackupAndRestore,
        keras.callbacks.CSVLogger,
    ]
    assert kinds[: len(expected)] == expected
    if kt_callbacks._tensorboard_installed():
        assert kinds[len(expected):] == [keras.callbacks.TensorBoard]
    # Without validation pairs and with checkpoints off, those callbacks are left out.
    kinds = [type(c) for c in default_callbacks(str(tmp_path), keep_checkpoints=0, tensorboard=False)]
    assert kinds == [
        StopOnInterrupt,
        StopOnNaN,
        LearningRateLogger,
        keras.callbacks.BackupAndRestore,
        keras.callbacks.CSVLogger,
    ]
    with pytest.raises(ValueError, match="`tokenizer` is required with `validation_pairs`"):
        default_callbacks(str(tmp_path), validation_pairs=PAIRS)
    keepers = [c for c in default_callbacks(str(tmp_path), checkpoint_every_steps=500, tensorboard=False)
               if isinstance(c, KeepLastCheckpoints)]
    assert [(k.keep, k.every_steps) for k in keepers] == [(5, 500)]


def test_a_nan_stop_names_the_likely_cause():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    x = np.ones((8, 3), "float32")
    y = np.full((8, 1), np.nan, "float32")  # NaN from the first batch on
    with pytest.warns(UserWarning, match=r"Training stopped at batch 0: the loss is nan\. .*outside \[0, vocab_size\)"):
        history = model.fit(x, y, batch_size=4, epochs=3, verbose=0, callbacks=[StopOnNaN()])
    assert len(history.history["loss"]) == 1  # stopped in the first epoch


def test_a_swallowed_interrupt_stops_fit_at_the_next_batch():
    """A Ctrl-C recorded but dropped (as inside a gc callback) ends `fit` after that batch."""
    from keras_transformer import interrupts

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    seen = []

    class SwallowAtSecondBatch(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            seen.append(batch)
            if batch == 1:
                try:
                    interrupts.handle_sigint()
                except KeyboardInterrupt:
                    pass  # what Python does with an exception raised in a gc callback

    x = np.zeros((8, 2), "float32")
    try:
        with pytest.raises(KeyboardInterrupt):
            model.fit(x, x[:, :1], batch_size=1, epochs=1, verbose=0,
                      callbacks=[SwallowAtSecondBatch(), StopOnInterrupt()])
    finally:
        interrupts.clear()
    assert seen == [0, 1]  # without the callback all 8 batches run
