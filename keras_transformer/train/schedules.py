"""The warmup-then-inverse-square-root learning rate of Vaswani et al. (2017), eq. 3."""

import keras
from keras import ops

from keras_transformer import checks

# Vaswani et al. (2017), section 5.3: "We used warmup_steps = 4000."
WARMUP_STEPS = 4000


@keras.saving.register_keras_serializable(package="keras_transformer")
class TransformerSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """Learning rate that warms up linearly, then decays as step^-0.5 (eq. 3 of the paper).

    `lr = scale * d_model^-0.5 * min(step^-0.5, step * warmup_steps^-1.5)`: it grows
    linearly for the first `warmup_steps` steps, peaks at step `warmup_steps` with
    `scale * (d_model * warmup_steps)^-0.5`, then falls proportionally to the inverse
    square root of the step number. `step` is the optimizer's iteration count plus one,
    so the first update uses the paper's step 1. `scale` multiplies the whole curve (1.0
    is the paper; a common knob when the batch size differs from the paper's ~25k tokens).

    Args:
        d_model: int, width of the model's embeddings (512 for the paper's base model).
        warmup_steps: int, number of steps of linear warmup. Defaults to 4000 (the paper).
        scale: float, factor on the whole curve. Defaults to 1.0 (the paper).

    Example:

    ```python
    schedule = TransformerSchedule(d_model=512)
    optimizer = keras.optimizers.Adam(schedule, beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    float(schedule(3999))  # the peak, == schedule.peak_learning_rate ~ 6.99e-4
    ```

    References:
        Vaswani et al., "Attention Is All You Need", NeurIPS 2017, section 5.3.
    """

    def __init__(self, d_model, warmup_steps=WARMUP_STEPS, scale=1.0):
        checks.check_positive_int("d_model", d_model)
        checks.check_positive_int("warmup_steps", warmup_steps)
        checks.check_positive_number("scale", scale)
        # Plain Python numbers, so that get_config is JSON-serializable.
        self.d_model = int(d_model)
        self.warmup_steps = int(warmup_steps)
        self.scale = float(scale)

    def __call__(self, step):
        # Keras counts optimizer iterations from 0; the paper's step starts at 1 so
        # step^-0.5 is finite and the first update does not get a zero learning rate.
        step = ops.cast(step, "float32") + 1.0
        warmup = step * (self.warmup_steps**-1.5)
        decay = ops.rsqrt(step)
        return self.scale * self.d_model**-0.5 * ops.minimum(decay, warmup)

    @property
    def peak_learning_rate(self):
        """The largest learning rate, reached at step `warmup_steps` (a Python float)."""
        return self.scale * (self.d_model * self.warmup_steps) ** -0.5

    def get_config(self):
        return {
            "d_model": self.d_model,
            "warmup_steps": self.warmup_steps,
            "scale": self.scale,
        }
