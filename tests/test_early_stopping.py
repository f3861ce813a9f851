"""Early stopping: stop after `patience` epochs without improvement, keep the best epoch.

The monitored values are set by a callback that writes them into the epoch's logs (as
`BleuCallback` writes `val_bleu`), so each test knows which epoch is best; the model is
a small dense one (the callback does not care what the model is, and it trains in a
fraction of a second), and each epoch's weights are recorded to compare exactly.
"""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

from keras_transformer.model import directory as model_directory
from keras_transformer.train.callbacks import ResumableEarlyStopping, default_callbacks

# Shared by this process and the subprocess of the resume test.
FIT_SCRIPT = textwrap.dedent(
    """
    import os, sys
    import numpy as np
    import keras
    from keras_transformer.train.callbacks import default_callbacks

    # val_loss per epoch: the best is epoch 3 (0-based); with patience 2 the run stops
    # after epoch 5, having trained 6 epochs of the 8 it was given.
    VALUES = [3.0, 2.0, 2.5, 1.5, 1.6, 1.7, 1.8, 1.9]

    class Monitor(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.epochs, self.weights = [], {}
        def on_epoch_end(self, epoch, logs=None):
            logs["val_loss"] = VALUES[epoch]
            self.epochs.append(epoch)
            self.weights[epoch] = self.model.get_weights()

    class DieAfter(keras.callbacks.Callback):
        # Placed after BackupAndRestore, so the backup of that epoch is on disk.
        def __init__(self, epoch):
            super().__init__()
            self.epoch = epoch
        def on_epoch_end(self, epoch, logs=None):
            if epoch == self.epoch:
                os._exit(3)

    def fit(model_dir, die_after=None, epochs=8):
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        x = np.arange(96, dtype="float32").reshape(32, 3) / 96
        monitor = Monitor()
        callbacks = [monitor] + default_callbacks(
            model_dir, keep_checkpoints=10, tensorboard=False, early_stopping_patience=2)
        for callback in callbacks:
            if isinstance(callback, keras.callbacks.BackupAndRestore):
                callback.delete_checkpoint = False  # as run_training: finish_run deletes it
        if die_after is not None:
            callbacks.append(DieAfter(die_after))
        model.fit(x, x.sum(axis=1), batch_size=8, epochs=epochs, callbacks=callbacks, verbose=0, shuffle=False)
        return monitor, model, callbacks

    if __name__ == "__main__":
        fit(sys.argv[1], die_after=int(sys.argv[2]))
    """
)


def load_fit(tmp_path):
    script = tmp_path / "fit_script.py"
    script.write_text(FIT_SCRIPT)
    namespace = {"__name__": "fit_script"}
    exec(compile(FIT_SCRIPT, str(script), "exec"), namespace)
    return script, namespace["fit"]


class SetMonitor(keras.callbacks.Callback):
    """Writes `values[epoch]` into the logs as `name`, and records each epoch's weights."""

    def __init__(self, name, values):
        super().__init__()
        self.name, self.values, self.weights = name, values, {}

    def on_epoch_end(self, epoch, logs=None):
        if self.values[epoch] is not None:
            logs[self.name] = self.values[epoch]
        self.weights[epoch] = self.model.get_weights()


def small_fit(callbacks, epochs):
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    x = np.arange(48, dtype="float32").reshape(16, 3) / 48
    history = model.fit(x, x.sum(axis=1), batch_size=8, epochs=epochs, callbacks=callbacks, verbose=0)
    return model, history


def same_weights(first, second):
    return len(first) == len(second) and all(np.array_equal(a, b) for a, b in zip(first, second))


