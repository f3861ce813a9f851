"""`compile_transformer`: the paper's optimizer, schedule, loss and metrics in one call.

What a user calls before their own `model.fit`: Adam with beta_1=0.9, beta_2=0.98,
epsilon=1e-9 (Vaswani et al., 2017, section 5.3) on the warmup schedule of eq. 3, the
label-smoothed cross-entropy of section 5.4, and token accuracy and perplexity over real
(non-padding) tokens. Every constant comes from the `TrainingConfig`, where the paper's
values are the defaults; the width comes from the model's `TransformerConfig`.
"""

import keras

from keras_transformer import checks
from keras_transformer.model.config import TransformerConfig
from keras_transformer.train.accumulation import PerUpdateSchedule, keras_accumulation_steps
from keras_transformer.train.fused_adam import FusedAdam
from keras_transformer.train.losses import LabelSmoothedCrossEntropy
from keras_transformer.train.metrics import MaskedAccuracy, Perplexity
from keras_transformer.train.precision import loss_scaled_optimizer
from keras_transformer.layers.scale_norm import SCALE_NORM_GAIN
from keras_transformer.train.config import TrainingConfig
from keras_transformer.train.budget_schedule import PROVISIONAL_TOTAL_STEPS, BudgetSchedule
from keras_transformer.train.schedules import TransformerSchedule

# What `model.compile(jit_compile=...)` takes: "auto" lets Keras pick XLA where it can.
JIT_COMPILE_VALUES = ("auto", True, False)


def make_schedule(d_model, training_config=None, *, estimate_total_steps=False):
    """The learning-rate schedule of `training_config`: eq. 3, or eq. 3's warmup with a budget.

    `decay="rsqrt"` (the default) is the paper's `TransformerSchedule`; `"cosine"`,
    `"linear"` and `"rsqrt_cooldown"` give a `BudgetSchedule` with the same warmup and
    peak that reaches zero at `training_config.total_steps` updates. Without
    `total_steps`, pass `estimate_total_steps=True` to say that a `StepBudgetEstimator`
    callback will set it during `fit` from a time budget: the schedule then starts with
    the provisional total `PROVISIONAL_TOTAL_STEPS`.

    Args:
        d_model: int, the model width the schedule scales with.
        training_config: `TrainingConfig`; reads `warmup_steps`, `learning_rate_scale`,
            `decay` and `total_steps`. None: the paper's.
        estimate_total_steps: bool, whether the total of a budgeted decay without
            `total_steps` is estimated during `fit` (`StepBudgetEstimator`). Default False.

    Returns:
        `TransformerSchedule` or `BudgetSchedule`.

    Raises:
        ValueError: a budgeted decay without `total_steps` and without
            `estimate_total_steps`; `estimate_total_steps` with `decay="rsqrt"` (which
            never ends) or with `total_steps` set (nothing to estimate).

    Example:
    >>> make_schedule(512).peak_learning_rate  # d_model 512, warmup 4000
    0.000698...
    >>> cosine = make_schedule(512, kt.TrainingConfig(decay="cosine", total_steps=20000))
    >>> float(cosine(19999))  # the last update of the budget: the floor
    0.0
    >>> make_schedule(512, kt.TrainingConfig(decay="cosine"), estimate_total_steps=True).total_steps
    1000000000
    """
    training_config = _checked_training_config(training_config)
    checks.check_bool("estimate_total_steps", estimate_total_steps)
    decay, total_steps = training_config.decay, training_config.total_steps
    if estimate_total_steps and decay == "rsqrt":
        raise ValueError(
            "estimate_total_steps=True estimates where a budgeted decay ends ('cosine', "
            "'linear', 'rsqrt_cooldown'); decay='rsqrt' (eq. 3) never ends. Received: decay='rsqrt'"
        )
    if estimate_total_steps and total_steps is not None:
        raise ValueError(
            "estimate_total_steps=True estimates `total_steps`, which is already set: pass one "
            f"or the other. Received: total_steps={total_steps}, estimate_total_steps=True"
        )
    if decay == "rsqrt":
        return TransformerSchedule(
            d_model, training_config.warmup_steps, scale=training_config.learning_rate_scale
        )
    if total_steps is None and not estimate_total_steps:
        raise ValueError(
            f"decay={decay!r} brings the learning rate to its floor at the budget's last "
            "update, so it needs `total_steps` (updates in the budget), or "
            "estimate_total_steps=True with a StepBudgetEstimator callback that estimates it "
            "from a time budget during fit (a run config does this with max_train_seconds). "
            "Received: total_steps=None"
        )
    if total_steps is None:
        total_steps = max(PROVISIONAL_TOTAL_STEPS, training_config.warmup_steps + 1)
    return BudgetSchedule(
        d_model,
        total_steps,
        training_config.warmup_steps,
        decay=decay,
        scale=training_config.learning_rate_scale,
    )


