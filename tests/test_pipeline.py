"""Tests of the tf.data pipeline: lengths, buckets, token budget, shift, shuffling."""

import collections
import random

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_transformer.data.pipeline import (
    bucket_batch_sizes,
    count_batches,
    default_bucket_boundaries,
    make_dataset,
    to_model_inputs,
)
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.data.tokenizer import train_tokenizer

SOURCE_WORDS = "red blue green black white small big old new one two three".split()
TARGET_WORDS = "rot blau gruen schwarz weiss klein gross alt neu eins zwei drei".split()
MAX_LENGTH = 24
TOKENS_PER_BATCH = 64
BOUNDARIES = [8, 16, 24]  # default_bucket_boundaries(24)


def make_pairs(count=200):
    """`count` toy pairs of 1 to 12 words; the target is reversed, + "ja" every 4th."""
    rng = random.Random(0)
    pairs = []
    for i in range(count):
        words = [rng.randrange(12) for _ in range(1 + i % 12)]
        source = " ".join(SOURCE_WORDS[w] for w in words)
        target = [TARGET_WORDS[w] for w in reversed(words)] + ["ja"] * (i % 4 == 0)
        pairs.append((source, " ".join(target)))
    return pairs


@pytest.fixture(scope="module")
def pairs():
    return make_pairs()


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_tokenizer([side for pair in pairs for side in pair], 40)


@pytest.fixture(scope="module")
def one_piece_word(tokenizer):
    """A word that is one token, so k copies of it are exactly k tokens."""
    words = SOURCE_WORDS + TARGET_WORDS
    word = next(w for w in words if len(tokenizer.encode([w])[0]) == 1)
    assert len(tokenizer.encode([" ".join([word] * 7)])[0]) == 7
    return word


def model_length(tokenizer, pair):
    """Length of a pair as the model sees it: max(source, target) tokens + EOS/BOS."""
    source, target = tokenizer.encode(list(pair))
    return max(len(source), len(target)) + 1


def epoch(dataset):
    """One pass as numpy: a list of (encoder_inputs, decoder_inputs, labels)."""
    return [
        (inputs["encoder_inputs"], inputs["decoder_inputs"], labels)
        for inputs, labels in dataset.as_numpy_iterator()
    ]


def real_length(row):
    return int(np.sum(row != PAD_ID))


def decoded_pairs(tokenizer, batches):
    """The (source, target) texts of every example in the batches."""
    found = []
    for encoder_inputs, _, labels in batches:
        found += zip(tokenizer.decode(encoder_inputs), tokenizer.decode(labels))
    return collections.Counter(found)


@pytest.fixture(scope="module")
def dropped_dataset(pairs, tokenizer):
    return make_dataset(
        pairs, tokenizer, max_length=MAX_LENGTH, tokens_per_batch=TOKENS_PER_BATCH
    )


def test_default_bucket_boundaries_and_batch_sizes():
    assert default_bucket_boundaries(256) == [8, 16, 24, 40, 64, 96, 144, 216, 256]
    assert default_bucket_boundaries(24) == BOUNDARIES
    assert default_bucket_boundaries(20) == [8, 16, 20]
    assert default_bucket_boundaries(6) == [6]
    assert bucket_batch_sizes(BOUNDARIES, TOKENS_PER_BATCH) == [8, 4, 2]
    assert bucket_batch_sizes([8, 16], 10) == [1, 1]


def test_to_model_inputs_adds_eos_and_bos():
    inputs, labels = to_model_inputs(tf.constant([5, 6]), tf.constant([7, 8, 9]))
    assert inputs["encoder_inputs"].numpy().tolist() == [5, 6, EOS_ID]
    assert inputs["decoder_inputs"].numpy().tolist() == [BOS_ID, 7, 8, 9]
    assert labels.numpy().tolist() == [7, 8, 9, EOS_ID]
    assert labels.dtype == tf.int32


def test_batches_keep_the_token_budget_and_pad_to_their_bucket(
    dropped_dataset, tokenizer
):
    batches = epoch(dropped_dataset.dataset)
    for encoder_inputs, decoder_inputs, labels in batches:
        size, length = encoder_inputs.shape
        assert length in BOUNDARIES
        assert decoder_inputs.shape == labels.shape == (size, length)
        assert encoder_inputs.dtype == decoder_inputs.dtype == labels.dtype == np.int32
        assert 1 <= size <= TOKENS_PER_BATCH // length
        longest = max(
            max(real_length(e), real_length(d))
            for e, d in zip(encoder_inputs, decoder_inputs)
        )
        # The smallest bucket that fits the longest example.
        previous = ([0] + BOUNDARIES)[BOUNDARIES.index(length)]
        assert previous < longest <= length
    assert len(batches) == dropped_dataset.stats.num_batches