def test_stops_after_patience_epochs_without_improvement_and_keeps_the_best_epoch():
    # val_bleu, higher is better: best at epoch 1; 15 and 19.9 do not beat 20 (+ min_delta 0.5)
    # nor does 20.4, so the run stops after epoch 4 with patience 3.
    monitor = SetMonitor("val_bleu", [10.0, 20.0, 15.0, 19.9, 20.4, 30.0, 31.0])
    stopping = ResumableEarlyStopping("val_bleu", patience=3, min_delta=0.5)
    model, history = small_fit([monitor, stopping], epochs=7)
    assert len(history.history["loss"]) == 5
    assert (stopping.stopped_epoch, stopping.best_epoch, stopping.best) == (4, 1, 20.0)
    assert same_weights(model.get_weights(), monitor.weights[1])
    assert not same_weights(model.get_weights(), monitor.weights[4])


def test_val_loss_is_minimized_and_epochs_without_a_value_do_not_count():
    # BLEU or loss computed every other epoch: the epochs without a value are skipped.
    monitor = SetMonitor("val_loss", [2.0, None, 1.0, None, 1.5, None, 1.2, None, 0.5])
    stopping = ResumableEarlyStopping("val_loss", patience=2)
    model, history = small_fit([monitor, stopping], epochs=9)
    assert len(history.history["loss"]) == 7 and stopping.best_epoch == 2
    assert same_weights(model.get_weights(), monitor.weights[2])


def test_running_out_of_epochs_also_restores_the_best_epoch():
    monitor = SetMonitor("val_loss", [2.0, 1.0, 1.5])
    stopping = ResumableEarlyStopping("val_loss", patience=5)
    model, _ = small_fit([monitor, stopping], epochs=3)
    assert stopping.stopped_epoch == 0
    assert same_weights(model.get_weights(), monitor.weights[1])


def test_a_killed_run_resumes_with_its_best_epoch_and_loses_no_checkpoint(tmp_path):
    model_dir = tmp_path / "run"
    script, fit = load_fit(tmp_path)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # Killed after epoch 4: the best (epoch 3) and one epoch without improvement are behind it.
    killed = subprocess.run(
        [sys.executable, str(script), str(model_dir), "4"], env=env, capture_output=True, text=True, timeout=300
    )
    assert killed.returncode == 3, killed.stderr[-3000:]
    backup = model_dir / model_directory.BACKUP_DIR
    assert ResumableEarlyStopping.STATE_FILE in os.listdir(backup)

    monitor, model, _ = fit(str(model_dir))
    assert monitor.epochs == [5]  # resumed after epoch 4, and stopped after one more epoch
    checkpoints = sorted(os.listdir(model_dir / model_directory.CHECKPOINT_DIR))
    assert checkpoints == [model_directory.CHECKPOINT_PATTERN.format(epoch=e) for e in range(1, 7)]
    # The best epoch was trained by the killed process: its weights come from its state.
    best = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    best.load_weights(str(model_dir / model_directory.CHECKPOINT_DIR / "epoch_004.weights.h5"))
    assert same_weights(model.get_weights(), best.get_weights())
    last = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4), keras.layers.Dense(1)])
    last.load_weights(str(model_dir / model_directory.CHECKPOINT_DIR / "epoch_006.weights.h5"))
    assert not same_weights(model.get_weights(), last.get_weights())  # each checkpoint is its own epoch

    # Killed again after it stopped (while saving, say): run_training's fit trains no
    # more epochs (epochs = the stopped epoch + 1) and the model gets the best weights.
    stopping = ResumableEarlyStopping("val_loss", patience=2, state_dir=str(backup))
    assert stopping.saved_stopped_epoch() == 5
    monitor, again, callbacks = fit(str(model_dir), epochs=stopping.saved_stopped_epoch() + 1)
    assert monitor.epochs == []
    assert same_weights(again.get_weights(), best.get_weights())
    restored = next(c for c in callbacks if isinstance(c, ResumableEarlyStopping))
    assert restored.stopped_epoch == 5 and restored.best_epoch == 3


