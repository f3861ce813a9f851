"""Subword regularization: sampled segmentations (BPE-dropout) in the tokenizer, the pipeline and a run."""

import collections

import pytest
import tensorflow as tf
from conftest import once_on

from keras_transformer.data.pipeline import _TOKENIZE_BATCH_SIZE, make_dataset
from keras_transformer.data.tokenizer import train_tokenizer
from keras_transformer.special_tokens import EOS_ID, PAD_ID

WORDS = "shepherd dog runs across green meadow toward wooden fence near old farmhouse".split()
# Long words, few of them: the vocabulary holds each as one piece, so only sampling splits them.
SENTENCES = [" ".join(WORDS[(3 * i + j) % len(WORDS)] for j in range(1 + i % 6)) for i in range(120)]
PAIR = ("shepherd dog runs across green meadow", "wooden fence near old farmhouse")


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer(SENTENCES, 80, model_type="bpe")


def rows_of(ids):
    return [tuple(int(i) for i in row) for row in ids.to_list()]


def test_alpha_zero_is_the_usual_segmentation(tokenizer):
    text = tf.constant(SENTENCES[:20])
    assert rows_of(tokenizer.tokenize_sampled(text, 0.0)) == rows_of(tokenizer.tokenize(text))


def test_sampling_varies_the_pieces_and_every_draw_gives_back_the_text(tokenizer):
    text = tf.constant([PAIR[0]] * 40)
    usual = rows_of(tokenizer.tokenize(text))[0]
    assert len(usual) == 6  # one piece a word: only a sampled segmentation splits them
    draws = rows_of(tokenizer.tokenize_sampled(text, 0.3))
    assert len(set(draws)) > 1 and any(len(draw) > len(usual) for draw in draws)
    assert set(tokenizer.decode([list(draw) for draw in draws])) == {PAIR[0]}
    # Called again, the op samples anew (a tf.data epoch re-runs it).
    assert rows_of(tokenizer.tokenize_sampled(text, 0.3)) != draws


def test_a_unigram_model_samples_too():
    unigram = train_tokenizer(SENTENCES, 33, model_type="unigram")  # the most this text makes
    text = tf.constant([PAIR[0]] * 40)
    assert rows_of(unigram.tokenize_sampled(text, 0.0)) == rows_of(unigram.tokenize(text))
    draws = rows_of(unigram.tokenize_sampled(text, 0.1))
    assert len(set(draws)) > 1
    assert set(unigram.decode([list(draw) for draw in draws])) == {PAIR[0]}


@pytest.mark.parametrize("alpha", [1.0, -0.1, float("nan"), "0.1"])
def test_bad_alpha_is_refused(tokenizer, alpha):
    with pytest.raises(ValueError, match=r"`alpha` must be a number in \[0, 1\). Received: alpha="):
        tokenizer.tokenize_sampled(tf.constant(["a"]), alpha)


def epochs_of_rows(dataset, batches):
    """(encoder input, decoder input, labels) of each row of the first `batches` batches, unpadded."""
    rows = []
    for inputs, labels in dataset.take(batches).as_numpy_iterator():
        for source, decoder_input, label in zip(inputs["encoder_inputs"], inputs["decoder_inputs"], labels):
            rows.append(tuple(tuple(int(i) for i in row if i != PAD_ID) for row in (source, decoder_input, label)))
    return rows


def test_only_the_sampled_side_changes_and_its_text_stays(tokenizer):
    dataset, stats = make_dataset(
        [PAIR] * 8, tokenizer, max_length=64, tokens_per_batch=128, repeat=True, subword_sampling=(0.0, 0.3)
    )
    assert dataset.cardinality() == tf.data.INFINITE_CARDINALITY
    assert stats.num_batches == 1  # counted over the usual segmentation: 8 rows in the bucket of 8
    rows = epochs_of_rows(dataset, 6)
    source, target = tokenizer.encode(list(PAIR))
    assert {row[0] for row in rows} == {tuple(source) + (EOS_ID,)}  # alpha 0: the usual pieces
    labels = {row[2] for row in rows}
    assert len(labels) > 1
    assert set(tokenizer.decode([list(label) for label in labels])) == {PAIR[1]}
    for _, decoder_input, label in rows:  # still the labels shifted by one, EOS last
        assert decoder_input[1:] == label[:-1] and label[-1] == EOS_ID


