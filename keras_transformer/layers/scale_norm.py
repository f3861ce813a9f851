"""ScaleNorm: each vector scaled to one learned length (Nguyen and Salazar, 2019)."""

import math

import keras
from keras import ops

from keras_transformer.checks import check_positive_number

# The optimizer leaves weights of this name out of weight decay (`make_optimizer`): decay
# pulls every weight towards zero by `learning_rate * weight_decay * g` a step, which for a
# length of ~16 outweighs Adam's own step of about `learning_rate` and would shrink it.
SCALE_NORM_GAIN = "scale_norm_gain"


def unit_vectors(x, epsilon):
    """`x / max(||x||, epsilon)` over the last axis, in float32: a zero vector stays zero.

    ScaleNorm (times its gain) and FixNorm's embedding rows (`TokenEmbedding`) both use it.
    """
    x = ops.cast(x, "float32")
    norms = ops.sqrt(ops.sum(ops.square(x), axis=-1, keepdims=True))
    return x / ops.maximum(norms, epsilon)


@keras.saving.register_keras_serializable(package="keras_transformer")
class ScaleNorm(keras.layers.Layer):
    """`g * x / max(||x||, epsilon)`: one learned scalar `g` in place of LayerNorm's 2d weights.

    Transformers without Tears (Nguyen and Salazar, 2019, 3.2) replace each LayerNorm with
    this: every vector is projected onto the sphere of radius `g`, `g` starting at
    `sqrt(d)` (the length of a unit-variance vector of width d). It keeps no mean or bias;
    their low-resource translation tasks learned faster with it. Not in Vaswani et al.

    The norm is computed in float32 whatever the compute dtype, and a zero vector maps to
    zero (its norm is clamped at `epsilon`), never to NaN.

    Args:
        epsilon: float > 0. The smallest norm divided by. Defaults to 1e-5.

    Example:
    >>> norm = ScaleNorm()
    >>> [round(float(v), 4) for v in norm(keras.ops.array([[3.0, 4.0]]))[0]]  # sqrt(2) * (0.6, 0.8)
    [0.8485, 1.1314]
    """

    def __init__(self, epsilon=1e-5, **kwargs):
        super().__init__(**kwargs)
        check_positive_number("epsilon", epsilon)
        self.epsilon = epsilon

    def build(self, inputs_shape):
        width = inputs_shape[-1]
        if width is None:
            raise ValueError(f"ScaleNorm needs a known last dimension. Received: shape={inputs_shape}")
        self.gain = self.add_weight(
            name=SCALE_NORM_GAIN,
            shape=(),
            initializer=keras.initializers.Constant(math.sqrt(width)),
            autocast=False,
        )
        self.built = True

    def call(self, inputs):
        outputs = unit_vectors(inputs, self.epsilon) * ops.cast(self.gain, "float32")
        return ops.cast(outputs, self.compute_dtype)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update({"epsilon": self.epsilon})
        return config


__all__ = ["ScaleNorm", "SCALE_NORM_GAIN", "unit_vectors"]
