"""The tf.data input pipeline: sentence pairs in, padded batches of token ids out.

Steps, each a small function below: tokenize both sides with the joint subword
tokenizer; append EOS to the source; make the decoder input `BOS + target` and the
labels `target + EOS` (the decoder input shifted right by one); drop or truncate pairs
longer than `max_length`, counting them; group examples of similar length into buckets
and batch each bucket by a token budget, as the paper does ("each training batch
contained a set of sentence pairs containing approximately 25000 source tokens and
25000 target tokens", Vaswani et al., 2017, section 5.1); pad every batch to its
bucket boundary so the model sees few shapes (with `jit_compile`, every new shape
is a recompilation); shuffle with a seed, cache and prefetch.

The output is `({"encoder_inputs": [B, L], "decoder_inputs": [B, L]}, labels [B, L])`,
int32, padded with `PAD_ID` (0), where L is the bucket boundary: both sides of a batch
share one padded length. It feeds `model.fit` under every Keras backend.

`run_training` batches its training split with `data.index_batches` instead (the same
batches, planned from index arrays, resumable by batch number); this pipeline makes its
validation batches, a subword-sampled run's training batches and users' own.
"""

import dataclasses
import functools
import logging
import math
from typing import NamedTuple

import tensorflow as tf

from keras_transformer import checks
from keras_transformer.data.settings import (  # defined without TensorFlow, for RunConfig; re-exported here
    OVERLONG_MODES,
    check_batching_arguments,
    default_bucket_boundaries,
    evenly_spaced_boundaries,
)
from keras_transformer.data.tokenizer import lone_surrogate_position
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID

logger = logging.getLogger(__name__)

# The functions handed to tf.data below are written in TensorFlow ops with no Python
# branch on a tensor, so AutoGraph has nothing to rewrite in them; left to it, it would
# still parse and transform each one, and the tokenizers of tensorflow-text below them,
# once a process, a second or more of every first `make_dataset`.
graph_function = tf.autograph.experimental.do_not_convert

# Sentences are tokenized this many at a time: tf-text is much faster on batches.
_TOKENIZE_BATCH_SIZE = 1024

# Marks the in-graph id check's error, so that `make_dataset` can tell it from others.
OUT_OF_VOCABULARY = "token ids out of vocabulary"


@dataclasses.dataclass(frozen=True)
class LengthStats:
    """What the length limit did to a corpus, and the batches that remain.

    Args:
        total: int, number of pairs given.
        kept: int, pairs in the dataset (truncated ones included).
        dropped: int, pairs left out for being longer than `max_length`.
        truncated: int, pairs cut to `max_length`.
        max_length: int, the limit, counting EOS (source) or BOS/EOS (target).
        bucket_boundaries: tuple of int, padded length of each bucket.
        bucket_batch_sizes: tuple of int, examples per full batch of each bucket.
        bucket_counts: tuple of int, kept examples per bucket.
        num_batches: int, batches in one epoch.

    Example:
        >>> stats = LengthStats(total=3, kept=2, dropped=1, truncated=0,
        ...     max_length=8, bucket_boundaries=(8,), bucket_batch_sizes=(4,),
        ...     bucket_counts=(2,), num_batches=1)
        >>> stats.dropped
        1
    """

    total: int
    kept: int
    dropped: int
    truncated: int
    max_length: int
    bucket_boundaries: tuple
    bucket_batch_sizes: tuple
    bucket_counts: tuple
    num_batches: int

    def __str__(self):
        return (
            f"{self.total} pairs: {self.kept} kept, {self.dropped} dropped and "
            f"{self.truncated} truncated for max_length={self.max_length}; "
            f"{self.num_batches} batches per epoch in buckets "
            f"{dict(zip(self.bucket_boundaries, self.bucket_counts))} "
            "(boundary: examples)"
        )


class BatchedDataset(NamedTuple):
    """What `make_dataset` returns: the batches and the statistics of the corpus."""

    dataset: tf.data.Dataset
    stats: LengthStats