def test_a_float_samples_both_sides(tokenizer):
    dataset, _ = make_dataset([PAIR] * 8, tokenizer, max_length=64, tokens_per_batch=128, repeat=True,
                              subword_sampling=0.3)
    rows = epochs_of_rows(dataset, 6)
    assert len({row[0] for row in rows}) > 1 and len({row[2] for row in rows}) > 1


@once_on("torch", "tf.data and sentencepiece only, the same under every backend (30 passes of sampling)")
def test_sampled_pairs_over_max_length_are_dropped_and_the_stream_goes_on(tokenizer):
    # Each word one piece: PAIR's 6 + EOS = 7 tokens fit max_length 7 unsampled, and a draw
    # that skips any of its words' ~40 merges does not (at alpha 0.05, about 4 draws in 5).
    # A one-word pair fits however it is cut. Whole passes of the 8 PAIRs are dropped
    # often, and the stream must not end there.
    short = ("dog", "fence")
    dataset, stats = make_dataset([PAIR] * 8 + [short] * 8, tokenizer, max_length=7, tokens_per_batch=64,
                                  repeat=True, subword_sampling=(0.05, 0.0))
    assert stats.kept == 16
    rows = epochs_of_rows(dataset, 30)
    assert len(rows) >= 30 * 4 and all(len(row[0]) <= 7 for row in rows)
    texts = tokenizer.decode([list(row[0]) for row in rows])
    assert set(texts) == {PAIR[0], short[0]}
    # Unsampled the two would come equally often; kept draws of PAIR are ~1 in 5.
    assert texts.count(PAIR[0]) < 0.35 * len(texts)
    # Two PAIRs alone at alpha 0.1: almost every pass keeps neither, yet every batch asked for comes.
    alone, _ = make_dataset([PAIR] * 2, tokenizer, max_length=7, tokens_per_batch=64, repeat=True,
                            subword_sampling=(0.1, 0.0))
    assert len(list(alone.take(3))) == 3


def test_the_first_sampled_batch_comes_after_about_one_pass_over_the_pairs(tokenizer):
    # The sampled stream is endless, so a batch shuffle buffer larger than an epoch would
    # be filled from many passes before the first batch. It holds one epoch's batches, as
    # a finite epoch's shuffle does. Asked for 20,000 batches, a buffer that big would read
    # ~2,700 passes here (~108,000 pairs). The pipeline also reads ahead whole tokenizing
    # batches of 1,024 pairs (25.6 passes each), as many as tf.data's autotuned map runs at
    # once: how far it gets depends on the machine's speed (a fast one read 1,200 pairs, a
    # slow one under 1,184), so the bound allows four such batches.
    pairs = [(sentence, sentence) for sentence in SENTENCES[:40]]
    reads = []

    def counted():
        for pair in pairs:
            reads.append(1)
            yield pair

    spec = (tf.TensorSpec([], tf.string), tf.TensorSpec([], tf.string))
    buffer = 20_000
    dataset, stats = make_dataset(tf.data.Dataset.from_generator(counted, output_signature=spec), tokenizer,
                                  max_length=64, tokens_per_batch=64, cache=False, repeat=True,
                                  subword_sampling=0.1, batch_shuffle_buffer_size=buffer)
    assert stats.kept == len(pairs) and 4 <= stats.num_batches < 10
    del reads[:]  # the counting pass
    next(iter(dataset))
    bound = 4 * _TOKENIZE_BATCH_SIZE + 4 * len(pairs)
    assert bound < buffer / stats.num_batches * len(pairs) / 20  # the bug would read 20x the bound
    assert len(reads) <= bound, f"{len(reads) / len(pairs):.1f} passes read"


class _NoSampling:
    """A tokenizer that can only cut one way (like `MarianTokenizer`)."""

    def __init__(self, tokenizer):
        self.vocab_size = tokenizer.vocab_size
        self.tokenize = tokenizer.tokenize


