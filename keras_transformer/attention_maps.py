"""Attention weights of a sentence pair, per layer and head, with the tokens they join.

`attention_maps` runs the model teacher-forced on one (source, target) pair and keeps
every attention probability matrix: the encoder's self-attention, the decoder's masked
self-attention and its attention over the encoder (Vaswani et al., 2017, 3.2.3), from
the same layer objects that training built (`Transformer.encode` / `decode` with
`return_attention_scores=True`). `keras_transformer.plotting.plot_attention_maps`
draws them.
"""

import dataclasses

import keras
import numpy as np

from keras_transformer.special_tokens import BOS_ID, EOS_ID


@dataclasses.dataclass(frozen=True)
class AttentionMaps:
    """Attention probabilities of one sentence pair.

    Queries are rows, keys columns; each row sums to 1 over the keys it may see.

    Args:
        source_tokens: list of str, the encoder input's pieces, EOS last (S of them).
        target_tokens: list of str, the decoder input's pieces, BOS first (T of them).
        encoder_self_attention: list (one per encoder layer) of float32 `[N, S, S]`.
        decoder_self_attention: list (one per decoder layer) of float32 `[N, T, T]`.
        cross_attention: list (one per decoder layer) of float32 `[N, T, S]`.
    """

    source_tokens: list
    target_tokens: list
    encoder_self_attention: list
    decoder_self_attention: list
    cross_attention: list


def attention_maps(model, tokenizer, source, target=None):
    """The attention maps of `model` reading `source` and producing `target`.

    The source is tokenized with EOS appended and the target with BOS prepended, as in
    training; both are cut to `config.max_length`. Without a `target`, the model's own
    greedy translation of the source is used.

    Args:
        model: a `keras_transformer.Transformer`.
        tokenizer: its `SubwordTokenizer`.
        source: str, the source sentence.
        target: str or None, the target sentence.

    Returns:
        An `AttentionMaps`.

    Example:
    >>> maps = attention_maps(model, tokenizer, "the cat sat", "die Katze saß")
    >>> maps.cross_attention[0].shape  # [heads, target tokens + BOS, source tokens + EOS]
    (4, 5, 4)
    """
    for name, value in (("source", source), ("target", target)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"`{name}` must be a str. Received: {type(value).__name__}")
    if not source.strip():
        raise ValueError("`source` is empty; attention maps need at least one token.")
    limit = model.config.max_length - 1  # room for EOS / BOS
    source_ids = tokenizer.encode([source])[0][:limit] + [EOS_ID]
    encoder_inputs = np.array([source_ids], "int32")
    encoder_outputs, padding_mask, encoder_scores = model.encode(
        encoder_inputs, return_attention_scores=True
    )
    if target is None:
        from keras_transformer.compiled import compile_decoder

        # Compiled (or, on PyTorch, run without autograd): one sentence, one trace.
        tokens, _ = compile_decoder(model, "greedy", jit_compile=False)(encoder_inputs)
        target_ids = [int(i) for i in keras.ops.convert_to_numpy(tokens)[0] if i not in (0, EOS_ID)]
    else:
        target_ids = tokenizer.encode([target])[0]
    decoder_ids = [BOS_ID] + target_ids[:limit]
    _, decoder_scores = model.decode(
        np.array([decoder_ids], "int32"),
        encoder_outputs,
        padding_mask,
        return_attention_scores=True,
    )

    def first(scores):
        return keras.ops.convert_to_numpy(keras.ops.cast(scores, "float32"))[0]

    return AttentionMaps(
        source_tokens=[tokenizer.id_to_piece(i) for i in source_ids],
        target_tokens=[tokenizer.id_to_piece(i) for i in decoder_ids],
        encoder_self_attention=[first(scores) for scores in encoder_scores],
        decoder_self_attention=[first(scores["self_attention"]) for scores in decoder_scores],
        cross_attention=[first(scores["cross_attention"]) for scores in decoder_scores],
    )


__all__ = ["AttentionMaps", "attention_maps"]
