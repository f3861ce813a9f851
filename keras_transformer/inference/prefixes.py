"""Forced target prefixes: decoding that continues from given first output tokens.

Interactive translation (a translator types the first words, the model completes the
sentence) and terminology constraints (the output must start with a given term) give
the first target tokens. The searches of `keras_transformer.inference.decoding` take
them as `prefix_ids`, int `[B, P]`: row `b` holds sentence `b`'s prefix, then 0 (PAD)
to the width P. At step `i < len(prefix)` only the prefix's `i`-th token may be chosen;
its log-probability counts in the score as any other token's, so a hypothesis' score
is the model's log-probability of the whole output, prefix included. Afterwards the
search continues as without a prefix, from the key/value cache the forced steps filled.

A row of zeros forces nothing, so sentences with and without a prefix share a batch.
A prefix must leave room for EOS within the sentence's length limit (`decode_lengths`);
`check_prefixes_fit` says so eagerly. Inside a compiled search nothing can raise, and
the limit wins: EOS is forced at a sentence's last position, prefix or not.

Shapes use B batch, P prefix width.
"""

import keras
import numpy as np
from keras import ops

from keras_transformer import checks
from keras_transformer.special_tokens import BOS_ID, PAD_ID


def forced_tokens(prefix_ids, index, pad_id=PAD_ID):
    """int32 `[B, 1]`: the token each row's prefix forces at step `index`, `pad_id` where none.

    Args:
        prefix_ids: int `[B, P]`, prefixes padded with `pad_id`.
        index: int32 scalar (tensor), the position being generated (0 = the first token).
        pad_id: the padding id, meaning "nothing forced". Defaults to 0.

    Example:
    >>> prefix_ids = keras.ops.array([[7, 8], [9, 0]])
    >>> keras.ops.convert_to_numpy(forced_tokens(prefix_ids, 1)).tolist()
    [[8], [0]]
    >>> keras.ops.convert_to_numpy(forced_tokens(prefix_ids, 2)).tolist()  # past the width
    [[0], [0]]
    """
    prefix_ids = ops.cast(prefix_ids, "int32")
    width = ops.shape(prefix_ids)[1]
    column = ops.take(prefix_ids, ops.minimum(index, width - 1), axis=1)  # [B]
    column = ops.where(ops.less(index, width), column, ops.cast(pad_id, "int32"))
    return column[:, None]


def prefix_lengths(prefix_ids, pad_id=PAD_ID):
    """int `[B]` (NumPy): the number of tokens of each prefix (its non-padding ids)."""
    return np.sum(np.asarray(prefix_ids) != pad_id, axis=1)


def check_prefix_ids(prefix_ids, batch_size, vocab_size):
    """`prefix_ids` as int32 `[B, P]`, after checks of its shape and ids (eager values only).

    Raises:
        ValueError: not `[batch_size, P]` integers, or an id outside `[0, vocab_size)`, or
            BOS (never generated, so it cannot be forced).
    """
    prefix_ids = ops.convert_to_tensor(prefix_ids)
    dtype = keras.backend.standardize_dtype(prefix_ids.dtype)
    if len(prefix_ids.shape) != 2 or "int" not in dtype:
        raise ValueError(
            "`prefix_ids` must be integer token ids of shape [batch, prefix_length]. "
            f"Received: shape={tuple(prefix_ids.shape)}, dtype={dtype}"
        )
    if checks.is_int(batch_size) and prefix_ids.shape[0] not in (None, batch_size):
        raise ValueError(
            f"`prefix_ids` must have one row per sentence: {batch_size} rows. "
            f"Received: shape={tuple(prefix_ids.shape)}"
        )
    if checks.is_concrete(prefix_ids):
        values = ops.convert_to_numpy(prefix_ids)
        checks.check_ids_in_range("prefix_ids", values, vocab_size)
        if np.any(values == BOS_ID):
            where = tuple(int(i) for i in np.argwhere(values == BOS_ID)[0])
            raise ValueError(
                f"`prefix_ids` holds BOS ({BOS_ID}) at position {where}: BOS starts every "
                "output and is never generated, so a prefix cannot force it."
            )
    return ops.cast(prefix_ids, "int32")


def check_prefixes_fit(prefix_ids, limits):
    """Raises ValueError unless each prefix leaves room for EOS within its sentence's limit.

    Checked only where both are concrete (eager); a traced search forces EOS at the limit.

    Args:
        prefix_ids: int `[B, P]`.
        limits: int `[B]`, each sentence's output limit, EOS included (`decode_lengths`).
    """
    if not (checks.is_concrete(prefix_ids) and checks.is_concrete(limits)):
        return
    lengths = prefix_lengths(ops.convert_to_numpy(prefix_ids))
    limits = np.asarray(ops.convert_to_numpy(limits))
    for row, (length, limit) in enumerate(zip(lengths.tolist(), limits.tolist())):
        if length >= limit:
            raise ValueError(
                f"The prefix of sentence {row} has {length} tokens, but that sentence's output "
                f"limit is {limit} tokens, EOS included: a prefix may have at most {limit - 1}."
            )


__all__ = ["forced_tokens", "prefix_lengths", "check_prefix_ids", "check_prefixes_fit"]
