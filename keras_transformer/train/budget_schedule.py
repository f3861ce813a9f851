"""A learning rate that knows the training budget: the paper's warmup, then a decay that
ends at the last step.

The paper's schedule (eq. 3, `TransformerSchedule`) never ends: at the end of a short
budget its learning rate is still high, and the last checkpoints are noisy. When the
number of updates is known in advance, the common fix (Loshchilov & Hutter, 2017;
Hägele et al., 2024) is to decay to a floor exactly at the end. `BudgetSchedule` keeps
the paper's warmup and peak, so one `warmup_steps` and `scale` mean the same thing under
both schedules, and replaces the inverse-square-root tail by one that reaches
`final_fraction * peak` at `total_steps`.
"""

import math

import keras
from keras import ops

from keras_transformer import checks
from keras_transformer.train.schedules import WARMUP_STEPS, TransformerSchedule

# The tails a BudgetSchedule can end with; see its docstring for each formula.
DECAYS = ("cosine", "linear", "rsqrt_cooldown")
# The share of the budget the "rsqrt_cooldown" tail spends cooling down (Hägele et al.,
# 2024, find 10-20% enough to match a cosine schedule).
COOLDOWN_FRACTION = 0.2
# The total of a schedule whose total is estimated during fit (StepBudgetEstimator)
# until the first estimate replaces it: far beyond any run, so the decay has not begun.
PROVISIONAL_TOTAL_STEPS = 1_000_000_000


