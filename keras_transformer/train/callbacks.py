"""Training callbacks: logs, checkpoints that keep the last K, resuming, BLEU, samples.

`default_callbacks(model_dir, ...)` is the set a training run uses, in the order that
matters: callbacks that add values to the epoch's `logs` (learning rate, validation
BLEU) come before the ones that write `logs` out (CSV, TensorBoard), because Keras
hands every callback the same dict in list order.
"""

import importlib.util
import json
import math
import os
import random
import time
import warnings

import keras

from keras_transformer.model import directory as model_directory
from keras_transformer.atomic import atomic_path, save_weights_atomically, write_text_atomically
from keras_transformer.train.accumulation import applied_updates
from keras_transformer.train.checkpoints import (
    STEP_CHECKPOINT_PATTERN,
    prune_checkpoints,
    remove_step_checkpoints_after,
    weights_are_finite,
)
from keras_transformer import checks, interrupts
from keras_transformer.inference.decoding import BEAM_SIZE
from keras_transformer.inference.evaluation import score_translations
from keras_transformer.train.losses import NAN_LOSS_HINT


class StopOnNaN(keras.callbacks.TerminateOnNaN):
    """Keras' `TerminateOnNaN`, saying what a NaN loss usually means in this package.

    Inside compiled steps a label or token id outside the vocabulary cannot raise; the
    loss and the token embedding turn it into NaN on purpose, and this stop is where the
    run says so, instead of Keras' bare "Invalid loss, terminating training".
    """

    def on_batch_end(self, batch, logs=None):
        stopped = self.model.stop_training
        super().on_batch_end(batch, logs)
        if self.model.stop_training and not stopped:
            warnings.warn(f"Training stopped at batch {batch}: the loss is {logs.get('loss')}. {NAN_LOSS_HINT}")


class LearningRateLogger(keras.callbacks.Callback):
    """Adds the optimizer's current learning rate to the epoch logs as `learning_rate`.

    The value is the schedule at the optimizer's iteration count when the epoch ends
    (the rate of the next update), read through a `LossScaleOptimizer` if there is
    one. Put it before `CSVLogger` / `TensorBoard` so they record it.

    Example:

    ```python
    model.fit(batches, callbacks=[LearningRateLogger(), keras.callbacks.CSVLogger("log.csv")])
    ```
    """

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = current_learning_rate(self.model.optimizer)


def current_learning_rate(optimizer):
    """The learning rate the optimizer applies at its current iteration, as a float."""
    return float(keras.ops.convert_to_numpy(optimizer.learning_rate))


class TimeBudget(keras.callbacks.Callback):
    """Stops training once `seconds` of wall-clock time have passed since `fit` began.

    Checked after every batch, so training stops within one step of the budget; the
    epoch then ends as usual (validation, checkpoint, logs). Also checked at the end
    of each epoch, so that a budget spent exactly then does not start another one.

    Args:
        seconds: float > 0, the budget.

    Attributes:
        stopped_early: bool, whether the budget ended training.
    """

    def __init__(self, seconds):
        super().__init__()
        checks.check_positive_number("seconds", seconds)
        self.seconds = float(seconds)
        self.stopped_early = False
        self._start = None

    def on_train_begin(self, logs=None):
        self._start = time.monotonic()
        self.stopped_early = False

    def _check(self):
        if time.monotonic() - self._start >= self.seconds:
            self.model.stop_training = True
            self.stopped_early = True

    def on_train_batch_end(self, batch, logs=None):
        self._check()

    def on_epoch_end(self, epoch, logs=None):
        self._check()


