"""The encoder-decoder Transformer as a functional `keras.Model`."""

import keras
import numpy as np
from keras import ops

from keras_transformer.model.config import TransformerConfig
from keras_transformer.layers import masks
from keras_transformer.layers.decoder import DecoderBlock
from keras_transformer.layers.embedding import (
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
)
from keras_transformer.layers.encoder import EncoderBlock


@keras.saving.register_keras_serializable(package="keras_transformer")
class Transformer(keras.Model):
    """The Transformer of Vaswani et al., 2017, built with the functional API.

    Inputs are a dict `{"encoder_inputs": int32 [B, S], "decoder_inputs": int32 [B, T]}`
    with pad id 0; the output is float32 logits `[B, T, vocab_size]`. Padding masks are
    derived from the ids, so callers never pass masks.

    Besides the functional graph used by `fit`/`predict`, the model exposes the pieces
    that decoding needs, built from the very same layer objects: `encode`,
    `initial_cache` and `decode_step` (one token at a time through the key/value cache).
    The stacks are reachable as `encoder_layers` / `decoder_layers` and by name
    (`model.get_layer("decoder_layer_0")`).

    Args:
        config: `TransformerConfig` (or its dict form, as stored by `get_config`).

    Example:
    >>> config = TransformerConfig.from_preset("tiny", vocab_size=32)
    >>> model = Transformer(config)
    >>> logits = model({"encoder_inputs": keras.ops.ones((2, 5), "int32"),
    ...                 "decoder_inputs": keras.ops.ones((2, 4), "int32")})
    >>> logits.shape
    (2, 4, 32)
    """

    def __init__(self, config, name="transformer", **kwargs):
        if isinstance(config, dict):
            config = TransformerConfig.from_dict(config)
        if not isinstance(config, TransformerConfig):
            raise ValueError(
                f"`config` must be a TransformerConfig. Received: {type(config).__name__}"
            )
        dtype = kwargs.pop("dtype", None) or config.dtype_policy
        dtype = keras.dtype_policies.get(dtype) if dtype else keras.config.dtype_policy()
        layers = _build_layers(config, dtype)

        encoder_inputs = keras.Input(shape=(None,), dtype="int32", name="encoder_inputs")
        decoder_inputs = keras.Input(shape=(None,), dtype="int32", name="decoder_inputs")
        encoder_outputs, encoder_mask = _encode(layers, config, encoder_inputs, training=None)
        logits = _decode(layers, config, decoder_inputs, encoder_outputs, encoder_mask, None)
        super().__init__(
            inputs={"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs},
            outputs=logits,
            name=name,
            **kwargs,
        )
        self.config = config
        self._layers_by_role = layers

    def call(self, inputs, training=None, mask=None):
        # Eager calls check token ids: out-of-range ids would otherwise give NaN logits
        # on JAX and fail differently on each other backend. Inside compiled
        # functions (fit, predict, tf.function, jax.jit) values are not known, so the
        # check happens at the data and translation boundaries instead.
        if isinstance(inputs, dict):
            for key in ("encoder_inputs", "decoder_inputs"):
                if key in inputs and _is_concrete(inputs[key]):
                    check_token_ids(inputs[key], self.config.vocab_size, name=key)
        return super().call(inputs, training=training, mask=mask)

    # ----------------------------------------------------------------- pieces
    @property
    def encoder_layers(self):
        return list(self._layers_by_role["encoder_layers"])

    @property
    def decoder_layers(self):
        return list(self._layers_by_role["decoder_layers"])

    def encode(self, encoder_inputs, training=False, return_attention_scores=False):
        """Runs the encoder stack: `(outputs [B, S, D], padding_mask [B, S])`.

        With `return_attention_scores`, also a list of `[B, N, S, S]` per layer.
        """
        return _encode(
            self._layers_by_role,
            self.config,
            encoder_inputs,
            training=training,
            return_attention_scores=return_attention_scores,
        )

    def decode(
        self,
        decoder_inputs,
        encoder_outputs,
        encoder_padding_mask,
        training=False,
        return_attention_scores=False,
    ):
        """Teacher-forced decoder pass: logits `[B, T, vocab]` (plus scores if asked)."""
        return _decode(
            self._layers_by_role,
            self.config,
            decoder_inputs,
            encoder_outputs,
            encoder_padding_mask,
            training,
            return_attention_scores=return_attention_scores,
        )

    def initial_cache(self, encoder_outputs, max_target_length):
        """Caches for `decode_step`: zeroed self-attention keys/values, projected encoder.

        Returns `(self_caches, cross_caches)`, tuples with one entry per decoder layer:
        `[B, 2, max_target_length, N, H]` and `[B, 2, S, N, H]`.
        """
        batch = ops.shape(encoder_outputs)[0]
        config = self.config
        zeros_shape = (batch, 2, max_target_length, config.num_heads, config.head_dim)
        self_caches = tuple(
            ops.zeros(zeros_shape, dtype=layer.compute_dtype) for layer in self.decoder_layers
        )
        cross_caches = tuple(
            layer.compute_cross_attention_cache(encoder_outputs) for layer in self.decoder_layers
        )
        return self_caches, cross_caches

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_padding_mask):
        """Decodes the tokens at position `index` (`[B, 1]` ids) against the caches.

        Returns `(logits [B, vocab] float32, self_caches)` with this step's keys and
        values written at `index`. Equal to the teacher-forced `decode` at that position.
        """
        layers = self._layers_by_role
        x = _embed(layers, "decoder", token_ids, start_index=index, training=False)
        new_caches = []
        for layer, self_cache, cross_cache in zip(layers["decoder_layers"], self_caches, cross_caches):
            x, self_cache = layer(
                x,
                None,
                encoder_padding_mask=encoder_padding_mask,
                self_attention_cache=self_cache,
                self_attention_cache_update_index=index,
                cross_attention_cache=cross_cache,
                training=False,
            )
            new_caches.append(self_cache)
        logits = _output_logits(layers, self.config, x)
        return logits[:, -1, :], tuple(new_caches)

    # ------------------------------------------------------------ serialization
    def get_config(self):
        return {"config": self.config.to_dict(), "name": self.name, "trainable": self.trainable}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        return cls(TransformerConfig.from_dict(config.pop("config")), **config)


