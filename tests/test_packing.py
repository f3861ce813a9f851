"""Sequence packing: `make_dataset(..., packing=True)` and the model's packed forward pass.

A packed batch must be the same pairs as an unpacked one, to the model: the same
logits per pair, the same loss, the same gradients (checked through one SGD step).
"""

import collections

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_transformer as kt
from conftest import tiny_config, to_numpy
from keras_transformer.data.packing import PACKED_FEATURES, pack_examples
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.data.tokenizer import train_tokenizer
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID
from test_pipeline import make_pairs

MAX_LENGTH = 64  # every toy pair fits: none is dropped


def examples_dataset(examples):
    """`(source, decoder_inputs, labels)` lists as a dataset of `to_model_inputs` examples."""
    spec = tf.TensorSpec([None], tf.int32)
    return tf.data.Dataset.from_generator(
        lambda: (({"encoder_inputs": s, "decoder_inputs": d}, l) for s, d, l in examples),
        output_signature=({"encoder_inputs": spec, "decoder_inputs": spec}, spec),
    )


def rows_of(dataset):
    return [({key: value.tolist() for key, value in inputs.items()}, labels.tolist()) for inputs, labels in dataset.as_numpy_iterator()]


def test_first_fit_over_open_rows_by_hand():
    examples = [
        ([5, 6, 3], [2, 5, 6], [5, 6, 3]),  # row 0
        ([7, 3], [2, 9, 9, 9], [9, 9, 9, 3]),  # target does not fit row 0 (3 + 4 > 6): row 1
        ([4, 4, 4, 4, 3], [2, 1], [1, 3]),  # fits neither: the fullest row (0, first of a tie) goes out
        ([8, 3], [2, 8], [8, 3]),  # fits row 1 exactly
    ]
    rows = rows_of(pack_examples(examples_dataset(examples), length=6, open_rows=2))
    assert rows == [
        (
            {
                "encoder_inputs": [5, 6, 3, 0, 0, 0],
                "decoder_inputs": [2, 5, 6, 0, 0, 0],
                "encoder_segment_ids": [1, 1, 1, 0, 0, 0],
                "decoder_segment_ids": [1, 1, 1, 0, 0, 0],
                "encoder_positions": [0, 1, 2, 0, 0, 0],
                "decoder_positions": [0, 1, 2, 0, 0, 0],
            },
            [5, 6, 3, 0, 0, 0],
        ),
        # The flush at the end emits row 0, then row 1.
        (
            {
                "encoder_inputs": [4, 4, 4, 4, 3, 0],
                "decoder_inputs": [2, 1, 0, 0, 0, 0],
                "encoder_segment_ids": [1, 1, 1, 1, 1, 0],
                "decoder_segment_ids": [1, 1, 0, 0, 0, 0],
                "encoder_positions": [0, 1, 2, 3, 4, 0],
                "decoder_positions": [0, 1, 0, 0, 0, 0],
            },
            [1, 3, 0, 0, 0, 0],
        ),
        (
            {
                "encoder_inputs": [7, 3, 8, 3, 0, 0],
                "decoder_inputs": [2, 9, 9, 9, 2, 8],
                "encoder_segment_ids": [1, 1, 2, 2, 0, 0],
                "decoder_segment_ids": [1, 1, 1, 1, 2, 2],
                "encoder_positions": [0, 1, 0, 1, 0, 0],
                "decoder_positions": [0, 1, 2, 3, 0, 1],
            },
            [9, 9, 9, 3, 8, 3],
        ),
    ]


def test_open_rows_must_be_a_positive_integer():
    with pytest.raises(ValueError, match=r"`open_rows` must be an integer >= 1. Received: open_rows=0"):
        pack_examples(examples_dataset([]), length=6, open_rows=0)


@pytest.fixture(scope="module")
def pairs():
    return make_pairs()


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_tokenizer([side for pair in pairs for side in pair], 40)


def unpacked_pairs(tokenizer, dataset):
    """Every (source, target) text pair in a packed dataset, cut out by segment."""
    found = collections.Counter()
    for inputs, labels in dataset.as_numpy_iterator():
        for row in range(labels.shape[0]):
            segments = inputs["encoder_segment_ids"][row]
            for segment in range(1, segments.max() + 1):
                source = inputs["encoder_inputs"][row][segments == segment]
                target_labels = labels[row][inputs["decoder_segment_ids"][row] == segment]
                decoder = inputs["decoder_inputs"][row][inputs["decoder_segment_ids"][row] == segment]
                # The pipeline's own rules hold inside a segment: EOS closes the source,
                # BOS opens the decoder input, the labels are it shifted by one.
                assert source[-1] == EOS_ID and decoder[0] == BOS_ID and target_labels[-1] == EOS_ID
                np.testing.assert_array_equal(decoder[1:], target_labels[:-1])
                found[tuple(tokenizer.decode([source[:-1], target_labels[:-1]]))] += 1
    return found