def test_labels_are_decoder_inputs_shifted_by_one(dropped_dataset):
    for encoder_inputs, decoder_inputs, labels in epoch(dropped_dataset.dataset):
        for source, decoder_input, label in zip(encoder_inputs, decoder_inputs, labels):
            n = real_length(label)
            assert real_length(decoder_input) == n
            assert decoder_input[0] == BOS_ID
            assert label[n - 1] == EOS_ID
            np.testing.assert_array_equal(decoder_input[1:n], label[: n - 1])
            assert not np.any(label[n:]) and not np.any(decoder_input[n:])
            assert BOS_ID not in label and EOS_ID not in decoder_input
            # The source ends with EOS, has no BOS, and is followed by padding only.
            m = real_length(source)
            assert source[m - 1] == EOS_ID and BOS_ID not in source
            assert not np.any(source[m:])


def test_overlong_pairs_are_dropped_counted_and_each_kept_pair_seen_once(
    dropped_dataset, pairs, tokenizer
):
    kept = [pair for pair in pairs if model_length(tokenizer, pair) <= MAX_LENGTH]
    stats = dropped_dataset.stats
    assert stats.total == 200
    assert stats.dropped == 200 - len(kept) > 0
    assert stats.kept == len(kept) and stats.truncated == 0
    assert sum(stats.bucket_counts) == stats.kept
    assert stats.bucket_batch_sizes == (8, 4, 2)
    # Two epochs of one dataset: reshuffled, yet each kept pair exactly once each.
    first, second = epoch(dropped_dataset.dataset), epoch(dropped_dataset.dataset)
    assert decoded_pairs(tokenizer, first) == collections.Counter(kept)
    assert decoded_pairs(tokenizer, second) == collections.Counter(kept)
    assert [b[0].tolist() for b in first] != [b[0].tolist() for b in second]
    assert count_batches(dropped_dataset.dataset) == stats.num_batches
    unknown = dropped_dataset.dataset.filter(lambda inputs, labels: True)
    assert count_batches(unknown) == stats.num_batches


def test_exact_drop_count_on_constructed_lengths(tokenizer, one_piece_word):
    # (source words, target words) of one one-token word; max_length 6 counts EOS/BOS.
    sizes = [(5, 5), (5, 6), (6, 1), (1, 1), (3, 5), (10, 2)]
    constructed = [
        (" ".join([one_piece_word] * s), " ".join([one_piece_word] * t))
        for s, t in sizes
    ]
    dataset, stats = make_dataset(
        constructed, tokenizer, max_length=6, tokens_per_batch=12, shuffle=False
    )
    assert (stats.total, stats.kept, stats.dropped, stats.truncated) == (6, 3, 3, 0)
    assert stats.bucket_boundaries == (6,) and stats.bucket_counts == (3,)
    assert stats.num_batches == 2  # 3 examples, 2 per batch of 6 tokens.
    lengths = sorted(
        (real_length(e), real_length(d))
        for batch in epoch(dataset)
        for e, d in zip(batch[0], batch[1])
    )
    assert lengths == [(2, 2), (4, 6), (6, 6)]


def test_truncation_keeps_eos_and_bos(tokenizer, one_piece_word):
    sizes = [(5, 6), (6, 1), (10, 2), (1, 1)]
    constructed = [
        (" ".join([one_piece_word] * s), " ".join([one_piece_word] * t))
        for s, t in sizes
    ]
    dataset, stats = make_dataset(
        constructed, tokenizer, max_length=6, tokens_per_batch=6, shuffle=False,
        overlong="truncate",
    )
    assert (stats.total, stats.kept, stats.dropped, stats.truncated) == (4, 4, 0, 3)
    word_id = tokenizer.encode([one_piece_word])[0][0]
    rows = sorted(
        (e.tolist(), d.tolist(), l.tolist())
        for batch in epoch(dataset)
        for e, d, l in zip(*batch)
    )
    w, pad = word_id, PAD_ID
    assert rows == sorted([
        ([w] * 5 + [EOS_ID], [BOS_ID] + [w] * 5, [w] * 5 + [EOS_ID]),  # (5, 6)
        ([w] * 5 + [EOS_ID], [BOS_ID, w, pad, pad, pad, pad], [w, EOS_ID] + [pad] * 4),
        ([w] * 5 + [EOS_ID], [BOS_ID, w, w] + [pad] * 3, [w, w, EOS_ID] + [pad] * 3),
        ([w, EOS_ID] + [pad] * 4, [BOS_ID, w] + [pad] * 4, [w, EOS_ID] + [pad] * 4),
    ])
    assert all(len(row) == 6 for triple in rows for row in triple)