def test_what_sampling_cannot_do_is_refused(tokenizer):
    def build(**options):
        return make_dataset([PAIR] * 8, options.pop("tokenizer", tokenizer), max_length=64, tokens_per_batch=128,
                            **options)

    with pytest.raises(ValueError, match=r"pass repeat=True and give model.fit steps_per_epoch"):
        build(subword_sampling=0.1)
    with pytest.raises(ValueError, match=r"a SubwordTokenizer\); _NoSampling cannot"):
        build(subword_sampling=0.1, repeat=True, tokenizer=_NoSampling(tokenizer))
    with pytest.raises(ValueError, match=r"one alpha or a \(source, target\) pair.*\(0.1, 0.1, 0.1\)"):
        build(subword_sampling=(0.1, 0.1, 0.1), repeat=True)
    with pytest.raises(ValueError, match=r"`subword_sampling` must be a number in \[0, 1\). Received: subword_sampling=1.5"):
        build(subword_sampling=(0.0, 1.5), repeat=True)
    # Zero is no sampling: any tokenizer, no repeat needed, a finite epoch.
    dataset, stats = build(subword_sampling=(0.0, 0.0), tokenizer=_NoSampling(tokenizer))
    assert dataset.cardinality() == stats.num_batches


def run_config(**changes):
    from keras_transformer.train.run_config import RunConfig

    values = dict(vocab_size=80, tokens_per_batch=128, model={"max_length": 64})
    values.update(changes)
    return RunConfig(**values)


def test_run_config_checks_the_alphas():
    with pytest.raises(ValueError, match=r"`subword_sampling_target` must be a number in \[0, 1\)"):
        run_config(subword_sampling_target=1.0)
    assert run_config().with_overrides(["subword_sampling_source=0.1"]).subword_sampling_source == 0.1


def test_a_run_samples_its_training_batches_and_not_validation(tokenizer):
    from keras_transformer.train.run import make_datasets

    config = run_config(subword_sampling_target=0.3)
    pairs = [PAIR] * 8
    datasets = make_datasets(config, config.model_config(tokenizer.vocab_size), {"train": pairs, "validation": pairs},
                             tokenizer)
    # An epoch is one unsampled pass's batches; the stream itself never ends.
    assert datasets.steps_per_epoch == datasets.train_stats.num_batches == 1
    assert datasets.train.cardinality() == tf.data.INFINITE_CARDINALITY
    assert len({row[2] for row in epochs_of_rows(datasets.train, 6)}) > 1
    validation = {row[2] for row in epochs_of_rows(datasets.validation, 6)}
    assert validation == {tuple(tokenizer.encode([PAIR[1]])[0]) + (EOS_ID,)}


def _several_processes(monkeypatch):
    """Makes this process look like one of two workers, the way its backend would say so."""
    import keras

    from keras_transformer.train import run

    backend = keras.backend.backend()
    if backend == "tensorflow":  # a MultiWorkerMirroredStrategy resolved from TF_CONFIG
        monkeypatch.setattr(run, "_multi_worker_strategy", lambda run_config: object())
        return "several"
    if backend == "jax":  # Keras' process variables, before select_strategy joins the processes
        monkeypatch.setenv("KERAS_DISTRIBUTION_NUM_PROCESSES", "2")
        return "2"
    import torch.distributed  # torchrun's process group

    monkeypatch.setattr(torch.distributed, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.distributed, "get_world_size", lambda: 2)
    return "2"


def test_a_sampled_run_of_several_worker_processes_is_refused_naming_both_settings(monkeypatch):
    from keras_transformer.train.run import check_sampling_strategy

    sampled = run_config(subword_sampling_target=0.1)
    check_sampling_strategy(sampled)  # one process: trained (through make_dataset)
    processes = _several_processes(monkeypatch)
    check_sampling_strategy(run_config())  # not sampled: the workers share IndexBatches' batches
    with pytest.raises(ValueError, match=(
        r"^Subword sampling does not combine with training in several worker processes: .* Received: "
        rf"subword_sampling_source=0.0, subword_sampling_target=0.1 and strategy='' \({processes} worker processes\)")):
        check_sampling_strategy(sampled)
    with pytest.raises(ValueError, match=r"strategy='multi_worker' \(several worker processes\)"):
        check_sampling_strategy(sampled.replace(strategy="multi_worker"))
