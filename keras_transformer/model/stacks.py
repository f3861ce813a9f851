"""The encoder and decoder stacks of the Transformer (Vaswani et al., 2017, 3.1).

Each stack is a plain Python object that holds its Keras layers (token embedding,
position encoding, embedding dropout, N blocks, the final LayerNorm of pre-norm models,
and for the decoder the pre-softmax projection) and runs them in order. They are
deliberately not Keras layers: the `Transformer` model owns the layers, so their names
(`token_embedding`, `encoder_layer_0`, `decoder_final_norm`, ...) and the weights files
of earlier versions stay valid; a stack only says how the layers are wired.
"""

import random
import zlib

import keras
from keras import ops

from keras_transformer.layers import masks
from keras_transformer.layers.decoder import DecoderBlock
from keras_transformer.layers.embedding import (
    FixedPositionEmbedding,
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
)
from keras_transformer.layers.encoder import EncoderBlock
from keras_transformer.layers.residual import make_norm
from keras_transformer.layers.word_dropout import WordDropout


class _Stack:
    """What both stacks share: embed the ids, run the blocks, close with the final norm."""

    def __init__(
        self,
        token_embedding,
        position_encoding,
        embedding_dropout,
        blocks,
        final_norm=None,
        word_dropout=None,
    ):
        self.token_embedding = token_embedding
        self.position_encoding = position_encoding
        self.embedding_dropout = embedding_dropout
        self.blocks = list(blocks)
        self.final_norm = final_norm
        self.word_dropout = word_dropout

    def embed(self, token_ids, start_index=0, training=None):
        """Token embeddings plus positions from `start_index`, then dropout (3.4, 3.5, 5.4).

        With word dropout, whole token embeddings are dropped before the positions are
        added, so a dropped word keeps its position.
        """
        x = self.token_embedding(token_ids)
        if self.word_dropout is not None:
            x = self.word_dropout(x, training=training)
        x = x + self.position_encoding(x, start_index=start_index)
        return self.embedding_dropout(x, training=training)

    def normalize(self, x):
        """The final LayerNorm of a pre-norm stack; identity for the paper's post-norm."""
        return x if self.final_norm is None else self.final_norm(x)


