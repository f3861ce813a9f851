"""The residual wiring shared by encoder and decoder blocks, written once."""

import keras

from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.scale_norm import ScaleNorm
from keras_transformer.checks import (
    check_bool,
    check_choice,
    check_positive_int,
    check_positive_number,
    check_rate,
)
from keras_transformer.layers.initializers import clone_initializer

# What normalizes each sub-layer: the paper's LayerNorm, or ScaleNorm (one learned length).
NORMALIZATIONS = ("layer", "scale")

# Default `context` of `_attention_sublayer`: attend to the sub-layer input itself. A
# sentinel, because None is a valid cross-attention context (its cache holds the keys).
_SELF = object()


class ResidualBlock(keras.layers.Layer):
    """Base of `EncoderBlock` and `DecoderBlock`: sub-layer connections and the FFN.

    Each sub-layer is wrapped as in the paper (Vaswani et al., 2017, 5.4), post-norm:
    `LayerNorm(x + Dropout(Sublayer(x)))`. With `norm_first=True` it is
    `x + Dropout(Sublayer(LayerNorm(x)))` instead: a departure from the paper (Xiong et
    al., 2020) that trains stably without warmup and needs a final LayerNorm after the
    stack, which the model adds.

    Args:
        num_heads: int. Attention heads.
        intermediate_dim: int. Inner width of the feed-forward network (d_ff).
        dropout: float. Residual dropout, P_drop = 0.1 in the paper.
        attention_dropout: float. Dropout on attention probabilities. Defaults to 0.0.
        activation_dropout: float. Dropout inside the FFN. Defaults to 0.0.
        activation: FFN activation. Defaults to "relu" (the paper); "gelu" and
            "swish" serve pretrained models (see `PositionwiseFeedForward`).
        gated_ffn: bool. A gated FFN (GLU variants, see `PositionwiseFeedForward`).
            Defaults to False (the paper).
        norm_first: bool. Pre-norm instead of the paper's post-norm. Defaults to False.
        layer_norm_epsilon: float. Defaults to 1e-6 (tensor2tensor's value; the paper
            does not give one).
        normalization: "layer" (the paper's LayerNorm, the default) or "scale"
            (`ScaleNorm`, Nguyen and Salazar, 2019: `g * x / ||x||`, one learned `g`).
        kernel_initializer, bias_initializer: initializers of every projection.
    """

    def __init__(
        self,
        num_heads,
        intermediate_dim,
        dropout=0.1,
        attention_dropout=0.0,
        activation_dropout=0.0,
        activation="relu",
        gated_ffn=False,
        norm_first=False,
        layer_norm_epsilon=1e-6,
        normalization="layer",
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("intermediate_dim", intermediate_dim)
        check_rate("dropout", dropout)
        check_rate("attention_dropout", attention_dropout)
        check_rate("activation_dropout", activation_dropout)
        check_bool("norm_first", norm_first)
        check_bool("gated_ffn", gated_ffn)
        # A NaN or infinite epsilon would make every normalized output NaN or zero.
        check_positive_number("layer_norm_epsilon", layer_norm_epsilon)
        check_choice("normalization", normalization, NORMALIZATIONS)
        self.num_heads = num_heads
        self.intermediate_dim = intermediate_dim
        self.dropout = dropout
        self.attention_dropout = attention_dropout
        self.activation_dropout = activation_dropout
        self.activation = keras.activations.get(activation)
        self.gated_ffn = gated_ffn
        self.norm_first = norm_first
        self.layer_norm_epsilon = layer_norm_epsilon
        self.normalization = normalization
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)

    def _head_dim(self, hidden_dim):
        if hidden_dim % self.num_heads != 0:
            raise ValueError(
                f"The hidden size must be divisible by `num_heads`. "
                f"Received: hidden size={hidden_dim}, num_heads={self.num_heads}"
            )
        return hidden_dim // self.num_heads

    def _build_norm(self, name, inputs_shape):
        norm = make_norm(self.normalization, self.layer_norm_epsilon, self.dtype_policy, name)
        norm.build(inputs_shape)
        return norm

    def _build_dropout(self, name):
        return keras.layers.Dropout(self.dropout, dtype=self.dtype_policy, name=name)

    def _build_feed_forward(self, inputs_shape):
        self.feed_forward = PositionwiseFeedForward(
            hidden_dim=inputs_shape[-1],
            intermediate_dim=self.intermediate_dim,
            dropout=self.activation_dropout,
            activation=self.activation,
            gated=self.gated_ffn,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name="feed_forward",
        )
        self.feed_forward.build(inputs_shape)
        self.feed_forward_norm = self._build_norm("feed_forward_norm", inputs_shape)
        self.feed_forward_dropout = self._build_dropout("feed_forward_dropout")

    def _sublayer(self, x, norm, dropout, sublayer, training):
        """Applies `sublayer` inside the residual connection: returns `(x, extras)`.

        `sublayer` maps the (possibly normalized) input to `(outputs, extras)`; extras
        (attention scores, caches) are handed back to the caller untouched.
        """
        inputs = norm(x) if self.norm_first else x
        outputs, extras = sublayer(inputs)
        x = x + dropout(outputs, training=training)
        if not self.norm_first:
            x = norm(x)
        return x, extras

    def _attention_sublayer(
        self,
        x,
        attention,
        norm,
        dropout,
        context=_SELF,
        attention_mask=None,
        cache=None,
        cache_update_index=None,
        return_attention_scores=False,
        training=None,
    ):
        """Attention inside the residual connection: returns `(x, scores, cache)`.

        Self-attention by default (queries, keys and values are the sub-layer input);
        with `context`, cross-attention to it: the encoder output `[B, S, D]`, or None
        when `cache` already holds its keys and values. `scores` is None unless
        `return_attention_scores`; `cache` is the updated cache, None without one.
        """

        def attend(inputs):
            result = attention(
                inputs,
                inputs if context is _SELF else context,
                attention_mask=attention_mask,
                cache=cache,
                cache_update_index=cache_update_index,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            # MultiHeadAttention returns outputs, then scores if asked, then the cache if given.
            result = result if isinstance(result, tuple) else (result,)
            scores = result[1] if return_attention_scores else None
            new_cache = result[-1] if cache is not None else None
            return result[0], (scores, new_cache)

        x, (scores, new_cache) = self._sublayer(x, norm, dropout, attend, training)
        return x, scores, new_cache

    def _feed_forward_sublayer(self, x, training):
        x, _ = self._sublayer(
            x,
            self.feed_forward_norm,
            self.feed_forward_dropout,
            lambda inputs: (self.feed_forward(inputs, training=training), None),
            training,
        )
        return x

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "intermediate_dim": self.intermediate_dim,
                "dropout": self.dropout,
                "attention_dropout": self.attention_dropout,
                "activation_dropout": self.activation_dropout,
                "activation": keras.activations.serialize(self.activation),
                "gated_ffn": self.gated_ffn,
                "norm_first": self.norm_first,
                "layer_norm_epsilon": self.layer_norm_epsilon,
                "normalization": self.normalization,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            }
        )
        return config


def make_norm(normalization, epsilon, dtype, name):
    """A `LayerNormalization` ("layer") or a `ScaleNorm` ("scale") named `name`, not built.

    `epsilon` is LayerNorm's variance epsilon; ScaleNorm keeps its own (1e-5, a norm's floor),
    since a variance's floor of 1e-6 and a norm's are not the same quantity.
    """
    check_choice("normalization", normalization, NORMALIZATIONS)
    if normalization == "scale":
        return ScaleNorm(dtype=dtype, name=name)
    return keras.layers.LayerNormalization(epsilon=epsilon, dtype=dtype, name=name)