def test_packed_dataset_holds_every_kept_pair_once(pairs, tokenizer):
    dataset, stats = make_dataset(pairs, tokenizer, max_length=MAX_LENGTH, tokens_per_batch=256, packing=True)
    expected = collections.Counter(tuple(tokenizer.decode(tokenizer.encode(list(pair)))) for pair in pairs)
    assert unpacked_pairs(tokenizer, dataset) == expected
    assert stats.kept == stats.total == len(pairs)
    batches = list(dataset.as_numpy_iterator())
    assert len(batches) == stats.num_batches
    assert sum(labels.shape[0] for _, labels in batches) == stats.packed_rows
    # 256 // 64 = 4 rows of 64 tokens a batch, the last batch possibly short.
    assert {inputs["encoder_inputs"].shape for inputs, _ in batches[:-1]} == {(4, MAX_LENGTH)}
    assert set(batches[0][0]) == set(PACKED_FEATURES)
    # Packing fills rows: far fewer rows than pairs, and more real tokens than padding.
    assert stats.packed_rows < len(pairs) / 2
    real = sum(int(np.sum(inputs["decoder_segment_ids"] > 0)) for inputs, _ in batches)
    assert real / sum(inputs["decoder_segment_ids"].size for inputs, _ in batches) > 0.8
    assert "packed into" in str(stats)


def test_packed_epochs_reshuffle_the_same_rows(pairs, tokenizer):
    dataset, _ = make_dataset(pairs, tokenizer, max_length=MAX_LENGTH, tokens_per_batch=256, packing=True)

    def row_keys(epoch):
        return [tuple(row) for _, labels in epoch for row in labels.tolist()]

    first, second = (list(dataset.as_numpy_iterator()) for _ in range(2))
    assert row_keys(first) != row_keys(second)
    assert sorted(row_keys(first)) == sorted(row_keys(second))
    again, _ = make_dataset(pairs, tokenizer, max_length=MAX_LENGTH, tokens_per_batch=256, packing=True)
    assert row_keys(list(again.as_numpy_iterator())) == row_keys(first)


def test_packing_must_be_a_bool(pairs, tokenizer):
    with pytest.raises(ValueError, match="packing"):
        make_dataset(pairs, tokenizer, max_length=MAX_LENGTH, tokens_per_batch=256, packing="yes")


# ---------------------------------------------------------------- the model
# Three pairs (source ids with EOS, target ids), packed into two rows of 10.
PAIRS = [([5, 6, 7, EOS_ID], [8, 9, 10]), ([11, 12, EOS_ID], [13, 14, 15, 16]), ([17, 18, 19, 20, 21, EOS_ID], [22, 23])]
ROW_LENGTH = 10


def unpacked_batch():
    """The pairs one per row, padded: the ordinary batch."""
    encoder = np.zeros((3, ROW_LENGTH), "int32")
    decoder = np.zeros((3, ROW_LENGTH), "int32")
    labels = np.zeros((3, ROW_LENGTH), "int32")
    for row, (source, target) in enumerate(PAIRS):
        encoder[row, : len(source)] = source
        decoder[row, : len(target) + 1] = [BOS_ID] + target
        labels[row, : len(target) + 1] = target + [EOS_ID]
    return {"encoder_inputs": encoder, "decoder_inputs": decoder}, labels


def packed_batch():
    """The same pairs packed: pairs 0 and 1 share row 0, pair 2 is alone in row 1."""
    rows = [[0, 1], [2]]
    batch = {key: np.zeros((2, ROW_LENGTH), "int32") for key in PACKED_FEATURES}
    labels = np.zeros((2, ROW_LENGTH), "int32")
    for row, members in enumerate(rows):
        source_at = target_at = 0
        for segment, index in enumerate(members, start=1):
            source, target = PAIRS[index]
            decoder, label = [BOS_ID] + target, target + [EOS_ID]
            s = slice(source_at, source_at + len(source))
            t = slice(target_at, target_at + len(decoder))
            batch["encoder_inputs"][row, s] = source
            batch["encoder_segment_ids"][row, s] = segment
            batch["encoder_positions"][row, s] = np.arange(len(source))
            batch["decoder_inputs"][row, t] = decoder
            batch["decoder_segment_ids"][row, t] = segment
            batch["decoder_positions"][row, t] = np.arange(len(decoder))
            labels[row, t] = label
            source_at, target_at = s.stop, t.stop
    return batch, labels, rows