def check_token_ids(token_ids, vocab_size, name="token_ids"):
    """Raises ValueError unless `token_ids` is an integer `[B, L]` array of ids in `[0, vocab_size)`."""
    values = np.asarray(ops.convert_to_numpy(token_ids))
    if not np.issubdtype(values.dtype, np.integer):
        raise ValueError(
            f"`{name}` must hold integer token ids. Received: dtype={values.dtype}. "
            "Tokenize text first; ids are never floats."
        )
    if values.ndim != 2:
        raise ValueError(
            f"`{name}` must have shape [batch, length]. Received: shape={values.shape}"
        )
    bad = (values < 0) | (values >= vocab_size)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"`{name}` holds token id {int(values[where])} at position {where}, outside "
            f"[0, vocab_size={vocab_size}). Was the data tokenized with another vocabulary?"
        )


def _is_concrete(x):
    """True for a value known now (NumPy, eager TF, JAX array, torch tensor), False when traced."""
    if isinstance(x, (np.ndarray, list, tuple)):
        return True
    cls = type(x)
    module, name = cls.__module__, cls.__name__
    return (
        name == "EagerTensor"
        or (module.startswith("jaxlib") and name == "ArrayImpl")
        or (module.startswith("torch") and name == "Tensor")
    )


def build_transformer(config):
    """Builds the functional Transformer described by `config` (a `TransformerConfig`)."""
    return Transformer(config)


