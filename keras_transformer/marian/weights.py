"""Hugging Face Marian weight names -> this package's layers, and the copy between them.

| Marian (`model.` prefix)                        | here                                      |
|---|---|
| `shared.weight` (= both `embed_tokens`, `lm_head`) | `token_embedding/embeddings`, rows permuted |
| `final_logits_bias` (outside `model.`)          | `token_embedding/output_bias`, permuted     |
| `{side}.embed_positions.weight` (or computed)   | `{side}_position_encoding/position_embeddings` |
| `{side}.layers.i.self_attn.{q,k,v,out}_proj`    | `{side}_layer_i/self_attention/{query,key,value,attention_output}` |
| `decoder.layers.i.encoder_attn.*`               | `decoder_layer_i/cross_attention/*`        |
| `{side}.layers.i.self_attn_layer_norm`          | `{side}_layer_i/self_attention_norm`       |
| `decoder.layers.i.encoder_attn_layer_norm`      | `decoder_layer_i/cross_attention_norm`     |
| `{side}.layers.i.fc1`, `fc2`                    | `{side}_layer_i/feed_forward/{intermediate,output}_dense` |
| `{side}.layers.i.final_layer_norm`              | `{side}_layer_i/feed_forward_norm`         |

torch's `Linear` stores `[out, in]`, Keras' `Dense` `[in, out]`: kernels are
transposed. Heads are contiguous blocks of the projection's outputs in both, so no other
reshuffling is needed. Every weight of the checkpoint must be used: one that is left
over is something this package would silently drop, so it is refused.
"""

import numpy as np

from keras_transformer.marian.checkpoint import marian_position_table

# Names that may hold the one shared embedding matrix (all tied in a Marian model).
_EMBEDDING_NAMES = (
    "model.shared.weight",
    "model.encoder.embed_tokens.weight",
    "model.decoder.embed_tokens.weight",
    "lm_head.weight",
)
_LOGITS_BIAS = "final_logits_bias"


def load_marian_weights(model, weights, vocabulary):
    """Copies Marian's `weights` ({name: numpy}) into `model`, permuting vocabulary rows.

    Args:
        model: a `Transformer` built from `checkpoint.transformer_config`.
        weights: {name: float32 array}, from `checkpoint.read_weights`.
        vocabulary: the `MarianVocabulary` whose `marian_rows` orders our ids.

    Raises:
        ValueError: a weight is missing, has another shape, or is not used (named).
    """
    weights = dict(weights)
    config = model.config
    rows = vocabulary.marian_rows

    embedding = _shared_embedding(weights)
    if embedding.shape != (vocabulary.size, config.d_model):
        raise ValueError(
            f"The embedding matrix has shape {embedding.shape}; config.json says "
            f"({vocabulary.size}, {config.d_model})."
        )
    token_embedding = model.get_layer("token_embedding")
    token_embedding.embeddings.assign(embedding[rows])
    bias = weights.pop(_LOGITS_BIAS, np.zeros((1, vocabulary.size), "float32")).reshape(-1)
    token_embedding.logits_bias.assign(_checked(bias, (vocabulary.size,), _LOGITS_BIAS)[rows])

    for side, count in (("encoder", config.num_encoder_layers), ("decoder", config.num_decoder_layers)):
        prefix = f"model.{side}."
        table = weights.pop(prefix + "embed_positions.weight", None)
        if table is None:
            table = marian_position_table(config.max_length, config.d_model)
        positions = model.get_layer(f"{side}_position_encoding").position_embeddings
        positions.assign(_checked(table, tuple(positions.shape), prefix + "embed_positions.weight"))
        for index in range(count):
            block = model.get_layer(f"{side}_layer_{index}")
            layer = f"{prefix}layers.{index}."
            _attention(block.self_attention, weights, layer + "self_attn.")
            _norm(block.self_attention_norm, weights, layer + "self_attn_layer_norm.")
            if side == "decoder":
                _attention(block.cross_attention, weights, layer + "encoder_attn.")
                _norm(block.cross_attention_norm, weights, layer + "encoder_attn_layer_norm.")
            _dense(block.feed_forward.intermediate_dense, weights, layer + "fc1.")
            _dense(block.feed_forward.output_dense, weights, layer + "fc2.")
            _norm(block.feed_forward_norm, weights, layer + "final_layer_norm.")
    if weights:
        raise ValueError(
            "The checkpoint holds weights this package has no place for, so importing "
            f"would drop them: {sorted(weights)[:8]}"
        )


def _shared_embedding(weights):
    """The shared matrix, popping every tied copy; refuses copies that differ."""
    present = [name for name in _EMBEDDING_NAMES if name in weights]
    if not present:
        raise ValueError(f"The checkpoint has no embedding matrix: none of {_EMBEDDING_NAMES}.")
    matrix = weights[present[0]]
    for name in present:
        other = weights.pop(name)
        if other.shape != matrix.shape or not np.array_equal(other, matrix):
            raise ValueError(
                f"{name} differs from {present[0]}: the checkpoint's embeddings (or its output "
                "projection, tie_word_embeddings=False) are not tied, and this package ties "
                "one matrix for both embeddings and the pre-softmax projection."
            )
    return matrix


def _attention(attention, weights, prefix):
    for ours, theirs in (
        (attention.query_dense, "q_proj."),
        (attention.key_dense, "k_proj."),
        (attention.value_dense, "v_proj."),
        (attention.output_dense, "out_proj."),
    ):
        _dense(ours, weights, prefix + theirs)


def _dense(dense, weights, prefix):
    kernel = _pop(weights, prefix + "weight").T  # torch [out, in] -> Keras [in, out]
    dense.kernel.assign(_checked(kernel, tuple(dense.kernel.shape), prefix + "weight (transposed)"))
    dense.bias.assign(_checked(_pop(weights, prefix + "bias"), tuple(dense.bias.shape), prefix + "bias"))


def _norm(norm, weights, prefix):
    norm.gamma.assign(_checked(_pop(weights, prefix + "weight"), tuple(norm.gamma.shape), prefix + "weight"))
    norm.beta.assign(_checked(_pop(weights, prefix + "bias"), tuple(norm.beta.shape), prefix + "bias"))


def _pop(weights, name):
    if name not in weights:
        raise ValueError(f"The checkpoint has no weight {name!r}.")
    return weights.pop(name)


def _checked(value, shape, name):
    if tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(value.shape)}; expected {tuple(shape)}.")
    return value


__all__ = ["load_marian_weights"]
