"""The position-wise feed-forward network of the Transformer."""

import keras

from keras_transformer.checks import check_bool, check_positive_int, check_rate
from keras_transformer.layers.initializers import clone_initializer


@keras.saving.register_keras_serializable(package="keras_transformer")
class PositionwiseFeedForward(keras.layers.Layer):
    """`FFN(x) = max(0, x W1 + b1) W2 + b2` (Vaswani et al., 2017, 3.3).

    `activation` replaces the paper's `max(0, .)` for models trained with another
    (GELU; swish, `x * sigmoid(x)`, in Marian / OPUS-MT). With `gated=True` the inner
    activations are gated by a second, linear projection of the input, Shazeer's (2020)
    GLU variants: `FFN(x) = (act(x W1 + b1) * (x V + c)) W2 + b2` (ReGLU, GEGLU or
    SwiGLU by `activation`); a third matrix, so `intermediate_dim` of 2/3 the ungated
    width keeps the parameters and FLOPs. Applied to every position separately and
    identically. `dropout` acts on the inner activations (tensor2tensor's "relu
    dropout"); the paper's residual dropout on the output is applied by the block that
    owns the residual connection, not here.

    Args:
        hidden_dim: int. Width of input and output (d_model, 512 in the paper).
        intermediate_dim: int. Inner width (d_ff, 2048 in the paper).
        dropout: float. Dropout on the inner activations. Defaults to 0.0 (the paper has none).
        activation: activation of the inner layer. Defaults to "relu" (the paper).
        gated: bool. Gate the inner activations by a linear projection (`gate_dense`).
            Defaults to False (the paper).
        kernel_initializer, bias_initializer: initializers of every projection.

    Example:
    >>> ffn = PositionwiseFeedForward(hidden_dim=8, intermediate_dim=32)
    >>> tuple(ffn(keras.ops.ones((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def __init__(
        self,
        hidden_dim,
        intermediate_dim,
        dropout=0.0,
        activation="relu",
        gated=False,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("hidden_dim", hidden_dim)
        check_positive_int("intermediate_dim", intermediate_dim)
        check_rate("dropout", dropout)
        check_bool("gated", gated)
        self.hidden_dim = hidden_dim
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.activation = keras.activations.get(activation)
        self.gated = gated
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def build(self, inputs_shape):
        if inputs_shape[-1] is not None and inputs_shape[-1] != self.hidden_dim:
            raise ValueError(
                f"PositionwiseFeedForward expects inputs of width hidden_dim={self.hidden_dim}. "
                f"Received: inputs.shape={tuple(inputs_shape)}"
            )
        inner_shape = tuple(inputs_shape[:-1]) + (self.intermediate_dim,)
        self.intermediate_dense = self._projection(
            "intermediate_dense", self.intermediate_dim, inputs_shape, activation=self.activation
        )
        self.gate_dense = None
        self.dropout_layer = keras.layers.Dropout(self.dropout, dtype=self.dtype_policy)
        self.output_dense = self._projection("output_dense", self.hidden_dim, inner_shape)
        if self.gated:  # built last: the other projections draw the weights an ungated layer does
            self.gate_dense = self._projection("gate_dense", self.intermediate_dim, inputs_shape)
        self.built = True

    def _projection(self, name, units, inputs_shape, activation=None):
        """A built `Dense` of `units` with fresh copies of the layer's initializers."""
        dense = keras.layers.Dense(
            units,
            activation=activation,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )
        dense.build(inputs_shape)
        return dense

    def call(self, inputs, training=None):
        x = self.intermediate_dense(inputs)
        if self.gate_dense is not None:
            x = x * self.gate_dense(inputs)
        x = self.dropout_layer(x, training=training)
        return self.output_dense(x)

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.hidden_dim,)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "activation": keras.activations.serialize(self.activation),
                "gated": self.gated,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config
