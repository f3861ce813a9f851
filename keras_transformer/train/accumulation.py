"""Gradient accumulation: N batches per optimizer update, with the schedule counting updates.

The paper's batches held ~25k source and ~25k target tokens, on 8 GPUs (section 5.1).
One small device reaches that batch by accumulating: Keras' own optimizer support
(`keras.optimizers.Optimizer(gradient_accumulation_steps=N)`) adds the gradients of N
batches ("micro-batches") into one accumulator per weight and applies their mean as
one update on every N-th batch; in between, no weight moves.

How that meets the rest of the recipe (Keras 3.15):

- **The learning-rate schedule.** Keras counts every micro-batch in the optimizer's
  private `_iterations` and calls a schedule with it, so eq. 3 would warm up N times
  too fast (4000 micro-batches = 4000 / N updates). `PerUpdateSchedule` calls the
  schedule at `floor(_iterations / N)`: the k-th update (counting from 0) gets the
  schedule's value at step k, as it would without accumulation. `optimizer.iterations`
  (what Adam's bias correction, `LearningRateLogger`, TensorBoard and the run's step
  count read) already counts updates: it is `floor(_iterations / N)`.
- **The token-mean loss.** The loss of a batch is the mean over its real target
  tokens, and Keras averages the N micro-batch gradients. The update equals that of one
  batch holding all N only when the micro-batches hold equal numbers of real tokens;
  otherwise each micro-batch weighs the same, so a token of a small micro-batch weighs
  more than one of a large one. The data pipeline's token-budget batches of similar
  lengths keep the counts close. Across replicas (`tf.distribute`) each micro-batch is
  still the mean over all its replicas' real tokens
  (`keras_transformer.distribute.replica_share_of_global_mean`).
- **float16 loss scaling.** `keras.optimizers.LossScaleOptimizer` wraps the
  accumulating optimizer: each micro-batch's gradients are unscaled (by the scale of
  that micro-batch) before they are added to the accumulator; a micro-batch with
  non-finite gradients is skipped whole (nothing accumulated, not counted), so an
  update is always the mean of N finite micro-batches.
- **`steps_per_execution`.** Independent: each batch inside one compiled call is one
  micro-batch, accumulated as above.
- **Epochs.** `steps_per_epoch` and the progress bar count batches (micro-batches). The
  accumulators are optimizer variables: saved in `model.keras` and in the backups and
  checkpoints with the rest of the optimizer, and carried over when an epoch's batch
  count is not a multiple of N.
"""

import keras
from keras import ops

from keras_transformer import checks


@keras.saving.register_keras_serializable(package="keras_transformer")
class PerUpdateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A learning-rate schedule that advances once per applied update, not per batch.

    With `gradient_accumulation_steps=N`, Keras calls the optimizer's schedule with the
    count of batches seen; this calls `schedule` with `floor(step / N)`, the number of
    updates applied before this one, so the curve is the same function of updates as
    without accumulation.

    Args:
        schedule: a `keras.optimizers.schedules.LearningRateSchedule`.
        gradient_accumulation_steps: int >= 1, the N of the optimizer.

    Example:
    >>> schedule = PerUpdateSchedule(kt.TransformerSchedule(64, warmup_steps=10), 4)
    >>> [float(schedule(step)) == float(schedule.schedule(0)) for step in (0, 3, 4)]
    [True, True, False]
    """

    def __init__(self, schedule, gradient_accumulation_steps):
        if isinstance(schedule, dict):  # from get_config
            schedule = keras.optimizers.schedules.deserialize(schedule)
        if not isinstance(schedule, keras.optimizers.schedules.LearningRateSchedule):
            raise ValueError(
                "`schedule` must be a keras.optimizers.schedules.LearningRateSchedule. "
                f"Received: schedule={schedule!r}"
            )
        checks.check_positive_int("gradient_accumulation_steps", gradient_accumulation_steps)
        self.schedule = schedule
        self.gradient_accumulation_steps = int(gradient_accumulation_steps)

    def __call__(self, step):
        return self.schedule(ops.floor_divide(step, self.gradient_accumulation_steps))

    def get_config(self):
        return {
            "schedule": keras.optimizers.schedules.serialize(self.schedule),
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
        }


def keras_accumulation_steps(gradient_accumulation_steps):
    """The value for Keras' `gradient_accumulation_steps`: None for 1 (Keras refuses 1).

    Raises:
        ValueError: not a positive int, naming the value.
    """
    checks.check_positive_int("gradient_accumulation_steps", gradient_accumulation_steps)
    return gradient_accumulation_steps if gradient_accumulation_steps > 1 else None


def applied_updates(optimizer):
    """The updates `optimizer` has applied (not batches seen), as an int.

    `optimizer.iterations` already divides by the accumulation steps; a
    `LossScaleOptimizer` reports its inner optimizer's.
    """
    return int(ops.convert_to_numpy(optimizer.iterations))


__all__ = ["PerUpdateSchedule", "keras_accumulation_steps", "applied_updates"]
