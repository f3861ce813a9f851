"""Training on a binarized corpus through `run_training`, on every backend.

A file corpus (gzip included) is binarized once under `binarized_dir` and opened by
later runs; the demo corpus is binarized in memory. Either way a resumed run's batches
continue where the finished epochs stopped.
"""

import gzip

import keras
import numpy as np
import pytest

from conftest import once_on
from keras_transformer.data.content_key import RECORD_FILE
from keras_transformer.data.index_batches import IndexBatches
from keras_transformer.data.text_corpus import TextCorpus
from keras_transformer.data.tokenizer import train_tokenizer
from keras_transformer.train import run
from keras_transformer.train.run import load_corpus, make_datasets, run_training
from keras_transformer.train.run_config import RunConfig

SOURCE_WORDS = "red blue green black white small big old new one two three".split()
TARGET_WORDS = "rot blau gruen schwarz weiss klein gross alt neu eins zwei drei".split()


def _write_corpus(directory, pairs=80):
    rng = np.random.default_rng(0)
    words = [rng.integers(0, 12, size=1 + i % 3) for i in range(pairs)]
    (directory / "train.en").write_text("".join(" ".join(SOURCE_WORDS[w] for w in ws) + "\n" for ws in words))
    german = "".join(" ".join(TARGET_WORDS[w] for w in ws[::-1]) + "\n" for ws in words)
    (directory / "train.de.gz").write_bytes(gzip.compress(german.encode()))
    return directory


def _config(tmp_path, **changes):
    settings = dict(
        name="run", output_dir=str(tmp_path / "out"), corpus="files", data_dir=str(tmp_path),
        source_lang="en", target_lang="de", validation_split="", test_split="", vocab_size=40,
        epochs=1, bleu_every_epochs=0, sample_translations=0, verbose=0, jit_compile=False,
        keep_checkpoints=1, tokens_per_batch=64, binarized_dir=str(tmp_path / "binarized"),
        model=dict(d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                   max_length=8, dropout=0.0),
    )
    return RunConfig(**{**settings, **changes})


def test_a_run_binarizes_its_training_split_once_and_later_runs_open_it(tmp_path, capsys):
    _write_corpus(tmp_path)
    printed = []
    result = run_training(_config(tmp_path), print_fn=printed.append)
    assert any(line.startswith("corpus: streamed train pairs") for line in printed)
    assert any("binarized corpus: 80 pairs" in line and "written to" in line for line in printed)
    assert result.steps == result.steps_per_epoch > 0
    assert "tokenizer: reused" not in capsys.readouterr().out
    printed.clear()
    again = run_training(_config(tmp_path, overwrite=True), print_fn=printed.append)
    assert any("binarized corpus: 80 pairs, opened from" in line for line in printed)
    assert "tokenizer: reused from" in capsys.readouterr().out
    assert again.tokenizer.fingerprint == result.tokenizer.fingerprint
    # Beside them, the record of the input files' digests (data.content_key): the files are not read again.
    kept = sorted(path.name.split("-")[0] for path in (tmp_path / "binarized").iterdir() if path.name != RECORD_FILE)
    assert kept == ["tokenizer", "train"]


def test_a_resumed_run_reads_on_from_the_batch_where_it_stopped(tmp_path):
    _write_corpus(tmp_path)
    run_config = _config(tmp_path, steps_per_epoch=3)
    splits = load_corpus(run_config)
    assert isinstance(splits["train"], TextCorpus)
    tokenizer = train_tokenizer([side for pair in splits["train"] for side in pair], 40)
    model_config = run_config.model_config(tokenizer.vocab_size)
    unbroken = make_datasets(run_config, model_config, splits, tokenizer, print_fn=lambda line: None)
    resumed = make_datasets(run_config, model_config, splits, tokenizer, completed_epochs=2, print_fn=lambda line: None)
    assert unbroken.steps_per_epoch == resumed.steps_per_epoch == 3
    expected = [labels for _, labels in unbroken.train.take(8).as_numpy_iterator()][6:]
    for want, (_, labels) in zip(expected, resumed.train.take(2).as_numpy_iterator()):
        np.testing.assert_array_equal(labels, want)