def test_same_seed_same_batches_other_seed_other_order(pairs, tokenizer):
    def batches(seed, source=pairs):
        dataset, _ = make_dataset(
            source, tokenizer, max_length=MAX_LENGTH,
            tokens_per_batch=TOKENS_PER_BATCH, seed=seed,
        )
        return [[array.tolist() for array in batch] for batch in epoch(dataset)]

    first = batches(seed=3)
    assert batches(seed=3) == first
    as_dataset = tf.data.Dataset.from_tensor_slices(
        ([s for s, _ in pairs], [t for _, t in pairs])
    )
    assert batches(seed=3, source=as_dataset) == first
    assert batches(seed=4) != first


def test_repeat_gives_endless_epochs(pairs, tokenizer):
    dataset, stats = make_dataset(
        pairs[:24], tokenizer, max_length=MAX_LENGTH,
        tokens_per_batch=TOKENS_PER_BATCH, repeat=True,
    )
    assert len(list(dataset.take(3 * stats.num_batches))) == 3 * stats.num_batches
    with pytest.raises(ValueError, match="infinite"):
        count_batches(dataset)


def test_feeds_model_fit(pairs, tokenizer):
    # 16 pairs of the first bucket: two full batches of [8, 8], so one compiled
    # shape (each new shape is a retrace, slow under jax).
    short = [pair for pair in pairs if model_length(tokenizer, pair) <= 8][:16]
    assert len(short) == 16
    dataset, stats = make_dataset(
        short, tokenizer, max_length=MAX_LENGTH, tokens_per_batch=TOKENS_PER_BATCH
    )
    assert stats.num_batches == 2
    encoder_inputs = keras.Input([None], dtype="int32", name="encoder_inputs")
    decoder_inputs = keras.Input([None], dtype="int32", name="decoder_inputs")
    embedding = keras.layers.Embedding(tokenizer.vocab_size, 8)
    # S == T (both padded to the bucket boundary), so the two can be added.
    hidden = keras.layers.Add()([embedding(encoder_inputs), embedding(decoder_inputs)])
    logits = keras.layers.Dense(tokenizer.vocab_size)(hidden)
    model = keras.Model([encoder_inputs, decoder_inputs], logits)
    model.compile(
        optimizer="sgd",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
    )
    steps = []
    callback = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: steps.append(batch)
    )
    history = model.fit(
        dataset, epochs=1, verbose=0, callbacks=[callback], shuffle=False
    )
    assert len(steps) == stats.num_batches
    assert np.isfinite(history.history["loss"][0])


def test_bad_arguments_are_refused(pairs, tokenizer):
    def build(source=pairs, **overrides):
        options = dict(max_length=MAX_LENGTH, tokens_per_batch=TOKENS_PER_BATCH)
        options.update(overrides)
        return make_dataset(source, tokenizer, **options)

    with pytest.raises(ValueError, match=r"`overlong` must be one of \('drop', 'truncate'\). Received: overlong='cut'"):
        build(overlong="cut")
    with pytest.raises(ValueError, match=r"integer >= 2 .* max_length=1"):
        build(max_length=1)
    with pytest.raises(ValueError, match=r">= the largest bucket boundary \(24\).*=20"):
        build(tokens_per_batch=20)
    with pytest.raises(ValueError, match=r"strictly increasing .* \[16, 8, 24\]"):
        build(bucket_boundaries=[16, 8, 24])
    with pytest.raises(ValueError, match=r"boundary must be >= max_length=24"):
        build(bucket_boundaries=[8, 16])
    with pytest.raises(ValueError, match=r"Received: \('red',\) at index 1"):
        build(source=[("red", "rot"), ("red",)])
    with pytest.raises(ValueError, match="tf.string pairs. Received: element_spec"):
        build(source=tf.data.Dataset.range(3))
    # Every target has 2+ tokens (one-word pairs all get "ja"), so none fits.
    with pytest.raises(ValueError, match="No pair fits max_length=2: all 200 pairs"):
        build(max_length=2, tokens_per_batch=8)
