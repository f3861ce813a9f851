"""One layer of the Transformer encoder stack."""

import keras

from keras_transformer.layers import masks
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.residual import ResidualBlock
from keras_transformer.layers.initializers import clone_initializer


@keras.saving.register_keras_serializable(package="keras_transformer")
class EncoderBlock(ResidualBlock):
    """Encoder layer: self-attention then the feed-forward network (Vaswani et al., 2017, 3.1).

    Each sub-layer sits in a residual connection with layer normalization, post-norm as
    in the paper or pre-norm with `norm_first=True` (see `ResidualBlock`). Padded source
    positions are excluded as keys through `padding_mask`; their own outputs are
    computed but meaningless, and later layers never attend to them.

    Args: see `ResidualBlock`.

    Call arguments:
        inputs: `[B, S, D]` source representations.
        padding_mask: optional boolean `[B, S]`, True on real tokens.
        attention_mask: optional boolean `[B, S, S]`, True where a query may attend a
            key; ANDed with `padding_mask`.
        return_attention_scores: bool. Also return `[B, N, S, S]` probabilities.
        training: bool.

    Example:
    >>> block = EncoderBlock(num_heads=2, intermediate_dim=16)
    >>> tuple(block(keras.ops.ones((2, 5, 8))).shape)
    (2, 5, 8)
    """

    def build(self, inputs_shape):
        hidden_dim = inputs_shape[-1]
        head_dim = self._head_dim(hidden_dim)
        self.self_attention = MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=head_dim,
            dropout=self.attention_dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name="self_attention",
        )
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm = self._build_norm("self_attention_norm", inputs_shape)
        self.self_attention_dropout = self._build_dropout("self_attention_dropout")
        self._build_feed_forward(inputs_shape)
        self.built = True

    def call(
        self, inputs, padding_mask=None, attention_mask=None, return_attention_scores=False, training=None
    ):
        keys = None if padding_mask is None else masks.key_padding_mask(padding_mask)
        attention_mask = masks.merge_masks(keys, attention_mask)
        x, scores, _ = self._attention_sublayer(
            inputs,
            self.self_attention,
            self.self_attention_norm,
            self.self_attention_dropout,
            attention_mask=attention_mask,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        x = self._feed_forward_sublayer(x, training)
        return (x, scores) if return_attention_scores else x
