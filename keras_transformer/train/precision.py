"""Mixed precision from the config: loss scaling for float16, and what each backend can run.

`TransformerConfig.dtype_policy` ("mixed_float16", "mixed_bfloat16" or None) is given
to every layer of the model. Logits, softmax and loss stay float32 whatever it is: the
tied output projection returns float32 logits, attention takes its softmax in float32,
and the loss casts the logits to float32.

Keras wraps the optimizer in a `LossScaleOptimizer` at `compile` only when the *model's*
own policy is "mixed_float16"; the Transformer's layers carry the config's policy but
the model object has the global one, so `compile` alone does not scale the loss.
`loss_scaled_optimizer` does it from the config.
"""

import keras

from keras_transformer.model.config import TransformerConfig

MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16")


def policy_name(dtype_policy=None):
    """The name of `dtype_policy`: a config, a policy name, a `DTypePolicy` or None (global)."""
    if isinstance(dtype_policy, TransformerConfig):
        dtype_policy = dtype_policy.dtype_policy
    if dtype_policy is None:
        return keras.config.dtype_policy().name
    if isinstance(dtype_policy, keras.DTypePolicy):
        return dtype_policy.name
    if isinstance(dtype_policy, str):
        return keras.dtype_policies.get(dtype_policy).name
    raise ValueError(
        "`dtype_policy` must be a policy name, a keras.DTypePolicy, a TransformerConfig or "
        f"None. Received: dtype_policy={dtype_policy!r}"
    )


def check_precision(dtype_policy=None):
    """Raises `ValueError` if this backend and device cannot train under `dtype_policy`.

    JAX on CPU cannot run "mixed_float16": XLA:CPU has no float16 x float16 -> float32
    `dot_general`, so the first matmul fails. bfloat16 and float32 run everywhere.
    """
    name = policy_name(dtype_policy)
    if name == "mixed_float16" and keras.backend.backend() == "jax":
        import jax

        if jax.default_backend() == "cpu":
            raise ValueError(
                "dtype_policy='mixed_float16' cannot run on the JAX backend on CPU: XLA:CPU "
                "has no float16 x float16 -> float32 dot_general. Use 'mixed_bfloat16' or "
                "float32 on CPU, or train on a GPU."
            )
    return name


def loss_scaled_optimizer(optimizer, dtype_policy=None):
    """`optimizer` wrapped in `keras.optimizers.LossScaleOptimizer` under "mixed_float16".

    float16 gradients of small losses underflow to zero; dynamic loss scaling multiplies
    the loss before the backward pass and divides the gradients after, skipping steps
    whose gradients overflow. bfloat16 has float32's exponent range and needs none, so
    other policies get `optimizer` back unchanged, as does an optimizer already wrapped.
    Checks the policy with `check_precision` first.

    Args:
        optimizer: a `keras.optimizers.Optimizer`.
        dtype_policy: the model's policy: a `TransformerConfig`, a name, a
            `keras.DTypePolicy`, or None for the global policy.

    Example:

    ```python
    optimizer = loss_scaled_optimizer(keras.optimizers.Adam(schedule), config)
    model.compile(optimizer=optimizer, loss=LabelSmoothedCrossEntropy())
    ```
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise ValueError(
            f"`optimizer` must be a keras.optimizers.Optimizer. Received: {optimizer!r}"
        )
    name = check_precision(dtype_policy)
    if name != "mixed_float16" or isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    return keras.optimizers.LossScaleOptimizer(optimizer)