def test_a_redone_epoch_replaces_its_value_and_the_runner_up_is_kept(tmp_path):
    """A kill between the early-stopping write and the backup makes the run redo an epoch."""
    state = tmp_path / "backup"
    monitor = SetMonitor("val_loss", [2.0, 1.0, 0.5])
    small_fit([monitor, ResumableEarlyStopping("val_loss", patience=3, state_dir=str(state))], epochs=3)
    # The epoch 2 of the killed run was the best; redone, it is worse than epoch 1.
    redo = SetMonitor("val_loss", [None, None, 1.8])
    stopping = ResumableEarlyStopping("val_loss", patience=3, state_dir=str(state))
    model, _ = small_fit([redo, stopping], epochs=3)
    assert stopping.values == {0: 2.0, 1: 1.0, 2: 1.8} and stopping.best_epoch == 1
    assert same_weights(model.get_weights(), monitor.weights[1])


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"early_stopping_patience": -1}, r"`early_stopping_patience` must be an integer >= 0. Received: early_stopping_patience=-1"),
        ({"early_stopping_patience": 2, "early_stopping_monitor": "bleu"}, r"`early_stopping_monitor` must be one of \('val_loss', 'val_bleu'\). Received: early_stopping_monitor='bleu'"),
        ({"early_stopping_min_delta": -0.1}, r"`early_stopping_min_delta` must be a finite number >= 0. Received: early_stopping_min_delta=-0.1"),
        ({"early_stopping_patience": 2, "validation_split": ""}, r"Early stopping watches the validation split: set `validation_split`"),
        ({"early_stopping_patience": 2, "early_stopping_monitor": "val_bleu", "bleu_every_epochs": 0}, r"early_stopping_monitor='val_bleu' reads the BLEU callback's score: set bleu_every_epochs > 0"),
    ],
    ids=["negative_patience", "unknown_monitor", "negative_min_delta", "no_validation_split", "val_bleu_without_bleu"],
)
def test_bad_early_stopping_settings_are_refused_with_the_config(changes, message):
    from keras_transformer.train.run_config import RunConfig

    with pytest.raises(ValueError, match=message):
        RunConfig(**changes)
    with pytest.raises(ValueError, match=message):
        RunConfig().with_overrides([f"{key}={value}" for key, value in changes.items()])


def test_callback_arguments_are_checked(tmp_path):
    with pytest.raises(ValueError, match=r"`patience` must be a positive integer. Received: patience=0"):
        ResumableEarlyStopping("val_loss", patience=0)
    with pytest.raises(ValueError, match=r"`monitor` must be one of \('val_loss', 'val_bleu'\)"):
        ResumableEarlyStopping("loss")
    with pytest.raises(ValueError, match="early_stopping_monitor='val_bleu' needs the BLEU callback"):
        default_callbacks(tmp_path, early_stopping_patience=2, early_stopping_monitor="val_bleu")


def test_run_config_keys_reach_the_callbacks_and_may_change_on_resume(tmp_path):
    from keras_transformer.train.run import _run_callbacks
    from keras_transformer.train.run_config import RESUMABLE_CHANGES, RunConfig

    run = RunConfig(bleu_every_epochs=0, sample_translations=0).with_overrides(
        ["early_stopping_patience=4", "early_stopping_min_delta=0.25"]
    )
    callbacks = _run_callbacks(run, str(tmp_path), {"validation": [("a", "b")]}, tokenizer=object())
    names = [type(c).__name__ for c in callbacks]
    # After the checkpoints (each holds its own epoch), before the backup (never behind it).
    assert names.index("KeepLastCheckpoints") < names.index("ResumableEarlyStopping") < names.index("BackupAndRestore")
    stopping = callbacks[names.index("ResumableEarlyStopping")]
    assert (stopping.monitor, stopping.patience, abs(stopping.min_delta)) == ("val_loss", 4, 0.25)
    assert stopping.state_dir == os.path.join(str(tmp_path), model_directory.BACKUP_DIR)
    assert {"early_stopping_patience", "early_stopping_monitor", "early_stopping_min_delta"} <= RESUMABLE_CHANGES
