"""`compile_transformer`: the paper's optimizer, schedule, loss and metrics in one call.

What a user calls before their own `model.fit`: Adam with beta_1=0.9, beta_2=0.98,
epsilon=1e-9 (Vaswani et al., 2017, section 5.3) on the warmup schedule of eq. 3, the
label-smoothed cross-entropy of section 5.4, and token accuracy and perplexity over real
(non-padding) tokens. Every constant comes from the `TransformerConfig`, where the
paper's values are the defaults.
"""

import keras

from keras_transformer.model.config import TransformerConfig
from keras_transformer.train.losses import LabelSmoothedCrossEntropy
from keras_transformer.train.metrics import MaskedAccuracy, Perplexity
from keras_transformer.train.precision import loss_scaled_optimizer
from keras_transformer.train.schedules import TransformerSchedule

_JIT_COMPILE_VALUES = ("auto", True, False)


def make_schedule(config):
    """The warmup learning-rate schedule of eq. 3 for `config` (a `TransformerSchedule`).

    Args:
        config: `TransformerConfig`; reads `d_model`, `warmup_steps` and
            `learning_rate_scale`.

    Example:
    >>> make_schedule(TransformerConfig()).peak_learning_rate  # d_model 512, warmup 4000
    0.000698...
    """
    _check_config(config)
    return TransformerSchedule(
        config.d_model, config.warmup_steps, scale=config.learning_rate_scale
    )


def make_optimizer(config):
    """Adam with the paper's betas and epsilon on the warmup schedule (section 5.3).

    `beta_1`, `beta_2` and `epsilon` are `config.adam_beta_1`, `adam_beta_2` and
    `adam_epsilon` (0.9, 0.98, 1e-9 by default, as in the paper); the learning rate is
    `make_schedule(config)`. `config.clipnorm`, when set, clips each gradient's norm (a
    departure from the paper, off by default). The optimizer is not wrapped for loss
    scaling here: `compile_transformer` does that when the model computes in float16.

    Args:
        config: `TransformerConfig`.

    Returns:
        `keras.optimizers.Adam`.

    Example:
    >>> optimizer = make_optimizer(TransformerConfig.from_preset("tiny"))
    >>> optimizer.beta_2
    0.98
    """
    _check_config(config)
    return keras.optimizers.Adam(
        learning_rate=make_schedule(config),
        beta_1=config.adam_beta_1,
        beta_2=config.adam_beta_2,
        epsilon=config.adam_epsilon,
        clipnorm=config.clipnorm,
    )


def compile_transformer(model, config=None, *, jit_compile="auto", steps_per_execution=1):
    """Compiles `model` with the paper's optimizer, schedule, loss and metrics.

    Sets `make_optimizer(config)`, `LabelSmoothedCrossEntropy(config.label_smoothing)`
    (padding ignored) and the metrics `MaskedAccuracy` and `Perplexity`. When the model
    computes in float16 (`mixed_float16` from `config.dtype_policy`, or from the global
    policy when that is None), the optimizer is wrapped in
    `keras.optimizers.LossScaleOptimizer` so small float16 gradients do not underflow
    (`keras_transformer.precision.loss_scaled_optimizer`). Keras does this by itself only
    when the *model object's* policy is `mixed_float16`, but the `Transformer` gives the
    config's policy to its layers, not to itself. bfloat16 needs no loss scaling.

    Args:
        model: a `keras_transformer.Transformer` (or any model taking the same inputs
            and giving logits `[B, T, V]`).
        config: `TransformerConfig`; defaults to `model.config`.
        jit_compile: `"auto"` (default; XLA on TensorFlow and JAX), True or False. With
            XLA, feed batches padded to a few fixed lengths (the data pipeline's
            buckets), or every new shape is a recompilation.
        steps_per_execution: int >= 1, training steps per call of the compiled function.

    Returns:
        The same `model`, compiled.

    Example:
    >>> config = TransformerConfig.from_preset("tiny", vocab_size=1000)
    >>> model = compile_transformer(build_transformer(config), config)
    >>> model.fit(batches, epochs=10)
    """
    if config is None:
        config = getattr(model, "config", None)
        if config is None:
            raise ValueError(
                "`config` is required when the model has no `config` attribute. "
                f"Received: config=None for model {type(model).__name__}"
            )
    _check_config(config)
    if jit_compile not in _JIT_COMPILE_VALUES or not isinstance(jit_compile, (str, bool)):
        raise ValueError(
            f'`jit_compile` must be "auto", True or False. Received: jit_compile={jit_compile!r}'
        )
    if (
        isinstance(steps_per_execution, bool)
        or not isinstance(steps_per_execution, int)
        or steps_per_execution < 1
    ):
        raise ValueError(
            "`steps_per_execution` must be a positive integer. "
            f"Received: steps_per_execution={steps_per_execution!r}"
        )
    # The layers compute in config.dtype_policy, or the global policy when it is None.
    optimizer = loss_scaled_optimizer(make_optimizer(config), config)
    model.compile(
        optimizer=optimizer,
        loss=LabelSmoothedCrossEntropy(config.label_smoothing),
        metrics=[MaskedAccuracy(), Perplexity()],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def _check_config(config):
    if not isinstance(config, TransformerConfig):
        raise ValueError(
            f"`config` must be a TransformerConfig. Received: {type(config).__name__}"
        )


__all__ = ["compile_transformer", "make_optimizer", "make_schedule"]