class EncoderStack(_Stack):
    """Embedding, positions, dropout, N `EncoderBlock`s and the optional final norm.

    Calling it with source ids `[B, S]` returns `(outputs [B, S, D], padding_mask [B, S])`,
    the mask derived from the ids (pad id 0); with `return_attention_scores`, also a
    list of `[B, N, S, S]` probabilities per block.
    """

    def __call__(self, token_ids, training=None, return_attention_scores=False):
        padding_mask = masks.padding_mask(token_ids)
        x = self.embed(token_ids, training=training)
        all_scores = []
        for block in self.blocks:
            x = block(
                x,
                padding_mask=padding_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores:
                x, scores = x
                all_scores.append(scores)
        x = self.normalize(x)
        if return_attention_scores:
            return x, padding_mask, all_scores
        return x, padding_mask


class DecoderStack(_Stack):
    """Embedding, positions, dropout, N `DecoderBlock`s, the optional final norm, logits.

    Calling it runs the teacher-forced pass over target ids `[B, T]` and returns float32
    logits `[B, T, V]` (with `return_attention_scores`, also a list of the blocks' score
    dicts; with `return_states`, also the states the logits are projected from, `[B, T, D]`,
    what a translation memory stores); `step` decodes one position through the key/value
    caches.

    Args:
        *args, **kwargs: the layers both stacks hold (see `_Stack`).
        output_projection: the pre-softmax `Dense` layer, or None to reuse the token
            embedding matrix (shared embeddings, 3.4).
    """

    def __init__(self, *args, output_projection=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.output_projection = output_projection

    def __call__(
        self,
        token_ids,
        encoder_outputs,
        encoder_padding_mask,
        training=None,
        return_attention_scores=False,
        return_states=False,
    ):
        decoder_padding_mask = masks.padding_mask(token_ids)
        x = self.embed(token_ids, training=training)
        all_scores = []
        for block in self.blocks:
            x = block(
                x,
                encoder_outputs,
                decoder_padding_mask=decoder_padding_mask,
                encoder_padding_mask=encoder_padding_mask,
                return_attention_scores=return_attention_scores,
                training=training,
            )
            if return_attention_scores:
                x, scores = x
                all_scores.append(scores)
        states = self.normalize(x)
        outputs = (self.project(states),)
        if return_attention_scores:
            outputs += (all_scores,)
        if return_states:
            outputs += (states,)
        return outputs if len(outputs) > 1 else outputs[0]

    def step(self, token_ids, index, self_caches, cross_caches, encoder_padding_mask, return_states=False):
        """Decodes the tokens `[B, 1]` at position `index` against one cache per block.

        Returns `(logits [B, V] float32, self_caches)`, this step's keys and values
        written at `index` of each block's self-attention cache; with `return_states`,
        `(logits, self_caches, states [B, D])`, the states the logits are projected from.
        """
        x = self.embed(token_ids, start_index=index, training=False)
        new_caches = []
        for block, self_cache, cross_cache in zip(self.blocks, self_caches, cross_caches):
            x, self_cache = block(
                x,
                None,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=self_cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache,
                training=False,
            )
            new_caches.append(self_cache)
        states = self.normalize(x)[:, -1, :]
        logits = self.project(states)
        if return_states:
            return logits, tuple(new_caches), states
        return logits, tuple(new_caches)

    def logits(self, x):
        """Float32 vocabulary logits of the last block's output `[B, T, D]`."""
        return self.project(self.normalize(x))

    def project(self, x):
        """Float32 vocabulary logits of final states `[..., D]` (after the final norm)."""
        if self.output_projection is None:
            return self.token_embedding(x, reverse=True)  # float32 logits
        return ops.cast(self.output_projection(x), "float32")


def build_stacks(config, dtype):
    """Creates the layers `config` describes and returns `(EncoderStack, DecoderStack)`.

    Layer names and creation order are those of every earlier version (embeddings, then
    the encoder's layers, then the decoder's), so saved weights load by name and a
    seeded build draws the same initial weights.
    """

    def token_embedding(name):
        return TokenEmbedding(
            config.vocab_size,
            config.d_model,
            scale=config.scale_embeddings,
            output_bias=config.output_bias,
            fix_norm=config.fix_norm,
            dtype=dtype,
            name=name,
        )

    if config.share_embeddings:
        # One matrix for source, target and the pre-softmax projection (3.4).
        encoder_embedding = decoder_embedding = token_embedding("token_embedding")
        output_projection = None
    else:
        encoder_embedding = token_embedding("encoder_token_embedding")
        decoder_embedding = token_embedding("decoder_token_embedding")
        output_projection = keras.layers.Dense(
            config.vocab_size, dtype=dtype, name="output_projection"
        )
    encoder = EncoderStack(
        encoder_embedding,
        *_stack_layers(config, dtype, "encoder", EncoderBlock, config.num_encoder_layers),
        word_dropout=_word_dropout(config.source_word_dropout, dtype, "encoder"),
    )
    decoder = DecoderStack(
        decoder_embedding,
        *_stack_layers(config, dtype, "decoder", DecoderBlock, config.num_decoder_layers),
        word_dropout=_word_dropout(config.target_word_dropout, dtype, "decoder"),
        output_projection=output_projection,
    )
    return encoder, decoder


def _stack_layers(config, dtype, side, block_class, count):
    """`(position_encoding, embedding_dropout, blocks, final_norm)` of one side, in this order."""
    encoding = {
        "sinusoidal": SinusoidalPositionEncoding,
        "learned": LearnedPositionEmbedding,
        "fixed": FixedPositionEmbedding,
    }[config.position_encoding]
    positions = encoding(config.max_length, dtype=dtype, name=f"{side}_position_encoding")
    dropout = keras.layers.Dropout(config.dropout, dtype=dtype, name=f"{side}_embedding_dropout")
    blocks = [
        block_class(
            num_heads=config.num_heads,
            intermediate_dim=config.d_ff,
            dropout=config.dropout,
            attention_dropout=config.attention_dropout,
            activation_dropout=config.activation_dropout,
            activation=config.activation,
            gated_ffn=config.gated_ffn,
            norm_first=config.norm_first,
            layer_norm_epsilon=config.layer_norm_epsilon,
            normalization=config.normalization,
            dtype=dtype,
            name=f"{side}_layer_{i}",
        )
        for i in range(count)
    ]
    # Pre-norm leaves the residual stream unnormalized: a final norm closes it.
    final_norm = None
    if config.norm_first:
        final_norm = make_norm(config.normalization, config.layer_norm_epsilon, dtype, f"{side}_final_norm")
    return positions, dropout, blocks, final_norm


def _word_dropout(rate, dtype, side):
    """The side's `WordDropout`, or None at rate 0 (the layers of earlier versions).

    A Dropout made without a seed draws one from Python's global generator, which the
    initializers draw from too: that draw would change every initial weight. The seed is
    read from a copy of the generator instead (and mixed with the layer's name), so a
    model with word dropout starts from the same weights as one without, under the same
    `keras.utils.set_random_seed`.
    """
    if rate == 0:
        return None
    name = f"{side}_word_dropout"
    generator = random.Random()
    generator.setstate(random.getstate())
    seed = (generator.getrandbits(31) ^ zlib.crc32(name.encode())) & 0x7FFFFFFF
    return WordDropout(rate, seed=seed, dtype=dtype, name=name)


__all__ = ["EncoderStack", "DecoderStack", "build_stacks"]
