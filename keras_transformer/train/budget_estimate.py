"""The steps of a wall-clock budget, estimated during `fit` from the measured step time.

A `BudgetSchedule` decays to its floor at `total_steps` updates, but a run with a time
budget (`max_train_seconds`) does not know how many updates fit in it until it has
timed a few. `StepBudgetEstimator` times them and sets the schedule's `total_steps`
so that the learning rate reaches its floor when the budget runs out:

1. At the first epoch's start of a resumed run (a `state_dir` holding an earlier
   estimate), the earlier run's seconds per update and this run's budget give a total
   at once, so the restored run does not train on the provisional total meanwhile.
2. After `measure_steps` updates, not counting the first step (which compiles the
   train function): `total = updates done + remaining seconds / seconds per update`.
3. At the start of each epoch that follows a whole epoch run on one compiled step (not
   the first epoch of the `fit`, which compiles, and not an epoch that began or ran
   when the step was rebuilt): the same from the last `EPOCH_WINDOW` (3) such epochs
   (`their seconds / their batches`), which includes what an epoch adds besides its
   steps (validation, BLEU, checkpoints) and no compilation. One estimate is not
   enough: the time of a step drifts over a run (the machine's speed changes), and a
   total fixed after an early epoch ends the decay before the budget does
   (docs/training.md, "A decay that ends with the time budget", has a Multi30k run's
   figures). Because each estimate covers only the time that is left, its error
   shrinks as the run goes on.

The total never goes below `warmup_steps + 1` (the least a `BudgetSchedule` accepts: a
budget that ends within the warmup is clamped, and the line says so). Each estimate
prints one line, is added to the epoch logs as `schedule_total_steps` (so the CSV log
records it), and is kept in `estimates`. The total is a Python number that compiled
steps (TensorFlow graphs, XLA, `jax.jit`) bake in, so each change rebuilds the train
function (`model.make_train_function(force=True)`; `fit` calls the new one from the
next step on; eager PyTorch reads the new value anyway). An estimate within
`RETRACE_TOLERANCE` (2%) of the current total changes nothing, and an epoch in which the
step was rebuilt (by this callback or another) is not timed, so a run retraces at most once every other epoch (the
45-minute Multi30k en->de run retraced twice).

Units: the schedule counts optimizer updates (`optimizer.iterations`); with gradient
accumulation over N batches (`PerUpdateSchedule`), an update costs N batches, and the
estimate is in updates.

Resuming: `max_train_seconds` is the budget of each `fit` (`TimeBudget` starts its
clock again when a killed run resumes), so the total is estimated again from the
restored step and the resumed process's budget: the floor moves to the end of the
budget the resumed run has.
"""

import json
import os
import time
import warnings
import weakref

import keras

from keras_transformer import checks, internals
from keras_transformer.atomic import write_text_atomically
from keras_transformer.train.accumulation import PerUpdateSchedule, applied_updates
from keras_transformer.train.budget_schedule import BudgetSchedule

# Updates timed before the first estimate: min(MAX, warmup_steps // 2), at least MIN,
# so the estimate lands within the warmup, where the total does not change the rate yet.
MIN_MEASURE_STEPS = 2
MAX_MEASURE_STEPS = 50
# A new estimate within this share of the current total keeps it (no retrace: a rebuilt
# step re-traces every batch shape, which the epoch after it pays for).
RETRACE_TOLERANCE = 0.02
# Whole epochs (the latest ones run on one compiled step) that an epoch estimate averages.
EPOCH_WINDOW = 3
# Where the latest estimate is kept for a resumed run, in the callback's `state_dir`.
STATE_FILE = "budget_estimate.json"
# The key the estimator adds to each epoch's logs: the total the schedule decays to.
LOG_KEY = "schedule_total_steps"


