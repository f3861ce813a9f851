"""Bidirectional training: both directions for the first N steps, then source->target."""

import collections
import json
import shutil

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import once_on

from keras_transformer.data.bidirectional import bidirectional_pairs, bidirectional_then_forward
from keras_transformer.data.pipeline import make_dataset
from keras_transformer.data.tokenizer import train_tokenizer
from keras_transformer.special_tokens import EOS_ID

ENGLISH = "red blue green black white small big old new one two three".split()
GERMAN = "rot blau gruen schwarz weiss klein gross alt neu eins zwei drei".split()
MAX_LENGTH = 16
VOCAB_SIZE = 48  # as many pieces as sentencepiece makes of this text


def toy_pairs(count, seed=0):
    """English->German pairs of 1-3 words, word for word."""
    rng = np.random.default_rng(seed)
    pairs = []
    for i in range(count):
        words = rng.integers(0, len(ENGLISH), size=1 + i % 3)
        pairs.append((" ".join(ENGLISH[w] for w in words), " ".join(GERMAN[w] for w in words)))
    return pairs


@pytest.fixture(scope="module")
def pairs():
    return toy_pairs(90)


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_tokenizer([side for pair in pairs for side in pair], VOCAB_SIZE)


def run_config(**changes):
    from keras_transformer.train.run_config import RunConfig

    values = dict(vocab_size=VOCAB_SIZE, tokens_per_batch=64, model={"max_length": MAX_LENGTH})
    values.update(changes)
    return RunConfig(**values)


def batch_rows(dataset, count, tokenizer):
    """The (source, target) text of every row of the first `count` batches."""
    rows = []
    for inputs, labels in dataset.take(count):
        for source, target in zip(inputs["encoder_inputs"].numpy(), labels.numpy()):
            rows.append(tuple(tokenizer.decode([_before_eos(ids)])[0] for ids in (source, target)))
    return rows


def _before_eos(ids):
    ids = list(ids)
    return ids[: ids.index(EOS_ID)]


def test_bidirectional_pairs_appends_every_pair_reversed():
    assert bidirectional_pairs([("a", "b"), ["c", "d"]]) == [("a", "b"), ("c", "d"), ("b", "a"), ("d", "c")]
    assert bidirectional_pairs([]) == []


@pytest.mark.parametrize(
    "bad, message",
    [
        ("a\tb", r"a list of \(source, target\) pairs. Received: type str"),
        ([("a", "b"), ("c",)], r"Received at index 1: \('c',\)"),
        ([("a", "b", "c")], r"Received at index 0: \('a', 'b', 'c'\)"),
    ],
)
def test_bidirectional_pairs_refuses_what_is_not_pairs(bad, message):
    with pytest.raises(ValueError, match=message):
        bidirectional_pairs(bad)


def test_bidirectional_then_forward_takes_exactly_steps_batches_first():
    both = tf.data.Dataset.range(10, 13).repeat()
    forward = tf.data.Dataset.range(3)
    joined = bidirectional_then_forward(both, forward, 5)
    assert list(joined.as_numpy_iterator()) == [10, 11, 12, 10, 11, 0, 1, 2]
    assert bidirectional_then_forward(both, forward, 0) is forward
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match=rf"integer >= 0. Received: steps={bad!r}"):
            bidirectional_then_forward(both, forward, bad)


def _bidirectional_batches_per_pass(pairs, tokenizer):
    _, stats = make_dataset(
        bidirectional_pairs(pairs), tokenizer, max_length=MAX_LENGTH, tokens_per_batch=64, vocab_size=VOCAB_SIZE
    )
    assert stats.kept == stats.total == 2 * len(pairs)
    return stats.num_batches


def test_training_reads_both_directions_for_exactly_the_steps_asked_then_one(pairs, tokenizer):
    from keras_transformer.train.run import make_datasets

    both_pass = _bidirectional_batches_per_pass(pairs, tokenizer)
    config = run_config(bidirectional_steps=both_pass)
    model_config = config.model_config(tokenizer.vocab_size)
    datasets = make_datasets(config, model_config, {"train": pairs, "validation": pairs[:5]}, tokenizer)
    forward_pass = datasets.train_stats.num_batches
    assert datasets.steps_per_epoch == forward_pass  # a Keras epoch: one source->target pass
    assert both_pass > forward_pass

    rows = batch_rows(datasets.train, both_pass + forward_pass, tokenizer)
    first = 2 * len(pairs)  # rows in one pass both ways (none dropped)
    # One whole pass of the pairs both ways, then one of the pairs as given: nothing more.
    assert collections.Counter(rows[:first]) == collections.Counter(bidirectional_pairs(pairs))
    assert collections.Counter(rows[first:]) == collections.Counter(pairs)
    # Validation stays source->target.
    assert collections.Counter(batch_rows(datasets.validation, 10, tokenizer)) == collections.Counter(pairs[:5])