@pytest.mark.parametrize("position_encoding", ["sinusoidal", "learned"])
def test_packed_logits_are_each_pairs_own(position_encoding):
    model = kt.build_transformer(tiny_config(position_encoding=position_encoding))
    inputs, _ = unpacked_batch()
    alone = to_numpy(model(inputs))
    packed, labels, rows = packed_batch()
    together = to_numpy(model(packed))
    for row, members in enumerate(rows):
        for segment, index in enumerate(members, start=1):
            where = packed["decoder_segment_ids"][row] == segment
            length = int(where.sum())
            np.testing.assert_allclose(together[row][where], alone[index][:length], atol=2e-5)


def sgd_step(model, inputs, labels):
    """One SGD step; returns the loss and the updated weights."""
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0), loss=kt.LabelSmoothedCrossEntropy())
    loss = model.train_on_batch(inputs, labels)
    return float(np.ravel(loss)[0]), [to_numpy(weight) for weight in model.trainable_weights]


def test_packed_batch_gives_the_same_loss_and_update_as_unpacked():
    keras.utils.set_random_seed(7)
    first = kt.build_transformer(tiny_config())
    second = kt.build_transformer(tiny_config())
    second.set_weights(first.get_weights())
    before = [to_numpy(weight) for weight in first.trainable_weights]
    loss_alone, after_alone = sgd_step(first, *unpacked_batch())
    packed, labels, _ = packed_batch()
    loss_packed, after_packed = sgd_step(second, packed, labels)
    np.testing.assert_allclose(loss_packed, loss_alone, rtol=1e-5)
    moved = 0
    for start, alone, together in zip(before, after_alone, after_packed):
        # The update is the gradient (learning rate 1): the same update, the same gradient.
        np.testing.assert_allclose(together - start, alone - start, atol=2e-5)
        moved += int(np.abs(alone - start).max() > 1e-4)
    assert moved > len(before) // 2  # the step moved most weights: the comparison means something


def test_a_packed_batch_missing_an_input_is_refused():
    model = kt.build_transformer(tiny_config())
    packed, _, _ = packed_batch()
    del packed["decoder_positions"]
    with pytest.raises(ValueError, match=r"Missing: \['decoder_positions'\]"):
        model(packed)


def test_fit_on_packed_batches(pairs, tokenizer):
    dataset, stats = make_dataset(pairs, tokenizer, max_length=MAX_LENGTH, tokens_per_batch=256, packing=True)
    model = kt.build_transformer(tiny_config(vocab_size=tokenizer.vocab_size, max_length=MAX_LENGTH))
    # Packed rows all have one shape, so JAX compiles the step once; run op by op it takes a minute.
    kt.compile_transformer(model, jit_compile="auto" if keras.backend.backend() == "jax" else False)
    history = model.fit(dataset, epochs=2, verbose=0)
    losses = history.history["loss"]
    assert all(np.isfinite(losses)) and losses[1] < losses[0]


def test_run_config_packing_packs_the_training_batches_only():
    from keras_transformer.train.run import load_corpus, make_datasets
    from keras_transformer.train.run_config import RunConfig

    run_config = RunConfig(packing=True, demo_num_train=120, tokens_per_batch=128, vocab_size=64, model={"max_length": 32})
    splits = load_corpus(run_config)
    tokenizer = train_tokenizer([side for pair in splits["train"] for side in pair], 64)
    config = run_config.model_config().replace(vocab_size=tokenizer.vocab_size)
    datasets = make_datasets(run_config, config, splits, tokenizer)
    inputs, labels = next(iter(datasets.train))
    assert set(inputs) == set(PACKED_FEATURES) and tuple(labels.shape) == (4, 32)  # 128 // 32 rows
    assert datasets.train_stats.packed_rows > 0
    inputs, _ = next(iter(datasets.validation))
    assert set(inputs) == {"encoder_inputs", "decoder_inputs"}
