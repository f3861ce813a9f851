"""`TrainingConfig`: the optimizer, learning-rate schedule and loss of the paper's recipe.

Kept apart from the model's `TransformerConfig` (as flax's WMT example keeps its model
config apart from its training settings): a saved model carries only its architecture,
and one model can be trained under several recipes. Defaults are the paper's
(Vaswani et al., 2017, section 5), each with the section that gives it.
"""

import dataclasses
import typing

from keras_transformer import checks
from keras_transformer.train.losses import LABEL_SMOOTHING
from keras_transformer.train.budget_schedule import DECAYS
from keras_transformer.train.schedules import WARMUP_STEPS

# "rsqrt" is the paper's eq. 3; the others are BudgetSchedule's tails.
SCHEDULE_DECAYS = ("rsqrt",) + DECAYS


@dataclasses.dataclass(frozen=True)
class TrainingConfig:
    """How a Transformer is optimized: Adam, the warmup schedule, label smoothing.

    Frozen and validated like `TransformerConfig`: variants with `replace(**changes)`;
    a bad value raises `ValueError` naming the field and the value. Batching (tokens per
    batch) belongs to the data pipeline and the run config, not here; how many batches
    make one update (`gradient_accumulation_steps`) is the optimizer's, so it is here.

    Example:
    >>> TrainingConfig().replace(warmup_steps=400).warmup_steps
    400
    """

    label_smoothing: float = LABEL_SMOOTHING  # epsilon_ls = 0.1 (5.4)
    warmup_steps: int = WARMUP_STEPS  # 4000 (5.3)
    learning_rate_scale: float = 1.0  # multiplies the schedule; 1.0 is the paper's formula
    # After the warmup: "rsqrt" is eq. 3's inverse square root, which never ends; "cosine",
    # "linear" and "rsqrt_cooldown" reach zero at `total_steps` updates (BudgetSchedule).
    decay: str = "rsqrt"
    # Updates in the budget. Every decay but "rsqrt" needs it, or a time budget to estimate
    # it from: make_schedule refuses None unless told the steps will be estimated
    # (estimate_total_steps=True, which run_training passes with max_train_seconds).
    total_steps: typing.Optional[int] = None
    adam_beta_1: float = 0.9  # (5.3)
    adam_beta_2: float = 0.98  # (5.3)
    adam_epsilon: float = 1e-9  # (5.3)
    clipnorm: typing.Optional[float] = None  # not in the paper; None disables clipping
    # Decoupled weight decay (AdamW, Loshchilov & Hutter, 2019; not in the paper): each
    # update first shrinks every weight by learning_rate * weight_decay, as fairseq's
    # --weight-decay and Keras' AdamW do (all weights, biases and norms included). 0 is off.
    weight_decay: float = 0.0
    # Batches whose mean gradient makes one update: 1 is the paper (one batch of ~25k
    # tokens a side per update, on 8 GPUs); N > 1 reaches that batch on one small device
    # (see keras_transformer.train.accumulation).
    gradient_accumulation_steps: int = 1

    def __post_init__(self):
        checks.check_dataclass_fields(self)
        checks.check_positive_int("warmup_steps", self.warmup_steps)
        checks.check_positive_int("gradient_accumulation_steps", self.gradient_accumulation_steps)
        checks.check_choice("decay", self.decay, SCHEDULE_DECAYS)
        if self.total_steps is not None:
            checks.check_positive_int("total_steps", self.total_steps)
        # total_steps=None with a budgeted decay is refused by make_schedule (unless the
        # steps are estimated from a time budget) and by RunConfig (without max_train_seconds).
        if self.decay != "rsqrt" and self.total_steps is not None and self.total_steps <= self.warmup_steps:
            raise ValueError(
                "`total_steps` must be greater than `warmup_steps`: the decay starts after the "
                f"warmup. Received: total_steps={self.total_steps}, warmup_steps={self.warmup_steps}"
            )
        for name in ("label_smoothing", "adam_beta_1", "adam_beta_2"):
            checks.check_rate(name, getattr(self, name))
        for name in ("learning_rate_scale", "adam_epsilon"):
            checks.check_positive_number(name, getattr(self, name))
        if self.clipnorm is not None:
            checks.check_positive_number("clipnorm", self.clipnorm)
        checks.check_rate("weight_decay", self.weight_decay)

    def replace(self, **changes):
        """A copy with `changes` applied and validated; unknown names raise `ValueError`."""
        checks.check_known_keys("TrainingConfig field", changes, TrainingConfig)
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        """Builds a config from a dict (a TOML table), refusing unknown keys."""
        if not isinstance(values, dict):
            raise ValueError(f"Expected a table of training settings. Received: {type(values).__name__}")
        checks.check_known_keys("TrainingConfig field", values, TrainingConfig)
        return cls(**values)


__all__ = ["TrainingConfig"]