def make_optimizer(d_model, training_config=None, *, estimate_total_steps=False):
    """Adam with the paper's betas and epsilon on the warmup schedule (section 5.3).

    `beta_1`, `beta_2` and `epsilon` are the training config's `adam_beta_1`,
    `adam_beta_2` and `adam_epsilon` (0.9, 0.98, 1e-9 by default, as in the paper); the
    learning rate is `make_schedule(d_model, training_config)`. `clipnorm`, when set,
    clips each gradient's norm, and `weight_decay` > 0 makes it AdamW (decoupled weight
    decay on every weight: `w -= learning_rate * weight_decay * w` before each update);
    both are departures from the paper, off by default. On TensorFlow the Adam is
    `FusedAdam`: Keras' Adam, its update one fused kernel per weight.
    `gradient_accumulation_steps` N > 1 makes Keras' optimizer apply the mean gradient
    of N batches as one update, and the schedule is wrapped in a `PerUpdateSchedule` so
    that it advances per update, not per batch (`keras_transformer.train.accumulation`).
    The optimizer is not wrapped for loss scaling here: `compile_transformer` does that
    when the model computes in float16.

    Args:
        d_model: int, the model width.
        training_config: `TrainingConfig`, or None for the paper's.
        estimate_total_steps: bool, passed to `make_schedule`: the total of a budgeted
            decay is estimated during `fit` by a `StepBudgetEstimator`. Default False.

    Returns:
        `keras.optimizers.Adam` (`FusedAdam`, a subclass, on TensorFlow).

    Example:
    >>> make_optimizer(64).beta_2
    0.98
    """
    training_config = _checked_training_config(training_config)
    schedule = make_schedule(d_model, training_config, estimate_total_steps=estimate_total_steps)
    accumulation = keras_accumulation_steps(training_config.gradient_accumulation_steps)
    if accumulation:
        schedule = PerUpdateSchedule(schedule, accumulation)
    # None, not 0.0: an optimizer without decay has the config it always had.
    weight_decay = training_config.weight_decay or None
    # PyTorch's Keras Adam already updates all weights at once (torch._foreach ops), which
    # a subclass would not inherit; JAX compiles the update into the step either way.
    adam = FusedAdam if keras.backend.backend() == "tensorflow" else keras.optimizers.Adam
    optimizer = adam(
        learning_rate=schedule,
        beta_1=training_config.adam_beta_1,
        beta_2=training_config.adam_beta_2,
        epsilon=training_config.adam_epsilon,
        clipnorm=training_config.clipnorm,
        weight_decay=weight_decay,
        gradient_accumulation_steps=accumulation,
    )
    return _without_gain_decay(optimizer)


def _without_gain_decay(optimizer):
    """Leaves ScaleNorm's lengths (`SCALE_NORM_GAIN` weights) out of `optimizer`'s weight decay.

    A gain starts at sqrt(d_model) (16 at 256): decay would take `lr * weight_decay * 16` off
    it a step, more than Adam's step of about `lr` can put back, and shrink every logit.
    """
    if optimizer.weight_decay is not None:
        optimizer.exclude_from_weight_decay(var_names=[SCALE_NORM_GAIN])
    return optimizer