class KeepLastCheckpoints(keras.callbacks.Callback):
    """Saves the weights every epoch (or every N updates) and deletes all but the newest `keep` files.

    Keras' `ModelCheckpoint` never deletes and writes in place; the paper averages the
    last 5 (base) or 20 (big) checkpoints (section 6.1), so only those are kept, and
    each is written to a temporary file and renamed, so a crash mid-write never leaves
    a truncated newest checkpoint. An epoch whose loss or weights are not finite (a run
    stopped by TerminateOnNaN still ends its epoch) is not saved: the newest checkpoint
    is always the last good one. Files are `directory/epoch_001.weights.h5`, ...
    (1-based epochs).

    With `every_steps` N > 0, a checkpoint is written instead whenever the optimizer's
    update count (`optimizer.iterations`: with gradient accumulation, updates, not
    batches) reaches a multiple of N, named by that count:
    `directory/step_0000500.weights.h5`, ... (zero-padded, so the names sort as the
    steps do; `latest_checkpoints` orders by the number). Checked after each call of the
    train function, so with `steps_per_execution` k the count may have passed the
    multiple by up to k - 1 updates, and the name says the count it was saved at. The
    paper's checkpoints were 10 minutes apart: with a few long epochs, per-epoch
    checkpoints span much more of the run than the last minutes. When `fit` starts from
    an earlier step (a run resumed from its last epoch's backup), step checkpoints beyond
    that step, written by the killed process after the backup, are deleted: they belong
    to steps that are trained again.

    Args:
        directory: str, where the files go (created if needed).
        keep: int >= 1, how many of the newest files to keep.
        every_steps: int >= 0, updates between checkpoints; 0 (default): one per epoch.

    Raises:
        ValueError: `keep` < 1 or `every_steps` < 0, naming the value.

    Example:

    ```python
    keeper = KeepLastCheckpoints("run/checkpoints", keep=5, every_steps=500)
    model.fit(batches, epochs=10, callbacks=[keeper])  # step_0000500.weights.h5, ...
    ```
    """

    def __init__(self, directory, keep=5, every_steps=0):
        super().__init__()
        checks.check_positive_int("keep", keep)
        checks.check_non_negative_int("every_steps", every_steps)
        self.directory = directory
        self.keep = keep
        self.every_steps = every_steps
        self._fit_started = False

    def on_train_begin(self, logs=None):
        self._fit_started = True

    def on_epoch_begin(self, epoch, logs=None):
        if not self.every_steps:
            return
        # The model's state is in place at an epoch's start on every backend (on JAX,
        # reading it mid-epoch syncs it): read the update count here, and mid-epoch only
        # when a multiple of every_steps may have been reached.
        optimizer = self.model.optimizer
        self._updates_at_epoch_start = applied_updates(optimizer)
        inner = getattr(optimizer, "inner_optimizer", optimizer)
        self._accumulation = inner.gradient_accumulation_steps or 1
        self._next_checkpoint = (self._updates_at_epoch_start // self.every_steps + 1) * self.every_steps
        if self._fit_started:
            self._fit_started = False
            remove_step_checkpoints_after(self.directory, self._updates_at_epoch_start)

    def on_train_batch_end(self, batch, logs=None):
        if not self.every_steps:
            return
        # The most updates `batch + 1` batches can have made this epoch (the accumulator
        # may have been part-full at its start); the exact count is read only beyond it.
        most = self._updates_at_epoch_start + (self._accumulation + batch) // self._accumulation
        if most < self._next_checkpoint:
            return
        updates = applied_updates(self.model.optimizer)
        if updates < self._next_checkpoint:
            return
        self._next_checkpoint = (updates // self.every_steps + 1) * self.every_steps
        self._save(STEP_CHECKPOINT_PATTERN.format(step=updates), logs, f"Step {updates}")

    def on_epoch_end(self, epoch, logs=None):
        if not self.every_steps:
            self._save(model_directory.CHECKPOINT_PATTERN.format(epoch=epoch + 1), logs, f"Epoch {epoch + 1}")

    def _save(self, name, logs, what):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            warnings.warn(f"{what} ended with loss={loss}; its weights are not checkpointed.")
            return
        if not weights_are_finite(self.model):
            warnings.warn(f"{what} ended with non-finite weights; they are not checkpointed.")
            return
        os.makedirs(self.directory, exist_ok=True)
        save_weights_atomically(self.model, os.path.join(self.directory, name))
        prune_checkpoints(self.directory, self.keep)


# What early stopping can watch, and which way is better: the validation loss (Keras'
# own, from `validation_data`) or the validation BLEU that `BleuCallback` logs.
EARLY_STOPPING_MODES = {"val_loss": "min", "val_bleu": "max"}
EARLY_STOPPING_MONITORS = tuple(EARLY_STOPPING_MODES)


class ResumableEarlyStopping(keras.callbacks.EarlyStopping):
    """Keras' `EarlyStopping(restore_best_weights=True)`, whose state survives a kill.

    Stops training once `patience` epochs in a row have not improved `monitor`
    (`"val_loss"`, lower is better, or `"val_bleu"`, higher is better, as logged by
    `BleuCallback`) by more than `min_delta`, and when training ends (stopped early, out
    of epochs or out of time) sets the model's weights to those of the best epoch, as
    Keras does. Epochs where the monitor is absent (BLEU is computed every
    `bleu_every_epochs`) do not count.

    Keras keeps the monitored values and the best weights in memory, so a run killed and
    resumed by `BackupAndRestore` would forget its best epoch. Given `state_dir`, this
    writes them there after every epoch: `early_stopping.json` (each epoch's value) and
    the best epoch's weights (`early_stopping_best_NNN.npz`, atomically), and reads them
    back when `fit` starts. `default_callbacks` puts it in `backup/`, the resume state
    `run_training` deletes once the run is saved, and before `BackupAndRestore`, so the
    state is never behind the backup. A kill between the two writes makes the resumed
    run train that epoch again; its new value replaces the old, and the weights of the
    best epoch before it are kept too, so whichever is best then is restored.

    Args:
        monitor: `"val_loss"` (default) or `"val_bleu"`.
        patience: int >= 1, epochs without improvement before training stops.
        min_delta: float >= 0, the least change that counts as an improvement. Default 0.
        state_dir: optional str, where the state is kept across a kill; None keeps it
            in memory only, as Keras does.
        verbose: int, 1 prints when it stops and which epoch it restores. Default 0.

    Attributes:
        best_epoch: int, the 0-based epoch of the best value so far.
        stopped_epoch: int, the epoch after which it stopped training (0 if it did not).

    Example:

    ```python
    stopping = ResumableEarlyStopping("val_bleu", patience=3, state_dir="run/backup")
    model.fit(batches, validation_data=valid, epochs=50, callbacks=[bleu, stopping])
    ```
    """

    STATE_FILE = "early_stopping.json"
    _WEIGHTS_PATTERN = "early_stopping_best_{epoch:03d}.npz"

    def __init__(self, monitor="val_loss", patience=3, min_delta=0.0, state_dir=None, verbose=0):
        checks.check_choice("monitor", monitor, EARLY_STOPPING_MONITORS)
        checks.check_positive_int("patience", patience)
        checks.check_non_negative_number("min_delta", min_delta)
        super().__init__(
            monitor=monitor,
            patience=patience,
            min_delta=min_delta,
            mode=EARLY_STOPPING_MODES[monitor],
            restore_best_weights=True,
            verbose=verbose,
        )
        self._set_monitor_op()  # the mode is explicit, so this needs no model
        self.state_dir = None if state_dir is None else os.fspath(state_dir)
        self.values = {}  # epoch -> the monitored value
        self._best_weights_by_epoch = {}  # the best epoch's weights, and the runner-up's

    # ------------------------------------------------------------ Keras' hooks
    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self.values, self._best_weights_by_epoch = self._read_state()
        self._update()
        if self.values and self.wait >= self.patience and max(self.values) > 0:
            self.stopped_epoch = max(self.values)  # a resumed run that had stopped
        if self.best is not None and self.best_weights is None:
            warnings.warn(
                f"Early stopping: the weights of the best epoch ({self.best_epoch + 1}) were not "
                f"found in {self.state_dir}; the final weights will be kept."
            )

    def on_epoch_end(self, epoch, logs=None):
        if self.values and self.monitor not in (logs or {}):
            return  # seen before: computed every few epochs (bleu_every_epochs), not missing
        current = self.get_monitor_value(logs)
        if current is None:
            return
        current = float(current)
        if not math.isfinite(current):
            warnings.warn(f"Early stopping: {self.monitor}={current} at epoch {epoch + 1}; not counted.")
            return
        self.values[epoch] = current
        self._update()
        if self.best_epoch == epoch:
            # The runner-up is what a redone epoch (after a kill) may fall back to.
            runner_up = self._best_of({e: v for e, v in self.values.items() if e != epoch})[1]
            kept = {e: w for e, w in self._best_weights_by_epoch.items() if e == runner_up}
            self._best_weights_by_epoch = {**kept, epoch: self.model.get_weights()}
            self.best_weights = self._best_weights_by_epoch[epoch]
        if self.wait >= self.patience and epoch > 0:
            self.stopped_epoch = epoch
            self.model.stop_training = True
        self._write_state(new_best=self.best_epoch == epoch)

    # ---------------------------------------------------------------- state
    def saved_stopped_epoch(self):
        """The epoch after which a run with this `state_dir` stopped, or None.

        `run_training` reads it before `fit`: a run killed after it stopped early
        (while saving) resumes with no epoch left to train.
        """
        values, _ = self._read_state(weights=False)
        best, best_epoch, wait = self._best_of(values, with_wait=True)
        if best is not None and wait >= self.patience and max(values) > 0:
            return max(values)
        return None

    def _update(self):
        self.best, self.best_epoch, self.wait = self._best_of(self.values, with_wait=True)
        if self.best is None:
            self.best_epoch = 0
        self.best_weights = self._best_weights_by_epoch.get(self.best_epoch)

    def _best_of(self, values, with_wait=False):
        """(best value, its epoch, epochs since it) over `{epoch: value}`, as Keras counts."""
        best, best_epoch, wait = None, None, 0
        for epoch in sorted(values):
            wait += 1
            if self._is_improvement(values[epoch], best):
                best, best_epoch, wait = values[epoch], epoch, 0
        return (best, best_epoch, wait) if with_wait else (best, best_epoch)

    def _read_state(self, weights=True):
        import numpy as np

        if self.state_dir is None:
            return dict(self.values), dict(self._best_weights_by_epoch)
        path = os.path.join(self.state_dir, self.STATE_FILE)
        if not os.path.isfile(path):
            return {}, {}
        with open(path, encoding="utf-8") as file:
            state = json.load(file)
        if state.get("monitor") != self.monitor:
            warnings.warn(
                f"Early stopping: {path} watched {state.get('monitor')!r}, this run watches "
                f"{self.monitor!r}; it starts counting afresh."
            )
            return {}, {}
        values = {int(epoch): float(value) for epoch, value in state["values"].items()}
        best_weights = {}
        for epoch in state["weights_epochs"] if weights else ():
            weights_path = os.path.join(self.state_dir, self._WEIGHTS_PATTERN.format(epoch=epoch + 1))
            if os.path.isfile(weights_path):
                with np.load(weights_path) as arrays:
                    best_weights[epoch] = [arrays[f"arr_{i}"] for i in range(len(arrays.files))]
        return values, best_weights

    def _write_state(self, new_best):
        """The best weights first (when they changed), then the values that point to them."""
        import numpy as np

        if self.state_dir is None:
            return
        os.makedirs(self.state_dir, exist_ok=True)
        if new_best:
            path = os.path.join(self.state_dir, self._WEIGHTS_PATTERN.format(epoch=self.best_epoch + 1))
            with atomic_path(path) as temporary:
                with open(temporary, "wb") as file:
                    np.savez(file, *self.best_weights)
        state = {
            "monitor": self.monitor,
            "values": {str(epoch): value for epoch, value in sorted(self.values.items())},
            "weights_epochs": sorted(self._best_weights_by_epoch),
        }
        write_text_atomically(os.path.join(self.state_dir, self.STATE_FILE), json.dumps(state, indent=2) + "\n")
        kept = {self._WEIGHTS_PATTERN.format(epoch=epoch + 1) for epoch in self._best_weights_by_epoch}
        for name in os.listdir(self.state_dir):
            if name.startswith("early_stopping_best_") and name.endswith(".npz") and name not in kept:
                os.remove(os.path.join(self.state_dir, name))


class _TranslationCallback(keras.callbacks.Callback):
    """Shared by the BLEU and sample callbacks: a fixed sample, a reused decoder."""

    def __init__(self, pairs, tokenizer, every_n_epochs, num_samples, seed, batch_size, decode, jit_compile):
        super().__init__()
        pairs = list(pairs)
        if not pairs:
            raise ValueError("Expected at least one (source, reference) pair. Received: none")
        checks.check_positive_int("every_n_epochs", every_n_epochs)
        if num_samples is not None and num_samples < len(pairs):
            pairs = random.Random(seed).sample(pairs, num_samples)
        self.pairs = pairs
        self.tokenizer = tokenizer
        self.every_n_epochs = every_n_epochs
        self.batch_size = batch_size
        self.decode = decode
        self.jit_compile = jit_compile
        self._translator = None
        self._first_epoch = None

    def on_train_begin(self, logs=None):
        self._first_epoch = None

    def _due(self, epoch):
        # The first epoch of a fit always runs, so the key is in the CSV header.
        if self._first_epoch is None:
            self._first_epoch = epoch
        return epoch == self._first_epoch or (epoch + 1) % self.every_n_epochs == 0

    def _translate(self):
        if self._translator is None or self._translator.model is not self.model:
            from keras_transformer.inference.translator import Translator  # TensorFlow

            self._translator = Translator(
                self.model,
                self.tokenizer,
                beam_size=1 if self.decode == "greedy" else BEAM_SIZE,
                batch_size=self.batch_size,
                jit_compile=self.jit_compile,
            )
        return self._translator.translate([source for source, _ in self.pairs])


class BleuCallback(_TranslationCallback):
    """Logs `val_bleu`: sacreBLEU of greedy translations of a validation sample.

    Every `every_n_epochs` epochs (and at the first epoch of each `fit`, so the CSV log
    has the column), translates a fixed random sample of `num_samples` validation pairs
    with compiled greedy decoding, detokenizes, and adds the corpus BLEU (sacreBLEU's
    default 13a tokenization, 0-100) to the epoch logs, where `CSVLogger`,
    `TensorBoard` and `ModelCheckpoint(monitor="val_bleu")` see it.

    Args:
        validation_pairs: list of `(source, reference)` str pairs.
        tokenizer: the `SubwordTokenizer`.
        every_n_epochs: int, default 1.
        num_samples: int, pairs sampled once (seeded); None uses them all. Default 200.
        seed: int, seed of the sample. Default 0.
        batch_size: int, sentences per decoder call. Default 64.
        decode: `"greedy"` (default) or `"beam"`.
        jit_compile: bool, compile the search with XLA on TensorFlow (default True).

    Attributes:
        last_translations: list of str, the hypotheses of the last evaluation.
    """

    def __init__(
        self,
        validation_pairs,
        tokenizer,
        every_n_epochs=1,
        num_samples=200,
        seed=0,
        batch_size=64,
        decode="greedy",
        jit_compile=True,
    ):
        super().__init__(
            validation_pairs, tokenizer, every_n_epochs, num_samples, seed, batch_size, decode, jit_compile
        )
        self.last_translations = []

    def on_epoch_end(self, epoch, logs=None):
        if not self._due(epoch):
            return
        self.last_translations = self._translate()
        scores = score_translations(self.last_translations, [ref for _, ref in self.pairs])
        if logs is not None:
            logs["val_bleu"] = scores["bleu"]


class SampleTranslations(_TranslationCallback):
    """Prints a few validation sources, their references and the model's translations.

    Every `every_n_epochs` epochs, for a fixed sample of `num_samples` pairs, prints
    `source`, `reference` and the greedy `output`, marking outputs equal to the
    reference. Nothing is added to the logs.

    Args:
        validation_pairs: list of `(source, reference)` str pairs.
        tokenizer: the `SubwordTokenizer`.
        every_n_epochs: int, default 1.
        num_samples: int, default 3.
        seed: int, default 1 (a different sample from `BleuCallback`'s).
        print_fn: callable taking a str; default `print`.
        decode: `"greedy"` (default) or `"beam"`.
        jit_compile: bool, compile the search with XLA on TensorFlow (default True).
    """

    def __init__(
        self,
        validation_pairs,
        tokenizer,
        every_n_epochs=1,
        num_samples=3,
        seed=1,
        print_fn=print,
        decode="greedy",
        jit_compile=True,
    ):
        super().__init__(
            validation_pairs, tokenizer, every_n_epochs, num_samples, seed, 8, decode, jit_compile
        )
        self.print_fn = print_fn

    def on_epoch_end(self, epoch, logs=None):
        if not self._due(epoch):
            return
        lines = [f"Sample translations after epoch {epoch + 1}:"]
        for (source, reference), output in zip(self.pairs, self._translate()):
            mark = "=" if output.strip() == reference.strip() else "x"
            lines += [f"  source:    {source}", f"  reference: {reference}", f"  output:  {mark} {output}"]
        self.print_fn("\n".join(lines))


class StopOnInterrupt(keras.callbacks.Callback):
    """Raises a Ctrl-C again after each batch if one was recorded but swallowed.

    A `KeyboardInterrupt` raised while a garbage-collector callback runs (JAX registers
    one) is printed and dropped by Python, so `fit` would train on to the end;
    `keras_transformer.interrupts` records every SIGINT its handler sees, and this
    callback turns the record back into the interrupt at the next batch boundary, where
    the run stops as after any Ctrl-C (the last finished epoch kept for resuming).
    """

    def on_train_batch_end(self, batch, logs=None):
        interrupts.raise_if_interrupted()

    def on_test_batch_end(self, batch, logs=None):
        interrupts.raise_if_interrupted()


def default_callbacks(
    model_dir,
    *,
    keep_checkpoints=5,
    checkpoint_every_steps=0,
    validation_pairs=None,
    tokenizer=None,
    bleu_every_epochs=1,
    bleu_samples=200,
    sample_translations=3,
    max_train_seconds=None,
    tensorboard=True,
    jit_compile=True,
    early_stopping_patience=0,
    early_stopping_monitor="val_loss",
    early_stopping_min_delta=0.0,
):
    """The callbacks of a training run, writing into `model_dir`.

    In order: `StopOnInterrupt` (a Ctrl-C swallowed by a gc callback raised again),
    `TimeBudget` (if `max_train_seconds`), `StopOnNaN` (Keras' `TerminateOnNaN`),
    `LearningRateLogger`, `BleuCallback` and `SampleTranslations` (if validation pairs
    and a tokenizer are given, and their counts are > 0), `KeepLastCheckpoints`
    (`checkpoints/epoch_NNN.weights.h5`, or `step_NNNNNNN.weights.h5` every
    `checkpoint_every_steps` updates; the last `keep_checkpoints`; none if 0),
    `ResumableEarlyStopping` (if `early_stopping_patience` > 0; its state in `backup/`,
    so checkpoints and backups hold each epoch's own weights and the best are set only
    when training ends), `BackupAndRestore` (`backup/`: a killed run, started again with the same
    `model_dir`, resumes at the epoch after the last one finished; deleted once `fit`
    completes), `CSVLogger` (`training_log.csv`, appended to when resuming) and
    `TensorBoard` (`logs/`; skipped with a warning if TensorBoard is not installed).

    Args:
        model_dir: str, the run's directory (see `keras_transformer.model.directory`).
        keep_checkpoints: int >= 0. Default 5 (the paper averages the last 5).
        checkpoint_every_steps: int >= 0, optimizer updates between checkpoints; 0
            (default): one per epoch.
        validation_pairs: optional list of `(source, reference)` pairs for BLEU/samples.
        tokenizer: optional `SubwordTokenizer`, needed with `validation_pairs`.
        bleu_every_epochs: int >= 0; 0 disables the BLEU callback. Default 1.
        bleu_samples: int, validation pairs translated for BLEU. Default 200.
        sample_translations: int >= 0, sentences printed each time. Default 3.
        max_train_seconds: optional float, wall-clock budget of `fit`.
        tensorboard: bool, write TensorBoard logs. Default True.
        jit_compile: bool, XLA for the BLEU / sample decoders on TensorFlow. Default True.
        early_stopping_patience: int >= 0, epochs without improvement of
            `early_stopping_monitor` before training stops and the best epoch's weights
            are restored; 0 (default) trains every epoch.
        early_stopping_monitor: `"val_loss"` (default; `fit` needs `validation_data`)
            or `"val_bleu"` (needs `validation_pairs` and `bleu_every_epochs` > 0).
        early_stopping_min_delta: float >= 0, the least change that is an improvement.

    Returns:
        list of `keras.callbacks.Callback`.

    Example:

    ```python
    model.fit(batches, epochs=10, callbacks=default_callbacks("saved_models/run"))
    ```
    """
    model_dir = os.fspath(model_dir)
    os.makedirs(model_dir, exist_ok=True)  # CSVLogger opens its file before any epoch
    _check_callback_arguments(
        validation_pairs, tokenizer, bleu_every_epochs, early_stopping_patience, early_stopping_monitor
    )
    callbacks = [StopOnInterrupt()]
    callbacks += [TimeBudget(max_train_seconds)] if max_train_seconds else []
    callbacks += [StopOnNaN(), LearningRateLogger()]
    if validation_pairs:
        callbacks += _validation_callbacks(
            validation_pairs, tokenizer, bleu_every_epochs, bleu_samples, sample_translations, jit_compile
        )
    if keep_checkpoints:
        callbacks.append(
            KeepLastCheckpoints(
                os.path.join(model_dir, model_directory.CHECKPOINT_DIR),
                keep=keep_checkpoints,
                every_steps=checkpoint_every_steps,
            )
        )
    backup_dir = os.path.join(model_dir, model_directory.BACKUP_DIR)
    resuming = os.path.isdir(backup_dir)  # before any callback writes there
    if early_stopping_patience:
        # Before BackupAndRestore: the early-stopping state is written first, never behind.
        callbacks.append(
            ResumableEarlyStopping(
                early_stopping_monitor,
                patience=early_stopping_patience,
                min_delta=early_stopping_min_delta,
                state_dir=backup_dir,
                verbose=1,
            )
        )
    # Keras rewrites backup/latest.weights.h5 in place; with double_checkpoint it keeps
    # the previous one and falls back to it when a kill mid-write left the latest unreadable.
    callbacks.append(keras.callbacks.BackupAndRestore(backup_dir, double_checkpoint=True))
    return callbacks + _log_callbacks(model_dir, resuming, tensorboard)


def _check_callback_arguments(validation_pairs, tokenizer, bleu_every_epochs, patience, monitor):
    """Refuses validation pairs without a tokenizer, and early stopping on a BLEU nobody computes."""
    if validation_pairs is not None and tokenizer is None:
        raise ValueError("`tokenizer` is required with `validation_pairs`. Received: tokenizer=None")
    checks.check_non_negative_int("early_stopping_patience", patience)
    if patience and monitor == "val_bleu" and not (validation_pairs and bleu_every_epochs):
        raise ValueError(
            "early_stopping_monitor='val_bleu' needs the BLEU callback: validation pairs and "
            f"bleu_every_epochs > 0. Received: bleu_every_epochs={bleu_every_epochs}, "
            f"{len(validation_pairs or [])} validation pairs"
        )


def _validation_callbacks(validation_pairs, tokenizer, bleu_every_epochs, bleu_samples, sample_translations,
                          jit_compile):
    """`BleuCallback` and `SampleTranslations` over the validation pairs, those whose counts are > 0."""
    callbacks = []
    if bleu_every_epochs:
        callbacks.append(
            BleuCallback(
                validation_pairs, tokenizer, bleu_every_epochs, num_samples=bleu_samples, jit_compile=jit_compile
            )
        )
    if sample_translations:
        callbacks.append(
            SampleTranslations(
                validation_pairs,
                tokenizer,
                max(bleu_every_epochs, 1),
                num_samples=sample_translations,
                jit_compile=jit_compile,
            )
        )
    return callbacks


def _log_callbacks(model_dir, resuming, tensorboard):
    """`CSVLogger` (appended to when `resuming`) and, if asked and installed, `TensorBoard`."""
    callbacks = [keras.callbacks.CSVLogger(os.path.join(model_dir, model_directory.CSV_LOG_FILE), append=resuming)]
    if tensorboard and _tensorboard_installed():
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(model_dir, model_directory.TENSORBOARD_DIR)))
    return callbacks


def _tensorboard_installed():
    """Whether `tf.summary` can write: TensorFlow >= 2.20 no longer installs TensorBoard."""
    if importlib.util.find_spec("tensorboard") is not None:
        return True
    warnings.warn(
        "TensorBoard is not installed, so no TensorBoard logs are written "
        "(pip install tensorboard); the CSV log and the PNG curves are.",
        stacklevel=3,
    )
    return False


__all__ = [
    "StopOnInterrupt",
    "LearningRateLogger",
    "TimeBudget",
    "KeepLastCheckpoints",
    "ResumableEarlyStopping",
    "EARLY_STOPPING_MONITORS",
    "BleuCallback",
    "SampleTranslations",
    "default_callbacks",
    "current_learning_rate",
]
