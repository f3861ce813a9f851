"""The data settings a run config checks before TensorFlow loads: tokenizer types, length buckets.

`RunConfig` validates a config on construction, and parsing a config should not load
TensorFlow (seconds of start-up, and nothing of it is needed to read a TOML file). So
the constants and the batching check it needs live here, in plain Python;
`data.pipeline` and `data.tokenizer` import them from this module.
"""

import math

from keras_transformer import checks

# The sentencepiece algorithms `train_tokenizer` offers; "bpe" is the paper's (5.1).
TOKENIZER_MODEL_TYPES = ("unigram", "bpe")

# What `make_dataset` does with a pair longer than `max_length`.
OVERLONG_MODES = ("drop", "truncate")

# Default buckets start at one multiple of 8 and grow by about half each time, so a
# batch carries at most ~1/3 padding, yet max_length=256 needs only 9 shapes.
_BUCKET_MULTIPLE = 8
_BUCKET_GROWTH = 1.5


def default_bucket_boundaries(max_length):
    """Padded lengths of the buckets: multiples of 8 growing by ~1.5x, up to max_length.

    Example:
        >>> default_bucket_boundaries(256)
        [8, 16, 24, 40, 64, 96, 144, 216, 256]
    """
    boundaries = []
    boundary = _BUCKET_MULTIPLE
    while boundary < max_length:
        boundaries.append(boundary)
        grown = math.ceil(boundary * _BUCKET_GROWTH / _BUCKET_MULTIPLE)
        boundary = grown * _BUCKET_MULTIPLE
    return boundaries + [max_length]


def evenly_spaced_boundaries(width, max_length):
    """Padded bucket lengths `width, 2 * width, ...` up to `max_length`; None for width 0.

    None lets `make_dataset` use `default_bucket_boundaries` (`RunConfig.bucket_width`
    is 0 by default).

    Example:
        >>> evenly_spaced_boundaries(4, 14)
        [4, 8, 12, 14]
    """
    if not width:
        return None
    return list(range(width, max_length, width)) + [max_length]


def check_batching_arguments(max_length, tokens_per_batch, bucket_boundaries=None, overlong="drop"):
    """Checks `make_dataset`'s batching arguments; returns the bucket boundaries to use.

    A training run calls it before it reads its corpus, so a budget that cannot hold
    the longest example is refused before anything is written.

    Raises:
        ValueError: naming the argument and the value received.
    """
    if max_length is None or not checks.is_int(max_length) or max_length < 2:
        raise ValueError(
            "`max_length` must be an integer >= 2 (one token plus EOS). "
            f"Received: max_length={max_length!r}"
        )
    checks.check_choice("overlong", overlong, OVERLONG_MODES)
    if bucket_boundaries is None:
        bucket_boundaries = default_bucket_boundaries(max_length)
    bucket_boundaries = _checked_boundaries(bucket_boundaries, max_length)
    if not checks.is_int(tokens_per_batch) or tokens_per_batch < bucket_boundaries[-1]:
        raise ValueError(
            "`tokens_per_batch` must be an integer >= the largest bucket boundary "
            f"({bucket_boundaries[-1]}), so the longest example fits in a batch. "
            f"Received: tokens_per_batch={tokens_per_batch!r}"
        )
    return bucket_boundaries


def _checked_boundaries(bucket_boundaries, max_length):
    """The boundaries as a list, refusing unsorted, non-positive or too short ones."""
    boundaries = list(bucket_boundaries)
    if (
        not boundaries
        or not all(checks.is_int(b) and b > 0 for b in boundaries)
        or any(a >= b for a, b in zip(boundaries, boundaries[1:]))
    ):
        raise ValueError(
            "`bucket_boundaries` must be a non-empty, strictly increasing list of "
            f"positive integers. Received: {bucket_boundaries!r}"
        )
    if boundaries[-1] < max_length:
        raise ValueError(
            f"The last bucket boundary must be >= max_length={max_length}, so every "
            f"kept example has a bucket. Received: bucket_boundaries={boundaries}"
        )
    return boundaries


__all__ = [
    "TOKENIZER_MODEL_TYPES",
    "OVERLONG_MODES",
    "default_bucket_boundaries",
    "evenly_spaced_boundaries",
    "check_batching_arguments",
]