def compile_transformer(
    model,
    training_config=None,
    *,
    jit_compile="auto",
    steps_per_execution=1,
    gradient_accumulation_steps=None,
    estimate_total_steps=False,
):
    """Compiles `model` with the paper's optimizer, schedule, loss and metrics.

    Sets `make_optimizer(model.config.d_model, training_config)`,
    `LabelSmoothedCrossEntropy(training_config.label_smoothing)` (padding ignored) and
    the metrics `MaskedAccuracy` and `Perplexity`. When the model computes in float16
    (`mixed_float16` from `model.config.dtype_policy`, or from the global policy when
    that is None), the optimizer is wrapped in `keras.optimizers.LossScaleOptimizer` so
    small float16 gradients do not underflow
    (`keras_transformer.train.precision.loss_scaled_optimizer`). Keras does this by itself
    only when the *model object's* policy is `mixed_float16`, but the `Transformer` gives
    the config's policy to its layers, not to itself. bfloat16 needs no loss scaling.
    On PyTorch under torchrun (several processes), the model trains with each step's
    gradients averaged across them (`train.torch_data_parallel.attach`).

    Args:
        model: a `keras_transformer.Transformer`.
        training_config: `TrainingConfig`; None (default) is the paper's recipe.
        jit_compile: `"auto"` (default; XLA on TensorFlow and JAX), True or False. With
            XLA, feed batches padded to a few fixed lengths (the data pipeline's
            buckets), or every new shape is a recompilation.
        steps_per_execution: int >= 1, training steps per call of the compiled function.
        gradient_accumulation_steps: int >= 1, batches whose mean gradient makes one
            update; None (default) takes the training config's (1 unless set there).
            Given, it replaces the config's value. `fit` still counts batches (steps
            per epoch, the progress bar); `model.optimizer.iterations` counts updates.
        estimate_total_steps: bool, for a budgeted decay (`"cosine"`, ...) without
            `total_steps`: a `StepBudgetEstimator` in `fit`'s callbacks will estimate the
            total from a time budget (`make_schedule`). Default False: such a config is
            refused.

    Returns:
        The same `model`, compiled.

    Example:
    >>> model = kt.build_transformer(kt.TransformerConfig.from_preset("tiny", vocab_size=100))
    >>> model = compile_transformer(model, kt.TrainingConfig(warmup_steps=400))
    >>> schedule = make_schedule(model.config.d_model, kt.TrainingConfig(warmup_steps=400))
    >>> float(model.optimizer.learning_rate) == float(schedule(0))  # the first update's rate
    True
    >>> model = compile_transformer(model, gradient_accumulation_steps=4)  # 4 batches per update
    >>> model.optimizer.gradient_accumulation_steps
    4
    """
    config = getattr(model, "config", None)
    if not isinstance(config, TransformerConfig):
        raise ValueError(
            "`model` must be a keras_transformer.Transformer (a model with a "
            f"TransformerConfig as `config`). Received: {type(model).__name__}"
        )
    training_config = _checked_training_config(training_config)
    if gradient_accumulation_steps is not None:
        # replace() validates it, with the TrainingConfig's message.
        training_config = training_config.replace(gradient_accumulation_steps=gradient_accumulation_steps)
    checks.check_choice("jit_compile", jit_compile, JIT_COMPILE_VALUES)
    checks.check_positive_int("steps_per_execution", steps_per_execution)
    # The layers compute in config.dtype_policy, or the global policy when it is None.
    optimizer = make_optimizer(config.d_model, training_config, estimate_total_steps=estimate_total_steps)
    optimizer = loss_scaled_optimizer(optimizer, config)
    model.compile(
        optimizer=optimizer,
        loss=make_loss(training_config),
        metrics=[MaskedAccuracy(), Perplexity()],
        jit_compile=attach_torch_step(model, jit_compile),
        steps_per_execution=steps_per_execution,
    )
    if keras.backend.backend() == "torch":
        from keras_transformer.train import torch_data_parallel  # imports torch

        # Under torchrun: each step's gradients averaged across the processes, rank 0's
        # weights in every one. One process: nothing.
        torch_data_parallel.attach(model)
    return model


def make_loss(training_config=None):
    """The recipe's loss: `LabelSmoothedCrossEntropy` with the config's `label_smoothing` (5.4).

    Example:
    >>> make_loss(kt.TrainingConfig(label_smoothing=0.2)).label_smoothing
    0.2
    """
    training_config = _checked_training_config(training_config)
    return LabelSmoothedCrossEntropy(training_config.label_smoothing)


def attach_torch_step(model, jit_compile):
    """On PyTorch, trains through `train.torch_step.CapturedTrainStep` unless `jit_compile=False`.

    Keras' own `torch.compile` of its step breaks the graph inside Keras and recompiles
    the shared attention code past dynamo's limit; the captured step records the forward
    pass and loss once per batch shape instead. `True` compiles each captured graph
    (inductor, `torch_capture.default_compiler`) at a shape's first batch, and a model
    that cannot be captured or compiled stops with an error saying why; `"auto"` runs
    the graph uncompiled, only for shapes that recur (`AUTO_CAPTURE_AFTER` batches), so
    a short `fit` never pays for a capture, and a model that cannot be captured trains
    through Keras' eager step after one warning. Sets `model.captured_train_step` and
    returns the `jit_compile` to hand to `model.compile` (False there on PyTorch: the
    step is ours).
    """
    model.captured_train_step = None
    if keras.backend.backend() != "torch":
        return jit_compile
    if jit_compile is False:
        return False
    from keras_transformer import torch_capture  # imports torch
    from keras_transformer.train import torch_step

    if jit_compile is True:
        model.captured_train_step = torch_step.CapturedTrainStep(
            model, compiler=torch_capture.default_compiler(), strict=True
        )
    else:
        model.captured_train_step = torch_step.CapturedTrainStep(
            model, capture_after=torch_step.AUTO_CAPTURE_AFTER
        )
    return False


def _checked_training_config(training_config):
    if training_config is None:
        return TrainingConfig()
    if isinstance(training_config, TransformerConfig):
        raise ValueError(
            "Expected a TrainingConfig; received the model's TransformerConfig, which since "
            "0.2 holds the architecture only. Pass TrainingConfig(...) (or None for the "
            "paper's recipe)."
        )
    if not isinstance(training_config, TrainingConfig):
        raise ValueError(
            f"`training_config` must be a TrainingConfig or None. Received: {type(training_config).__name__}"
        )
    return training_config


__all__ = ["compile_transformer", "make_loss", "make_optimizer", "make_schedule", "JIT_COMPILE_VALUES"]
