"""One layer of the Transformer decoder stack."""

import keras

from keras_transformer.layers import masks
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.residual import ResidualBlock
from keras_transformer.layers.initializers import clone_initializer


@keras.saving.register_keras_serializable(package="keras_transformer")
class DecoderBlock(ResidualBlock):
    """Decoder layer: causal self-attention, cross-attention, feed-forward (Vaswani et al., 2017, 3.1).

    Self-attention is causal: position `i` sees target positions `<= i` (and not the
    target's padding). Cross-attention sees every real source position (`encoder_padding_mask`).
    Each sub-layer sits in the residual connection of `ResidualBlock`.

    For incremental decoding pass `self_attention_cache` (`[B, 2, T_max, N, H]`) and
    `self_attention_cache_update_index` (the position of the fed token(s)); the call then
    returns `(outputs, self_attention_cache)` with this step's keys and values written in.
    `cross_attention_cache` (from `compute_cross_attention_cache`) projects the encoder
    output once instead of at every step.

    Args: see `ResidualBlock`.

    Call arguments:
        inputs: `[B, T, D]` target representations.
        encoder_outputs: `[B, S, D]` encoder output.
        decoder_padding_mask: optional boolean `[B, T]`, True on real target tokens.
        encoder_padding_mask: optional boolean `[B, S]`, True on real source tokens.
        self_attention_mask: optional boolean `[B, T, T]`, ANDed with the causal and
            padding masks.
        cross_attention_mask: optional boolean `[B, T, S]`, ANDed with
            `encoder_padding_mask`.
        self_attention_cache: optional `[B, 2, T_max, N, H]`.
        self_attention_cache_update_index: optional int scalar.
        cross_attention_cache: optional `[B, 2, S, N, H]`.
        return_attention_scores: bool. Also return a dict with the `[B, N, T, T]`
            self-attention and `[B, N, T, S]` cross-attention probabilities.
        training: bool.

    Example:
    >>> block = DecoderBlock(num_heads=2, intermediate_dim=16)
    >>> tuple(block(keras.ops.ones((2, 4, 8)), keras.ops.ones((2, 5, 8))).shape)
    (2, 4, 8)
    """

    def build(self, inputs_shape, encoder_outputs_shape):
        hidden_dim = inputs_shape[-1]
        head_dim = self._head_dim(hidden_dim)
        self.self_attention = self._attention("self_attention", head_dim)
        self.self_attention.build(inputs_shape, inputs_shape)
        self.self_attention_norm = self._build_norm("self_attention_norm", inputs_shape)
        self.self_attention_dropout = self._build_dropout("self_attention_dropout")
        self.cross_attention = self._attention("cross_attention", head_dim)
        self.cross_attention.build(inputs_shape, encoder_outputs_shape)
        self.cross_attention_norm = self._build_norm("cross_attention_norm", inputs_shape)
        self.cross_attention_dropout = self._build_dropout("cross_attention_dropout")
        self._build_feed_forward(inputs_shape)
        self.built = True

    def _attention(self, name, head_dim):
        return MultiHeadAttention(
            num_heads=self.num_heads,
            key_dim=head_dim,
            dropout=self.attention_dropout,
            kernel_initializer=clone_initializer(self.kernel_initializer),
            bias_initializer=clone_initializer(self.bias_initializer),
            dtype=self.dtype_policy,
            name=name,
        )

    def compute_cross_attention_cache(self, encoder_outputs):
        """Keys and values of the encoder output for this layer, `[B, 2, S, N, H]`."""
        return self.cross_attention.compute_cross_attention_cache(encoder_outputs)

    def call(
        self,
        inputs,
        encoder_outputs,
        decoder_padding_mask=None,
        encoder_padding_mask=None,
        self_attention_mask=None,
        cross_attention_mask=None,
        self_attention_cache=None,
        self_attention_cache_update_index=None,
        cross_attention_cache=None,
        return_attention_scores=False,
        training=None,
    ):
        query_length = keras.ops.shape(inputs)[1]
        if self_attention_cache is None:
            self_mask = masks.decoder_self_attention_mask(decoder_padding_mask, query_length)
        else:
            # One step (or a few) against the cache: keys at positions <= index + i.
            self_mask = masks.decoder_self_attention_mask(
                decoder_padding_mask,
                query_length,
                offset=self_attention_cache_update_index,
                key_length=keras.ops.shape(self_attention_cache)[2],
            )
        self_mask = masks.merge_masks(self_mask, self_attention_mask)
        cross_mask = masks.merge_masks(
            None if encoder_padding_mask is None else masks.key_padding_mask(encoder_padding_mask),
            cross_attention_mask,
        )
        x, self_scores, new_cache = self._attention_sublayer(
            inputs,
            self.self_attention,
            self.self_attention_norm,
            self.self_attention_dropout,
            attention_mask=self_mask,
            cache=self_attention_cache,
            cache_update_index=self_attention_cache_update_index,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        x, cross_scores, _ = self._attention_sublayer(
            x,
            self.cross_attention,
            self.cross_attention_norm,
            self.cross_attention_dropout,
            context=encoder_outputs,
            attention_mask=cross_mask,
            cache=cross_attention_cache,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        x = self._feed_forward_sublayer(x, training)

        results = (x,)
        if return_attention_scores:
            results += ({"self_attention": self_scores, "cross_attention": cross_scores},)
        if self_attention_cache is not None:
            results += (new_cache,)
        return results[0] if len(results) == 1 else results