def test_subword_sampling_keeps_the_training_split_in_memory(tmp_path):
    _write_corpus(tmp_path, pairs=10)
    splits = load_corpus(_config(tmp_path, subword_sampling_source=0.1, max_train_pairs=4))
    assert isinstance(splits["train"], list) and len(splits["train"]) == 4


def test_the_binarized_copy_goes_to_the_user_cache_not_beside_the_run(tmp_path, monkeypatch):
    _write_corpus(tmp_path)
    monkeypatch.setenv("KERAS_TRANSFORMER_CACHE", str(tmp_path / "cache"))
    run_config = _config(tmp_path, binarized_dir="")
    splits = load_corpus(run_config)
    tokenizer = train_tokenizer([side for pair in splits["train"] for side in pair], 40)
    make_datasets(run_config, run_config.model_config(40), splits, tokenizer, print_fn=lambda line: None)
    kept = [path.name.split("-")[0] for path in (tmp_path / "cache" / "binarized").iterdir() if path.name != RECORD_FILE]
    assert kept == ["train"]
    assert not (tmp_path / "out").exists()


# ---------------------------------------------------------------- the demo corpus, in memory
def _demo_config(tmp_path, **changes):
    # One bucket (bucket_width = max_length): one batch shape, one trace of the step.
    return _config(tmp_path, corpus="demo", data_dir="", demo_num_train=120, vocab_size=100, steps_per_epoch=2,
                   bucket_width=32, **{"model": dict(d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1,
                                                     num_decoder_layers=1, max_length=32, dropout=0.0), **changes})


def test_a_resumed_demo_run_reads_on_from_the_batch_where_it_stopped(tmp_path):
    run_config = _demo_config(tmp_path)
    splits = load_corpus(run_config)
    assert isinstance(splits["train"], list) and len(splits["train"]) == 120
    tokenizer = train_tokenizer([side for pair in splits["train"] for side in pair], 100)
    model_config = run_config.model_config(tokenizer.vocab_size)
    unbroken = make_datasets(run_config, model_config, splits, tokenizer, print_fn=lambda line: None)
    resumed = make_datasets(run_config, model_config, splits, tokenizer, completed_epochs=2, print_fn=lambda line: None)
    assert unbroken.target_tokens == resumed.target_tokens > 120  # counted as the pairs were binarized
    expected = [batch for batch in unbroken.train.take(6).as_numpy_iterator()][4:]
    for (want_inputs, want_labels), (inputs, labels) in zip(expected, resumed.train.take(2).as_numpy_iterator()):
        np.testing.assert_array_equal(labels, want_labels)
        np.testing.assert_array_equal(inputs["encoder_inputs"], want_inputs["encoder_inputs"])


class _Killed(Exception):
    pass


@once_on("tensorflow", "the batch stream is tf.data and the backup Keras' files on every backend; three runs "
                       "cost half a minute")
def test_a_demo_run_killed_after_an_epoch_resumes_at_the_next_batch_as_an_unbroken_run(tmp_path, monkeypatch):
    starts = []  # the global batch each run's training stream starts at
    dataset = IndexBatches.dataset
    monkeypatch.setattr(IndexBatches, "dataset", lambda self, start=0, replicas=1: starts.append(start) or dataset(self, start, replicas))

    class KillAtEpoch(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == 2:
                raise _Killed  # after BackupAndRestore saved epoch 2

    callbacks = run._run_callbacks
    with monkeypatch.context() as patched:
        patched.setattr(run, "_run_callbacks", lambda *args, **kwargs: callbacks(*args, **kwargs) + [KillAtEpoch()])
        with pytest.raises(_Killed):
            run_training(_demo_config(tmp_path, epochs=3), print_fn=lambda line: None)
    resumed = run_training(_demo_config(tmp_path, epochs=3), print_fn=lambda line: None)
    unbroken = run_training(_demo_config(tmp_path, epochs=3, name="unbroken"), print_fn=lambda line: None)
    assert starts == [0, 4, 0]  # the resumed stream starts after epochs 1 and 2's 2 batches each
    assert (resumed.steps, unbroken.steps) == (2, 6)
    # The same batches after the same weights: the same model, to float32 rounding.
    for got, want in zip(resumed.model.weights, unbroken.model.weights):
        np.testing.assert_allclose(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want), atol=1e-5)
