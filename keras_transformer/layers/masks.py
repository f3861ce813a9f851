"""Attention masks: the only place masks are built.

Every mask here is boolean with True meaning "may attend", the convention of
`keras.ops.dot_product_attention`. Masks are combined with logical AND; they are never
turned into `-1e9` additions, which overflow in float16.

Shapes use the letters of the attention docstrings: B batch, T query (target) length,
S key (source) length.
"""

from keras import ops

from keras_transformer.special_tokens import PAD_ID


def padding_mask(token_ids, pad_id=PAD_ID):
    """Returns a `[B, S]` boolean mask that is True on real tokens, False on padding."""
    return ops.not_equal(token_ids, pad_id)


def key_padding_mask(key_mask):
    """Lifts a `[B, S]` key padding mask to `[B, 1, S]`, broadcastable over queries."""
    return ops.expand_dims(ops.cast(key_mask, "bool"), axis=1)


def causal_mask(query_length, key_length=None, offset=0):
    """Returns a `[T, S]` mask where query `i` may attend key `j` iff `j <= i + offset`.

    `offset` is the position of the first query: 0 for a full teacher-forced pass, the
    cache update index when one new token attends to a cache of earlier ones.
    """
    key_length = query_length if key_length is None else key_length
    query_positions = ops.arange(query_length, dtype="int32")[:, None] + offset
    key_positions = ops.arange(key_length, dtype="int32")[None, :]
    return ops.greater_equal(query_positions, key_positions)


def merge_masks(*masks):
    """ANDs boolean masks of broadcastable shapes; `None` entries are skipped.

    Returns None when every entry is None, meaning "attend everywhere".
    """
    merged = None
    for mask in masks:
        if mask is None:
            continue
        mask = ops.cast(mask, "bool")
        merged = mask if merged is None else ops.logical_and(merged, mask)
    return merged


def decoder_self_attention_mask(decoder_mask=None, query_length=None, offset=0, key_length=None):
    """Causal mask merged with the decoder's own key padding: `[B, T, S]` or `[T, S]`."""
    causal = causal_mask(query_length, key_length=key_length, offset=offset)
    keys = None if decoder_mask is None else key_padding_mask(decoder_mask)
    return merge_masks(causal[None, :, :] if keys is not None else causal, keys)


def any_key_visible(mask):
    """True for each query row that may attend at least one key (`[..., T, 1]`).

    A row with no visible key (a query against an all-padding source) gets zeros as its
    attention output instead of the NaN that a softmax over no entries would give.
    """
    return ops.any(mask, axis=-1, keepdims=True)


__all__ = [
    "padding_mask",
    "key_padding_mask",
    "causal_mask",
    "merge_masks",
    "decoder_self_attention_mask",
    "any_key_visible",
]