# ------------------------------------------------------------------ internals
def _build_layers(config, dtype):
    def embedding(name):
        return TokenEmbedding(config.vocab_size, config.d_model, dtype=dtype, name=name)

    def positions(name):
        if config.position_encoding == "learned":
            return LearnedPositionEmbedding(config.max_length, dtype=dtype, name=name)
        return SinusoidalPositionEncoding(config.max_length, dtype=dtype, name=name)

    block_args = dict(
        num_heads=config.num_heads,
        intermediate_dim=config.d_ff,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        norm_first=config.norm_first,
        layer_norm_epsilon=config.layer_norm_epsilon,
        dtype=dtype,
    )
    layers = {}
    if config.share_embeddings:
        # One matrix for source, target and the pre-softmax projection (3.4).
        shared = embedding("token_embedding")
        layers["encoder_embedding"] = layers["decoder_embedding"] = shared
        layers["output_projection"] = None
    else:
        layers["encoder_embedding"] = embedding("encoder_token_embedding")
        layers["decoder_embedding"] = embedding("decoder_token_embedding")
        layers["output_projection"] = keras.layers.Dense(
            config.vocab_size, dtype=dtype, name="output_projection"
        )
    for side, count, block in (
        ("encoder", config.num_encoder_layers, EncoderBlock),
        ("decoder", config.num_decoder_layers, DecoderBlock),
    ):
        layers[f"{side}_positions"] = positions(f"{side}_position_encoding")
        layers[f"{side}_dropout"] = keras.layers.Dropout(
            config.dropout, dtype=dtype, name=f"{side}_embedding_dropout"
        )
        layers[f"{side}_layers"] = [
            block(**block_args, name=f"{side}_layer_{i}") for i in range(count)
        ]
        # Pre-norm leaves the residual stream unnormalized: a final LayerNorm closes it.
        layers[f"{side}_final_norm"] = (
            keras.layers.LayerNormalization(
                epsilon=config.layer_norm_epsilon, dtype=dtype, name=f"{side}_final_norm"
            )
            if config.norm_first
            else None
        )
    return layers


def _embed(layers, side, token_ids, start_index=0, training=None):
    x = layers[f"{side}_embedding"](token_ids)
    x = x + layers[f"{side}_positions"](x, start_index=start_index)
    return layers[f"{side}_dropout"](x, training=training)


def _encode(layers, config, encoder_inputs, training, return_attention_scores=False):
    padding_mask = masks.padding_mask(encoder_inputs)
    x = _embed(layers, "encoder", encoder_inputs, training=training)
    all_scores = []
    for layer in layers["encoder_layers"]:
        x = layer(
            x,
            padding_mask=padding_mask,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        if return_attention_scores:
            x, scores = x
            all_scores.append(scores)
    if layers["encoder_final_norm"] is not None:
        x = layers["encoder_final_norm"](x)
    if return_attention_scores:
        return x, padding_mask, all_scores
    return x, padding_mask


def _decode(
    layers,
    config,
    decoder_inputs,
    encoder_outputs,
    encoder_padding_mask,
    training,
    return_attention_scores=False,
):
    decoder_mask = masks.padding_mask(decoder_inputs)
    x = _embed(layers, "decoder", decoder_inputs, training=training)
    all_scores = []
    for layer in layers["decoder_layers"]:
        x = layer(
            x,
            encoder_outputs,
            decoder_padding_mask=decoder_mask,
            encoder_padding_mask=encoder_padding_mask,
            return_attention_scores=return_attention_scores,
            training=training,
        )
        if return_attention_scores:
            x, scores = x
            all_scores.append(scores)
    logits = _output_logits(layers, config, x)
    return (logits, all_scores) if return_attention_scores else logits


def _output_logits(layers, config, x):
    if layers["decoder_final_norm"] is not None:
        x = layers["decoder_final_norm"](x)
    if layers["output_projection"] is None:
        return layers["decoder_embedding"](x, reverse=True)  # float32 logits
    return ops.cast(layers["output_projection"](x), "float32")