def bucket_batch_sizes(bucket_boundaries, tokens_per_batch):
    """Examples per batch in each bucket, so that batch * boundary <= tokens_per_batch.

    The budget counts the padded tokens of one side, as the paper's batches hold
    ~25000 source and ~25000 target tokens; both sides share the padded length here.

    Example:
        >>> bucket_batch_sizes([8, 16, 24], tokens_per_batch=64)
        [8, 4, 2]
    """
    return [max(1, tokens_per_batch // boundary) for boundary in bucket_boundaries]


def tokenize_pairs(pairs, tokenizer, vocab_size=None, sampling=(0.0, 0.0)):
    """Token ids of both sides of each pair, without BOS or EOS.

    Args:
        pairs: `tf.data.Dataset` of `(source, target)` scalar tf.string pairs.
        tokenizer: a `SubwordTokenizer` (anything whose `tokenize` maps a
            tf.string [B] tensor to an int32 ragged [B, None] tensor). Where it also
            has `tokenize_target` (a `MarianTokenizer`), targets are cut with that.
        vocab_size: int or None. When given, every id is checked to lie in
            `[0, vocab_size)` as it is made: iterating raises
            `InvalidArgumentError` (`OUT_OF_VOCABULARY` in its message) at the
            first batch of sentences that holds an id outside.
        sampling: `(source_alpha, target_alpha)`, floats in [0, 1): a side whose alpha
            is above 0 is cut with a segmentation drawn at random
            (`SubwordTokenizer.tokenize_sampled`), anew on every iteration.

    Returns:
        `tf.data.Dataset` of `(source_ids, target_ids)`, int32 vectors.
    """

    @graph_function
    def checked(ids):
        if vocab_size is None:
            return ids
        message = f"{OUT_OF_VOCABULARY}: the tokenizer made ids outside [0, vocab_size={vocab_size})"
        ragged = isinstance(ids, tf.RaggedTensor)
        values = ids.flat_values if ragged else ids
        asserts = [
            tf.debugging.assert_non_negative(values, message=message),
            tf.debugging.assert_less(values, tf.constant(vocab_size, values.dtype), message=message),
        ]
        with tf.control_dependencies(asserts):
            values = tf.identity(values)
        return ids.with_flat_values(values) if ragged else values

    # A tokenizer with two sentencepiece models (a Marian one: source.spm, target.spm)
    # cuts target text with its target model; a joint vocabulary has one `tokenize`.
    tokenize_target = getattr(tokenizer, "tokenize_target", tokenizer.tokenize)
    source_alpha, target_alpha = sampling
    if source_alpha:
        tokenize_source = functools.partial(tokenizer.tokenize_sampled, alpha=source_alpha)
    else:
        tokenize_source = tokenizer.tokenize
    if target_alpha:
        tokenize_target = functools.partial(tokenizer.tokenize_sampled, alpha=target_alpha)

    @graph_function
    def tokenize(source, target):
        return checked(tokenize_source(source)), checked(tokenize_target(target))

    return (
        pairs.batch(_TOKENIZE_BATCH_SIZE)
        .map(tokenize, num_parallel_calls=tf.data.AUTOTUNE)
        .unbatch()
    )


def example_length(source_ids, target_ids):
    """Length of a pair once EOS / BOS are added: max(source, target) + 1."""
    return tf.maximum(tf.size(source_ids), tf.size(target_ids)) + 1


def fit_to_length(tokenized, max_length, overlong="drop"):
    """Drop the pairs longer than `max_length`, or cut them to fit.

    The limit counts what the model sees: the source with its EOS and the decoder
    input with its BOS (the labels have the same length). Truncation keeps the
    first `max_length - 1` tokens of each side, so EOS and BOS still fit.

    Args:
        tokenized: `tf.data.Dataset` of `(source_ids, target_ids)`.
        max_length: int, the limit.
        overlong: str, `"drop"` or `"truncate"`.

    Returns:
        `tf.data.Dataset` of `(source_ids, target_ids)` that fit.
    """
    if overlong == "drop":
        return tokenized.filter(
            graph_function(lambda source, target: example_length(source, target) <= max_length)
        )
    return tokenized.map(
        graph_function(lambda source, target: (source[: max_length - 1], target[: max_length - 1])),
        num_parallel_calls=tf.data.AUTOTUNE,
    )


@graph_function
def to_model_inputs(source_ids, target_ids):
    """The model's inputs and labels for one pair of token id vectors.

    The source gets EOS (no BOS: the encoder needs no start signal); the decoder
    input is `BOS + target` and the labels are `target + EOS`, so
    `labels[t] == decoder_inputs[t + 1]`: teacher forcing, one step ahead.

    Returns:
        `({"encoder_inputs": [S], "decoder_inputs": [T]}, labels [T])`, int32.
    """
    source_ids = tf.cast(source_ids, tf.int32)
    target_ids = tf.cast(target_ids, tf.int32)
    eos = tf.constant([EOS_ID], tf.int32)
    bos = tf.constant([BOS_ID], tf.int32)
    inputs = {
        "encoder_inputs": tf.concat([source_ids, eos], axis=0),
        "decoder_inputs": tf.concat([bos, target_ids], axis=0),
    }
    return inputs, tf.concat([target_ids, eos], axis=0)


def batch_by_token_budget(examples, bucket_boundaries, tokens_per_batch):
    """Bucket examples by length and batch each bucket by a token budget.

    An example goes to the first bucket whose boundary is >= its length and is
    padded (with PAD_ID) to that boundary on both sides; a bucket's batches hold
    `bucket_batch_sizes(...)` examples, the last one of an epoch fewer.

    Args:
        examples: `tf.data.Dataset` from `to_model_inputs`, every example no
            longer than `bucket_boundaries[-1]`.
        bucket_boundaries: increasing list of int, the padded lengths.
        tokens_per_batch: int, the budget of padded tokens of one side.

    Returns:
        `tf.data.Dataset` of padded batches.
    """
    # bucket_by_sequence_length pads to `boundary - 1` and wants length < boundary,
    # so it is given boundaries one above the padded lengths wanted here.
    return examples.bucket_by_sequence_length(
        element_length_func=graph_function(
            lambda inputs, labels: tf.maximum(
                tf.shape(inputs["encoder_inputs"])[0], tf.shape(inputs["decoder_inputs"])[0]
            )
        ),
        bucket_boundaries=[boundary + 1 for boundary in bucket_boundaries],
        # One batch size per boundary, plus the unused bucket above the last one.
        bucket_batch_sizes=bucket_batch_sizes(bucket_boundaries, tokens_per_batch)
        + [1],
        padding_values=({"encoder_inputs": PAD_ID, "decoder_inputs": PAD_ID}, PAD_ID),
        pad_to_bucket_boundary=True,
    )


def count_lengths(
    tokenized, max_length, bucket_boundaries, tokens_per_batch, overlong="drop"
):
    """Count, in one pass over the data, what the length limit and the buckets do.

    Args:
        tokenized: finite `tf.data.Dataset` of `(source_ids, target_ids)`.
        max_length, bucket_boundaries, tokens_per_batch, overlong: as in
            `make_dataset`.

    Returns:
        A `LengthStats`.
    """
    boundaries = tf.constant(bucket_boundaries, tf.int32)
    num_buckets = len(bucket_boundaries)

    @graph_function
    def add(state, pair):
        total, over, counts = state
        length = example_length(*pair)
        is_over = length > max_length
        kept = tf.logical_not(is_over) if overlong == "drop" else tf.constant(True)
        bucket = tf.reduce_sum(
            tf.cast(boundaries < tf.minimum(length, max_length), tf.int32)
        )
        counts += tf.one_hot(bucket, num_buckets, dtype=tf.int64) * tf.cast(
            kept, tf.int64
        )
        return total + 1, over + tf.cast(is_over, tf.int64), counts

    zero = tf.constant(0, tf.int64)
    total, over, counts = tokenized.reduce(
        (zero, zero, tf.zeros([num_buckets], tf.int64)), add
    )
    total, over = int(total), int(over)
    counts = tuple(int(count) for count in counts.numpy())
    sizes = tuple(bucket_batch_sizes(bucket_boundaries, tokens_per_batch))
    return LengthStats(
        total=total,
        kept=total - over if overlong == "drop" else total,
        dropped=over if overlong == "drop" else 0,
        truncated=over if overlong == "truncate" else 0,
        max_length=max_length,
        bucket_boundaries=tuple(bucket_boundaries),
        bucket_batch_sizes=sizes,
        bucket_counts=counts,
        num_batches=sum(math.ceil(n / size) for n, size in zip(counts, sizes)),
    )


def make_dataset(
    pairs,
    tokenizer,
    *,
    max_length,
    tokens_per_batch,
    bucket_boundaries=None,
    shuffle=True,
    seed=0,
    overlong="drop",
    cache=True,
    repeat=False,
    shuffle_buffer_size=None,
    batch_shuffle_buffer_size=1024,
    vocab_size=None,
    subword_sampling=0.0,
):
    """Batches of `({"encoder_inputs", "decoder_inputs"}, labels)` from sentence pairs.

    Tokenizes both sides, adds EOS to the source and BOS / EOS to the target (the
    labels are the decoder inputs shifted by one), drops or truncates pairs over
    `max_length`, buckets by length, batches each bucket by `tokens_per_batch`
    padded tokens and pads to the bucket boundary. Before building the dataset it
    makes one pass over the data to count the pairs dropped or truncated and the
    batches per epoch; the counts are returned and logged. With `cache=True` that
    pass also fills the in-memory cache of the tokenized pairs, so tokenization
    happens once. Shuffling is seeded: the same seed (under the same TF global
    seed, which `keras.utils.set_random_seed` sets) gives the same batches in the
    same order; each epoch (each new iteration) reshuffles, reproducibly. The
    dataset states its cardinality, `stats.num_batches`, so Keras knows the
    length of an epoch.

    Args:
        pairs: list of `(source, target)` str pairs, or a `tf.data.Dataset` of
            scalar tf.string `(source, target)` pairs (use the Dataset form for
            corpora too big to hold as one constant tensor).
        tokenizer: the `SubwordTokenizer` of both languages.
        max_length: int >= 2, longest encoder input / decoder input, counting
            EOS / BOS.
        tokens_per_batch: int, padded tokens of one side per batch (the paper
            uses ~25000); at least the largest bucket boundary.
        bucket_boundaries: increasing list of int, padded lengths of the buckets;
            the last must be >= max_length. Default `default_bucket_boundaries`.
        shuffle: bool, shuffle examples before bucketing and batches after.
        seed: int, the shuffle seed.
        overlong: `"drop"` (default) or `"truncate"` pairs over `max_length`.
        cache: bool, keep the tokenized pairs in memory.
        repeat: bool, repeat the epochs forever (then give `model.fit` a
            `steps_per_epoch`, e.g. `stats.num_batches`).
        shuffle_buffer_size: int, examples in the shuffle buffer; default all
            kept examples (a full shuffle).
        batch_shuffle_buffer_size: int, batches in the batch shuffle buffer (with
            `subword_sampling`, at most one epoch's: `stats.num_batches`).
        vocab_size: int, the model's vocabulary size: every id is checked to lie
            in `[0, vocab_size)` while the data is counted, before any batch is
            made, and a tokenizer whose `vocab_size` is larger is refused at once.
            Defaults to the tokenizer's `vocab_size` (when it has one).
        subword_sampling: float in [0, 1), or a `(source, target)` pair of them.
            Above 0, every epoch cuts the sentences of that side anew with a
            segmentation drawn at random (`SubwordTokenizer.tokenize_sampled`: for a
            BPE tokenizer, BPE-dropout with this probability). The sampled pieces
            vary in length, so the batches of an epoch vary in number: this needs
            `repeat=True`, and `stats.num_batches` (counted over the usual
            segmentation, which is what `max_length` is checked against too) is the
            natural `steps_per_epoch` for `model.fit`. A sampled pair longer than
            `max_length` is dropped or truncated like any other. Default 0: no sampling.

    Returns:
        `BatchedDataset(dataset, stats)`: the `tf.data.Dataset` and its
        `LengthStats`.

    Raises:
        ValueError: a bad argument, a pair that is not two str (or holds a lone
            surrogate, which UTF-8 cannot encode), no pairs at all, no pair short
            enough for `max_length` (with "drop"), or a token id outside
            `[0, vocab_size)`.

    Example:

    >>> tokenizer = kt.train_tokenizer(["ein Haus", "a house"] * 10, vocab_size=16)
    >>> batches, stats = make_dataset([("ein Haus", "a house")] * 4, tokenizer,
    ...     max_length=16, tokens_per_batch=32)
    >>> inputs, labels = next(iter(batches))
    >>> inputs["encoder_inputs"].shape  # 8 tokens + EOS: the bucket of 16
    TensorShape([2, 16])
    >>> stats.num_batches
    2
    """
    bucket_boundaries = check_batching_arguments(max_length, tokens_per_batch, bucket_boundaries, overlong)
    sampling = _checked_sampling(subword_sampling, tokenizer, repeat)
    vocab_size = _checked_vocab_size(vocab_size, tokenizer)
    string_pairs = _as_string_pairs(pairs)
    if cache and any(sampling):
        string_pairs = string_pairs.cache()  # sampled again each epoch from the text
    tokenized = tokenize_pairs(string_pairs, tokenizer, vocab_size)
    if cache and not any(sampling):
        tokenized = tokenized.cache()
    stats = _counted(tokenized, max_length, bucket_boundaries, tokens_per_batch, overlong, vocab_size)
    if any(sampling):
        # Repeated before sampling, not after batching: an epoch whose every pair was
        # drawn over max_length would otherwise end the stream (tf.data's repeat stops
        # at an empty pass). Each pair fits in its usual segmentation, which every draw
        # can give, so the stream never runs dry.
        tokenized = tokenize_pairs(string_pairs.repeat(), tokenizer, vocab_size, sampling)
    examples = fit_to_length(tokenized, max_length, overlong)
    if shuffle:
        examples = examples.shuffle(
            shuffle_buffer_size or stats.kept, seed=seed, reshuffle_each_iteration=True
        )
    examples = examples.map(to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE)
    batches = batch_by_token_budget(examples, bucket_boundaries, tokens_per_batch)
    if shuffle:
        batches = _shuffled_batches(batches, stats, seed, batch_shuffle_buffer_size, endless=any(sampling))
    if any(sampling):
        # The number of batches changes with each epoch's segmentation: no cardinality
        # to assert (the stream is endless), and the caller's steps_per_epoch says what
        # an epoch is.
        endless = batches.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
        return BatchedDataset(endless.prefetch(tf.data.AUTOTUNE), stats)
    return _finished(batches, stats, repeat)


def _counted(tokenized, max_length, bucket_boundaries, tokens_per_batch, overlong, vocab_size):
    """`count_lengths`, with an out-of-vocabulary id, no pairs, or no pair short enough refused."""
    try:
        stats = count_lengths(tokenized, max_length, bucket_boundaries, tokens_per_batch, overlong)
    except tf.errors.InvalidArgumentError as error:
        if OUT_OF_VOCABULARY not in error.message:
            raise
        raise ValueError(
            f"The tokenizer made token ids outside [0, vocab_size={vocab_size}); no batch "
            f"was made. Were the tokenizer and the model trained together? ({error.message})"
        ) from None
    logger.info("make_dataset: %s", stats)
    if stats.total == 0:
        raise ValueError(
            "`pairs` is empty: there are no sentence pairs to batch. "
            "Expected at least one (source, target) pair."
        )
    if stats.kept == 0:
        raise ValueError(
            f"No pair fits max_length={max_length}: all {stats.total} pairs are "
            "longer. Raise max_length or use overlong='truncate'."
        )
    return stats


def _shuffled_batches(batches, stats, seed, buffer, endless):
    """Bucketing emits batches in runs of similar length; mix them up again.

    The seed differs from the example shuffle's so the two are independent.
    """
    if endless:
        # The sampled stream never ends, so a buffer larger than an epoch would be
        # filled from several epochs before the first batch (1,024 batches: ~100
        # passes over a 1,000-pair corpus, 9 s of sampling before the first step).
        # One epoch's batches mix as much as a finite epoch's shuffle does.
        buffer = min(buffer, stats.num_batches)
    return batches.shuffle(buffer, seed=seed + 1, reshuffle_each_iteration=True)


def _finished(batches, stats, repeat):
    """States the cardinality, repeats if asked, prefetches."""
    # Bucketing hides the number of batches from tf.data; it is known from the
    # counts, and telling it lets Keras size epochs and progress bars (and
    # checks the count: a mismatch raises while iterating).
    batches = batches.apply(tf.data.experimental.assert_cardinality(stats.num_batches))
    if repeat:
        batches = batches.repeat()
    return BatchedDataset(batches.prefetch(tf.data.AUTOTUNE), stats)


def count_batches(dataset):
    """Number of batches in a finite dataset, iterating over it if TF cannot tell.

    `make_dataset` output states its cardinality (`LengthStats.num_batches`), so
    for it this needs no pass over the data.

    Raises:
        ValueError: the dataset repeats forever.
    """
    cardinality = int(dataset.cardinality())
    if cardinality == tf.data.INFINITE_CARDINALITY:
        raise ValueError(
            "`dataset` is infinite (it repeats); count the batches of one epoch, "
            "e.g. with make_dataset(..., repeat=False)."
        )
    if cardinality >= 0:
        return cardinality
    return int(dataset.reduce(tf.constant(0, tf.int64), graph_function(lambda count, _: count + 1)))


def _checked_sampling(subword_sampling, tokenizer, repeat):
    """`subword_sampling` as a `(source_alpha, target_alpha)` pair, checked."""
    if isinstance(subword_sampling, (tuple, list)):
        if len(subword_sampling) != 2:
            raise ValueError(
                "`subword_sampling` must be one alpha or a (source, target) pair of them. "
                f"Received: subword_sampling={subword_sampling!r}"
            )
        sampling = tuple(subword_sampling)
    else:
        sampling = (subword_sampling, subword_sampling)
    for alpha in sampling:
        checks.check_rate("subword_sampling", alpha)
    if not any(sampling):
        return (0.0, 0.0)
    if not hasattr(tokenizer, "tokenize_sampled"):
        raise ValueError(
            f"subword_sampling={subword_sampling!r} needs a tokenizer that can sample "
            f"segmentations (a SubwordTokenizer); {type(tokenizer).__name__} cannot. "
            "Pass subword_sampling=0."
        )
    if not repeat:
        raise ValueError(
            f"subword_sampling={subword_sampling!r} changes the number of batches from "
            "epoch to epoch, so the dataset cannot end after one: pass repeat=True and "
            "give model.fit steps_per_epoch (stats.num_batches is one epoch's worth)."
        )
    return tuple(float(alpha) for alpha in sampling)


def _checked_vocab_size(vocab_size, tokenizer):
    """The vocabulary size to check ids against: `vocab_size`, else the tokenizer's."""
    tokenizer_size = getattr(tokenizer, "vocab_size", None)
    if vocab_size is None:
        return tokenizer_size if checks.is_int(tokenizer_size) else None
    checks.check_positive_int("vocab_size", vocab_size)
    if checks.is_int(tokenizer_size) and tokenizer_size > vocab_size:
        raise ValueError(
            f"The tokenizer's vocab_size ({tokenizer_size}) is larger than vocab_size="
            f"{vocab_size}: its ids would not all fit the model's embedding. Were they "
            "trained together?"
        )
    return vocab_size


def _as_string_pairs(pairs):
    """A `tf.data.Dataset` of scalar string `(source, target)` pairs."""
    if isinstance(pairs, tf.data.Dataset):
        spec = pairs.element_spec
        expected = tf.TensorSpec([], tf.string)
        if not (
            isinstance(spec, tuple)
            and len(spec) == 2
            and all(expected.is_compatible_with(part) for part in spec)
        ):
            raise ValueError(
                "A `pairs` dataset must yield (source, target) scalar tf.string "
                f"pairs. Received: element_spec={spec}"
            )
        return pairs
    pairs = list(pairs)
    for index, pair in enumerate(pairs):
        if not (
            isinstance(pair, (tuple, list))
            and len(pair) == 2
            and all(isinstance(side, str) for side in pair)
        ):
            raise ValueError(
                "`pairs` must be (source, target) pairs of str. "
                f"Received: {pair!r} at index {index}"
            )
        for side, text in zip(("source", "target"), pair):
            position = lone_surrogate_position(text)
            if position is not None:
                raise ValueError(
                    f"The {side} of the pair at index {index} is not valid Unicode: it "
                    f"holds the lone surrogate {text[position]!r} at character {position}, "
                    "which UTF-8 cannot encode. Decode the corpus with errors='replace' "
                    "or fix it."
                )
    sources = [source for source, _ in pairs]
    targets = [target for _, target in pairs]
    return tf.data.Dataset.from_tensor_slices(
        (tf.constant(sources, tf.string), tf.constant(targets, tf.string))
    )