def default_measure_steps(warmup_steps):
    """Updates timed before the first estimate: `min(50, warmup_steps // 2)`, at least 2.

    Example:
    >>> default_measure_steps(4000), default_measure_steps(60), default_measure_steps(3)
    (50, 30, 2)
    """
    checks.check_positive_int("warmup_steps", warmup_steps)
    return max(MIN_MEASURE_STEPS, min(MAX_MEASURE_STEPS, warmup_steps // 2))


def estimate_total_steps(updates, remaining_seconds, seconds_per_update, warmup_steps):
    """The update at which the budget runs out, and whether it was clamped.

    `updates + floor(remaining_seconds / seconds_per_update)`, at least
    `warmup_steps + 1` (a `BudgetSchedule` decays after its warmup).

    Args:
        updates: int >= 0, updates done so far.
        remaining_seconds: float, seconds left in the budget (<= 0: none).
        seconds_per_update: float > 0, the measured cost of one update.
        warmup_steps: int >= 1, the schedule's warmup.

    Returns:
        `(total, estimate)`: the total to use, and the unclamped estimate.

    Raises:
        ValueError: `seconds_per_update` not a positive number, naming the value.

    Example:
    >>> estimate_total_steps(100, 60.0, 0.5, warmup_steps=40)  # 100 + 60 / 0.5
    (220, 220)
    >>> estimate_total_steps(10, 4.0, 0.5, warmup_steps=40)  # 18 < 41: clamped
    (41, 18)
    """
    checks.check_non_negative_int("updates", updates)
    checks.check_positive_number("seconds_per_update", seconds_per_update)
    checks.check_positive_int("warmup_steps", warmup_steps)
    estimate = updates + int(max(float(remaining_seconds), 0.0) / seconds_per_update)
    return max(estimate, warmup_steps + 1), estimate


def budget_schedule_of(optimizer):
    """The `BudgetSchedule` an optimizer runs on, and the batches per update.

    Looks through a `LossScaleOptimizer` and a `PerUpdateSchedule` (gradient
    accumulation, whose N is returned; 1 without one).

    Returns:
        `(schedule, accumulation)`.

    Raises:
        ValueError: the learning rate is not a `BudgetSchedule`, naming what it is.
    """
    inner = getattr(optimizer, "inner_optimizer", optimizer)
    schedule = internals.learning_rate_object(inner)
    accumulation = 1
    if isinstance(schedule, PerUpdateSchedule):
        schedule, accumulation = schedule.schedule, schedule.gradient_accumulation_steps
    if not isinstance(schedule, BudgetSchedule):
        raise ValueError(
            "StepBudgetEstimator sets the total of a BudgetSchedule (a 'cosine', 'linear' or "
            "'rsqrt_cooldown' decay); the optimizer's learning rate is none. Compile with "
            "make_schedule(..., estimate_total_steps=True) or compile_transformer(..., "
            f"estimate_total_steps=True). Received: learning rate {type(schedule).__name__}"
        )
    return schedule, accumulation


class StepBudgetEstimator(keras.callbacks.Callback):
    """Sets the `total_steps` of the optimizer's `BudgetSchedule` from the measured step time.

    So that the learning rate reaches its floor when `seconds` of `fit` have passed (the
    budget `TimeBudget` stops training at): see this module's docstring for when it
    estimates and how. The model must be compiled with a `BudgetSchedule` (through a
    `PerUpdateSchedule` and a `LossScaleOptimizer` if there are), usually by
    `compile_transformer(..., estimate_total_steps=True)`, which starts it with a
    provisional total. `run_training` adds this callback, after `TimeBudget`, when the
    `[training]` decay is not `"rsqrt"`, `total_steps` is not set and `max_train_seconds`
    is. Under a multi-worker strategy each worker times its own steps.

    Args:
        seconds: float > 0, the wall-clock budget of `fit`.
        measure_steps: int >= 1, updates timed before the first estimate (after the
            first step); None (default): `min(50, warmup_steps // 2)`, at least 2.
        state_dir: optional str, where the latest estimate is kept
            (`budget_estimate.json`, written atomically) for a resumed run to start from;
            `run_training` uses the run's `backup/`. It is written once the directory
            exists, or made at the second epoch's start. None keeps nothing.
        clock: callable returning seconds (a float), `time.monotonic` by default; tests
            pass a fake one.
        print_fn: callable taking a str, for the one line each estimate prints; `print`.

    Attributes:
        estimates: list of dicts, one per estimate: `at_step` (the updates done),
            `seconds_per_step` (per update), `measured_steps`, `estimate` (unclamped),
            `total_steps` (what the schedule now holds) and `source` (`"measured"`,
            `"epochs"` or `"resumed"`).
        estimated_total_steps: int, the schedule's total after the latest estimate, or None.
        seconds_per_step: float, the latest seconds per update, or None.

    Raises:
        ValueError: a bad argument, naming it; at `fit`'s start, a model whose learning
            rate is not a `BudgetSchedule`.

    Example:

    ```python
    training = kt.TrainingConfig(warmup_steps=400, decay="cosine")  # no total_steps
    kt.compile_transformer(model, training, estimate_total_steps=True)
    model.fit(batches, epochs=100, callbacks=[TimeBudget(2700), StepBudgetEstimator(2700)])
    # budget: 0.52 s/step measured over 50 steps; the schedule decays to its floor at step 5,180
    ```
    """

    def __init__(self, seconds, measure_steps=None, *, state_dir=None, clock=time.monotonic, print_fn=print):
        super().__init__()
        checks.check_positive_number("seconds", seconds)
        if measure_steps is not None:
            checks.check_positive_int("measure_steps", measure_steps)
        for name, value in (("clock", clock), ("print_fn", print_fn)):
            if not callable(value):
                raise ValueError(f"`{name}` must be callable. Received: {name}={value!r}")
        self.seconds = float(seconds)
        self.measure_steps = measure_steps
        self.state_dir = None if state_dir is None else os.fspath(state_dir)
        self.clock = clock
        self.print_fn = print_fn
        self.estimates = []
        self.schedule = None
        self.accumulation = 1
        self._reset()

    @property
    def estimated_total_steps(self):
        return self.estimates[-1]["total_steps"] if self.estimates else None

    @property
    def seconds_per_step(self):
        return self.estimates[-1]["seconds_per_step"] if self.estimates else None

    def _reset(self):
        self._start = None
        self._batches = 0  # batches (Keras steps) of this fit so far
        self._epoch_base = 0  # ... before the current epoch
        self._epochs = 0  # epochs of this fit finished
        self._mark = None  # (time, batches) at the end of the first call of the train function
        self._measured_in_epoch = None  # the epoch (of this fit) of the measured estimate
        self._epoch_mark = None  # (time, batches) at the current epoch's start
        self._epoch_clean = False  # whether the current epoch runs on one compiled step
        self._clean_epochs = []  # (1-based epoch, seconds, batches) of whole clean epochs
        self._unsaved = False  # whether the latest estimate is not in state_dir yet
        self._rebuilt = False  # whether the step was rebuilt at the current epoch's start
        self._window = None  # the 1-based epochs the latest epoch estimate averaged
        self._epoch_function = None  # the train function at the current epoch's start
        self._ended_function = None  # ... and at the end of the latest epoch

    # ------------------------------------------------------------ Keras' hooks
    def on_train_begin(self, logs=None):
        self._reset()
        self.estimates = []
        self._start = self.clock()
        self.schedule, self.accumulation = budget_schedule_of(self.model.optimizer)
        self._measure_updates = self.measure_steps or default_measure_steps(self.schedule.warmup_steps)

    def on_epoch_begin(self, epoch, logs=None):
        # After every callback's on_train_begin (BackupAndRestore has restored the step)
        # and on_epoch_end (the ended epoch's validation, BLEU, checkpoints are timed).
        self._rebuilt = False
        if self._epochs == 0:
            self._resume()
        else:  # the epoch's backup exists now: a kill from here on resumes with the estimate
            self._write_state(make_directory=True)
        now = self.clock()
        function = self._train_function()
        if self._epoch_clean and not self._same_function(self._ended_function, self._epoch_function):
            self._epoch_clean = False  # another callback rebuilt the step during that epoch
        if self._epochs > 0 and self._epoch_clean:
            mark_time, mark_batches = self._epoch_mark
            self._clean_epochs.append((self._epochs, now - mark_time, self._batches - mark_batches))
            if self._measured_in_epoch is not None:
                # The epochs that just ended ran whole on the current total: no compilation.
                window = self._clean_epochs[-EPOCH_WINDOW:]
                batches = sum(epoch[2] for epoch in window)
                seconds_per_update = sum(epoch[1] for epoch in window) / batches * self.accumulation
                self._window = [epoch[0] for epoch in window]
                self._apply(now, seconds_per_update, batches / self.accumulation, "epochs")
        # The first epoch of a fit compiles the step; so does any epoch begun on a rebuilt one.
        # A step rebuilt by another callback compiles again too: the epoch is
        # clean only on the very function that ran the whole epoch before.
        self._epoch_clean = (
            self._epochs > 0 and not self._rebuilt and self._same_function(function, self._ended_function)
        )
        self._epoch_function = self._train_function()
        self._epoch_mark = (now, self._batches)

    def on_train_batch_end(self, batch, logs=None):
        # `batch` is the last batch of the call (several with steps_per_execution). The
        # model is not touched here: on JAX that would sync its state every batch.
        self._batches = self._epoch_base + batch + 1
        if self._measured_in_epoch is not None:
            return
        now = self.clock()
        if self._mark is None:  # the first call compiled the step: time from its end
            self._mark = (now, self._batches)
            return
        mark_time, mark_batches = self._mark
        measured = self._batches - mark_batches
        if measured >= self._measure_updates * self.accumulation:
            seconds_per_update = (now - mark_time) / measured * self.accumulation
            self._apply(now, seconds_per_update, measured / self.accumulation, "measured")
            self._measured_in_epoch = self._epochs

    def on_epoch_end(self, epoch, logs=None):
        self._ended_function = self._train_function()
        self._epoch_base = self._batches
        self._epochs += 1
        if logs is not None:
            logs[LOG_KEY] = self.schedule.total_steps

    def on_train_end(self, logs=None):
        if self._measured_in_epoch is None and not self.estimates:
            self.print_fn(
                f"budget: training ended before {self._measure_updates} steps were timed; the "
                f"schedule kept its total, step {self.schedule.total_steps:,}"
            )

    # ---------------------------------------------------------------- internals
    def _train_function(self):
        """A weak reference to the model's current train function (None before there is one).

        Weak: a live reference to a replaced `jax.jit` function lets the new one reuse its
        trace (with the old total baked in); it must be garbage as soon as it is replaced.
        Read through `_model`: Keras' `Callback.model` syncs JAX's state on every access.
        """
        function = getattr(self._model, "train_function", None)
        return None if function is None else weakref.ref(function)

    @staticmethod
    def _same_function(first, second):
        """Whether two `_train_function` references name one live function."""
        if first is None or second is None:
            return first is second
        return first() is not None and first() is second()

    def _resume(self):
        state = self._read_state()
        if state is None:
            return
        self._apply(self.clock(), state["seconds_per_step"], state["measured_steps"], "resumed")

    def _apply(self, now, seconds_per_update, measured_updates, source):
        updates = applied_updates(self.model.optimizer)
        remaining = self.seconds - (now - self._start)
        total, estimate = estimate_total_steps(updates, remaining, seconds_per_update, self.schedule.warmup_steps)
        current = self.schedule.total_steps
        kept = abs(total - current) <= RETRACE_TOLERANCE * current
        if not kept:
            self.schedule.total_steps = total
            self.model.make_train_function(force=True)  # the compiled step holds the old total
            self._rebuilt = True  # at an epoch's start: that epoch traces again, not timed
            self._epoch_clean = False  # mid-epoch: this epoch is not timed
        record = {
            "at_step": updates,
            "seconds_per_step": float(seconds_per_update),
            "measured_steps": float(measured_updates),
            "estimate": estimate,
            "total_steps": self.schedule.total_steps,
            "source": source,
        }
        self.estimates.append(record)
        self._unsaved = True
        self._write_state()
        self.print_fn(self._describe(record, kept))

    def _describe(self, record, kept):
        if record["source"] == "measured":
            how = f"measured over {record['measured_steps']:g} steps"
        elif record["source"] == "epochs":
            how = f"over {self._describe_window()} (validation and callbacks included)"
        else:
            how = f"measured before the run was resumed at step {record['at_step']:,}"
        line = f"budget: {record['seconds_per_step']:.2f} s/step {how}; "
        if kept:
            line += (
                f"the estimate, step {record['estimate']:,}, is within {RETRACE_TOLERANCE:.0%} of the "
                f"schedule's: it keeps decaying to its floor at step {record['total_steps']:,}"
            )
        else:
            line += f"the schedule decays to its floor at step {record['total_steps']:,}"
        if record["estimate"] < record["total_steps"] and not kept:
            line += (
                f" (the budget fits {record['estimate']:,} steps, fewer than warmup_steps + 1 = "
                f"{self.schedule.warmup_steps + 1:,}: clamped)"
            )
        if self.accumulation > 1:
            line += f"; a step is one update of {self.accumulation} batches"
        return line

    def _describe_window(self):
        numbers = [str(epoch) for epoch in self._window]
        if len(numbers) == 1:
            return f"epoch {numbers[0]}"
        return f"epochs {', '.join(numbers[:-1])} and {numbers[-1]}"

    def _read_state(self):
        if self.state_dir is None:
            return None
        path = os.path.join(self.state_dir, STATE_FILE)
        if not os.path.isfile(path):
            return None
        try:
            with open(path, encoding="utf-8") as file:
                state = json.load(file)
            state = {key: float(state[key]) for key in ("seconds_per_step", "measured_steps")}
            checks.check_positive_number("seconds_per_step", state["seconds_per_step"])
        except (OSError, ValueError, KeyError, TypeError) as error:
            warnings.warn(f"{path} could not be read ({error}); the steps are measured afresh.")
            return None
        return state

    def _write_state(self, make_directory=False):
        """Keeps the latest estimate in `state_dir`, once that exists.

        `run_training`'s `state_dir` is `backup/`, which `BackupAndRestore` makes at the
        end of the first epoch; made earlier, it would tell a run killed in its first
        epoch that there is a backup to resume from. Estimates made before then are
        written at the next epoch's start.
        """
        if self.state_dir is None or not self.estimates or not self._unsaved:
            return
        if not os.path.isdir(self.state_dir):
            if not make_directory:
                return
            os.makedirs(self.state_dir, exist_ok=True)
        path = os.path.join(self.state_dir, STATE_FILE)
        write_text_atomically(path, json.dumps(self.estimates[-1], indent=2) + "\n")
        self._unsaved = False


__all__ = [
    "StepBudgetEstimator",
    "estimate_total_steps",
    "default_measure_steps",
    "budget_schedule_of",
    "MIN_MEASURE_STEPS",
    "MAX_MEASURE_STEPS",
    "RETRACE_TOLERANCE",
    "STATE_FILE",
    "LOG_KEY",
]
