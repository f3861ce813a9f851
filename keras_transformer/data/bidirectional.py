"""Bidirectional training (BiT; Ding et al., 2021): both directions first, then one.

For the first N training steps the model reads every pair both ways, source->target and
target->source, in the one joint vocabulary and without language tags (which language to
write is plain from the one it reads); after them it trains on source->target only, the
direction it is for. The reversed pairs double what the encoder and decoder see of both
languages while they learn them, at no extra cost per step and with no new parameters;
the paper spends the first third of the steps this way.

Two datasets of token-budget batches are joined here rather than one mixed: the switch
happens at an exact step, so a resumed run can start at the right place in it.
"""

from keras_transformer import checks


def bidirectional_pairs(pairs):
    """`pairs` and each pair reversed: `[(s, t), ...] + [(t, s), ...]`.

    Args:
        pairs: list of `(source, target)` pairs.

    Returns:
        A new list, twice as long: the pairs in order, then each one reversed.

    Raises:
        ValueError: `pairs` is not a list or tuple of 2-item pairs.

    Example:

    >>> bidirectional_pairs([("ein Haus", "a house")])
    [('ein Haus', 'a house'), ('a house', 'ein Haus')]
    """
    if not isinstance(pairs, (list, tuple)):
        raise ValueError(
            f"`pairs` must be a list of (source, target) pairs. Received: type {type(pairs).__name__}"
        )
    for index, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(
                f"`pairs` must hold (source, target) pairs. Received at index {index}: {pair!r}"
            )
    return [tuple(pair) for pair in pairs] + [(target, source) for source, target in pairs]


def bidirectional_then_forward(bidirectional, forward, steps):
    """The first `steps` batches of `bidirectional`, then the batches of `forward`.

    Args:
        bidirectional: `tf.data.Dataset` of batches of `bidirectional_pairs(pairs)`,
            repeating (`make_dataset(..., repeat=True)`) so that `steps` may span more
            than one pass.
        forward: `tf.data.Dataset` of batches of `pairs`, source->target only; repeat it
            for a run measured in steps.
        steps: int >= 0, batches of `bidirectional` to take first; 0 gives `forward`.

    Returns:
        A `tf.data.Dataset`: `bidirectional.take(steps).concatenate(forward)`.
    """
    checks.check_non_negative_int("steps", steps)
    if steps == 0:
        return forward
    return bidirectional.take(steps).concatenate(forward)


__all__ = ["bidirectional_pairs", "bidirectional_then_forward"]