@keras.saving.register_keras_serializable(package="keras_transformer")
class BudgetSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The paper's warmup and peak, then a decay that reaches its floor at `total_steps`.

    With `step = iteration + 1` (as in `TransformerSchedule`), `W = warmup_steps`,
    `T = total_steps`, `peak = scale * (d_model * W)^-0.5` (the paper's peak) and
    `floor = final_fraction * peak`:

    - warmup, `step <= W`: `peak * step / W`, the paper's linear warmup;
    - `"cosine"`: `floor + (peak - floor) * (1 + cos(pi * p)) / 2`, with
      `p = (step - W) / (T - W)` the share of the decay done;
    - `"linear"`: `peak + (floor - peak) * p`;
    - `"rsqrt_cooldown"`: the paper's `peak * (W / step)^0.5` until the last
      `cooldown_fraction * (T - W)` steps, then that value times a factor falling
      linearly to `final_fraction` at `T` (warmup-stable-decay with the paper's tail);
    - after `T`: `floor`, so a run that goes on past its estimate stays at the floor
      (under `"rsqrt_cooldown"`, `final_fraction` times the paper's value there).

    `T` must exceed `W`. Use it when the number of updates is known: in a run config,
    `[training] decay = "cosine"` with `total_steps` (`TrainingConfig`). When only the
    wall-clock budget is known (`max_train_seconds` with no `total_steps`), `T` is
    estimated during `fit`: the schedule starts with a provisional
    `PROVISIONAL_TOTAL_STEPS` (the warmup does not depend on `T`), and a
    `StepBudgetEstimator` callback measures the seconds per update over the first
    `min(50, W // 2)` updates (at least 2; the first step, which compiles, is left out),
    sets `T` to the updates done plus the remaining seconds over the seconds per update
    (at least `W + 1`), and estimates once more from the whole first epoch (validation
    and callbacks included). `T` is a Python number baked into compiled steps, so the
    callback rebuilds the train function each time it changes it.

    Args:
        d_model: int, the model width (the peak scales as `d_model^-0.5`, as in eq. 3).
        total_steps: int > `warmup_steps`, the update at which the floor is reached.
        warmup_steps: int, steps of linear warmup. Defaults to 4000 (the paper).
        decay: one of `"cosine"` (default), `"linear"`, `"rsqrt_cooldown"`.
        scale: float, factor on the whole curve, as in `TransformerSchedule`.
        final_fraction: float in [0, 1), the floor as a fraction of the peak. Default 0.
        cooldown_fraction: float in (0, 1], share of the post-warmup steps the
            `"rsqrt_cooldown"` tail cools down over. Default 0.2.

    Example:
    >>> schedule = BudgetSchedule(d_model=64, total_steps=100, warmup_steps=10)
    >>> round(float(schedule(9)) / schedule.peak_learning_rate, 6)  # step 10: the peak
    1.0
    >>> round(float(schedule(54)) / schedule.peak_learning_rate, 6)  # half-way: (1 + cos(pi/2)) / 2
    0.5
    >>> float(schedule(99))  # step 100 == total_steps: the floor
    0.0
    """

    def __init__(
        self,
        d_model,
        total_steps,
        warmup_steps=WARMUP_STEPS,
        decay="cosine",
        scale=1.0,
        final_fraction=0.0,
        cooldown_fraction=COOLDOWN_FRACTION,
    ):
        checks.check_positive_int("d_model", d_model)
        checks.check_positive_int("total_steps", total_steps)
        checks.check_positive_int("warmup_steps", warmup_steps)
        checks.check_choice("decay", decay, DECAYS)
        checks.check_positive_number("scale", scale)
        checks.check_non_negative_number("final_fraction", final_fraction)
        checks.check_positive_number("cooldown_fraction", cooldown_fraction)
        if total_steps <= warmup_steps:
            raise ValueError(
                f"`total_steps` must be greater than `warmup_steps`: the decay starts after "
                f"the warmup. Received: total_steps={total_steps}, warmup_steps={warmup_steps}"
            )
        if final_fraction >= 1:
            raise ValueError(
                "`final_fraction` must be in [0, 1): the floor is a fraction of the peak. "
                f"Received: final_fraction={final_fraction!r}"
            )
        if cooldown_fraction > 1:
            raise ValueError(
                "`cooldown_fraction` must be in (0, 1]: a share of the post-warmup steps. "
                f"Received: cooldown_fraction={cooldown_fraction!r}"
            )
        # Plain Python numbers, so that get_config is JSON-serializable.
        self.d_model = int(d_model)
        self.total_steps = int(total_steps)
        self.warmup_steps = int(warmup_steps)
        self.decay = decay
        self.scale = float(scale)
        self.final_fraction = float(final_fraction)
        self.cooldown_fraction = float(cooldown_fraction)

    @property
    def peak_learning_rate(self):
        """The largest learning rate, at step `warmup_steps`: the paper's peak."""
        return TransformerSchedule(self.d_model, self.warmup_steps, self.scale).peak_learning_rate

    def __call__(self, iteration):
        step = ops.cast(iteration, "float32") + 1.0
        peak = self.peak_learning_rate
        floor = self.final_fraction * peak
        warmup, total = float(self.warmup_steps), float(self.total_steps)
        done = ops.clip((step - warmup) / (total - warmup), 0.0, 1.0)  # p, the decay's progress
        if self.decay == "cosine":
            tail = floor + (peak - floor) * 0.5 * (1.0 + ops.cos(math.pi * done))
        elif self.decay == "linear":
            tail = peak + (floor - peak) * done
        else:
            paper = peak * ops.sqrt(warmup / ops.maximum(step, warmup))
            # The cool-down factor: 1 before its start, falling linearly to final_fraction at T.
            cooled = (1.0 - done) / self.cooldown_fraction
            factor = self.final_fraction + (1.0 - self.final_fraction) * ops.clip(cooled, 0.0, 1.0)
            tail = paper * factor
        return ops.where(step <= warmup, peak * step / warmup, tail)

    def get_config(self):
        return {
            "d_model": self.d_model,
            "total_steps": self.total_steps,
            "warmup_steps": self.warmup_steps,
            "decay": self.decay,
            "scale": self.scale,
            "final_fraction": self.final_fraction,
            "cooldown_fraction": self.cooldown_fraction,
        }


__all__ = ["BudgetSchedule", "DECAYS", "COOLDOWN_FRACTION", "PROVISIONAL_TOTAL_STEPS"]