def test_a_resumed_run_reads_only_the_bidirectional_steps_it_has_left(pairs, tokenizer):
    from keras_transformer.train.run import make_datasets

    splits = {"train": pairs}
    epoch = make_datasets(run_config(bidirectional_steps=1), run_config().model_config(VOCAB_SIZE), splits, tokenizer).steps_per_epoch
    config = run_config(bidirectional_steps=epoch + 3)
    resumed = make_datasets(config, config.model_config(VOCAB_SIZE), splits, tokenizer, completed_epochs=1)
    batches = [batch_rows(tf.data.Dataset.from_tensors(batch), 1, tokenizer) for batch in resumed.train.take(3 + epoch)]
    left = [row for batch in batches[:3] for row in batch]
    after = [row for batch in batches[3:] for row in batch]
    # The 3 steps left read both ways; then one whole source->target pass, nothing else.
    assert set(left) <= set(bidirectional_pairs(pairs)) and not set(left) <= set(pairs)
    assert collections.Counter(after) == collections.Counter(pairs)
    # Past the bidirectional steps a resumed run reads source->target from the start.
    done = make_datasets(config, config.model_config(VOCAB_SIZE), splits, tokenizer, completed_epochs=2)
    assert collections.Counter(batch_rows(done.train, epoch, tokenizer)) == collections.Counter(pairs)


def test_without_bidirectional_steps_the_batches_are_one_pass_as_before(pairs, tokenizer):
    from keras_transformer.train.run import make_datasets

    config = run_config()
    datasets = make_datasets(config, config.model_config(VOCAB_SIZE), {"train": pairs}, tokenizer)
    assert datasets.steps_per_epoch is None  # fit reads to the end of the pass
    rows = batch_rows(datasets.train, 1000, tokenizer)
    assert collections.Counter(rows) == collections.Counter(pairs)


def test_backed_up_epochs_reads_the_backup_a_resumed_run_restores(tmp_path):
    from keras_transformer.train.run_directory import backed_up_epochs

    backup = tmp_path / "backup"
    assert backed_up_epochs(str(backup)) == 0  # no backup: from the first epoch
    backup.mkdir()
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.save_weights(str(backup / "latest.weights.h5"))
    shutil.copyfile(backup / "latest.weights.h5", backup / "latest.weights.h5.bkp")
    (backup / "training_metadata.json").write_text(json.dumps({"epoch": 3, "batch": 0}))
    (backup / "training_metadata.json.bkp").write_text(json.dumps({"epoch": 2, "batch": 0}))
    assert backed_up_epochs(str(backup)) == 3
    (backup / "training_metadata.json").write_text('{"epo')  # cut short by a kill
    assert backed_up_epochs(str(backup)) == 2  # the pair repair_backup keeps
    (backup / "latest.weights.h5.bkp").write_bytes(b"cut")
    assert backed_up_epochs(str(backup)) == 0


def test_run_config_refuses_negative_bidirectional_steps():
    with pytest.raises(ValueError, match="bidirectional_steps"):
        run_config(bidirectional_steps=-1)
    assert run_config().with_overrides(["bidirectional_steps=7"]).bidirectional_steps == 7


@once_on("torch", "the run's bidirectional reading is tf.data and Python, the same on every backend "
         "(a run's compiled training is test_training.py's, on every backend)")
def test_a_bidirectional_run_trains_and_counts_its_epochs_in_source_target_passes(tmp_path, capsys):
    from keras_transformer.train.run import run_training

    for split, count in (("train", 90), ("val", 6)):
        chosen = toy_pairs(count, seed=len(split))
        (tmp_path / f"{split}.en").write_text("".join(source + "\n" for source, _ in chosen))
        (tmp_path / f"{split}.de").write_text("".join(target + "\n" for _, target in chosen))
    config = run_config(
        name="both", output_dir=str(tmp_path / "out"), corpus="files", data_dir=str(tmp_path),
        validation_split="val", test_split="", epochs=2, bidirectional_steps=3, verbose=0,
        bleu_every_epochs=0, sample_translations=0, keep_checkpoints=1,
        bucket_width=MAX_LENGTH,  # one bucket: one batch shape
        jit_compile=False,
        model=dict(max_length=MAX_LENGTH, d_model=16, d_ff=32, num_heads=2,
                   num_encoder_layers=1, num_decoder_layers=1, dropout=0.0),
    )
    result = run_training(config)
    assert "bidirectional: the first 3 steps read the pairs both ways (en<->de), then en->de only" in capsys.readouterr().out
    assert result.steps == 2 * result.steps_per_epoch  # epochs of source->target passes
    assert np.isfinite(result.history.history["val_loss"]).all()


class _Recorder(keras.layers.Layer):
    """Passes its input through; in training, records the first value of each batch."""

    def __init__(self, seen, **kwargs):
        super().__init__(**kwargs)
        self.record = seen.append  # a list attribute would be tracked: Keras would copy it

    def call(self, inputs, training=None):
        if training and not isinstance(inputs, keras.KerasTensor):
            self.record(int(keras.ops.convert_to_numpy(inputs)[0, 0]))
        return inputs


def test_keras_epochs_do_not_restart_the_bidirectional_steps():
    # What fit trains on, step by step: with steps_per_epoch, Keras keeps one iterator
    # across epochs, so the bidirectional batches come once, not at every epoch's start.
    both = tf.data.Dataset.range(100, 200).repeat()
    forward = tf.data.Dataset.range(10).repeat()
    joined = bidirectional_then_forward(both, forward, 5).map(
        lambda i: (tf.fill((1, 1), tf.cast(i, tf.float32)), tf.zeros((1, 1)))
    )
    seen = []
    model = keras.Sequential([keras.Input((1,)), _Recorder(seen), keras.layers.Dense(1)])
    model.compile("sgd", "mse", run_eagerly=True)
    model.fit(joined, epochs=4, steps_per_epoch=3, verbose=0)
    assert seen == [100, 101, 102, 103, 104, 0, 1, 2, 3, 4, 5, 6]
