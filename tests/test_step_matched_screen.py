"""`bench/step_matched_screen.py`: its numpy batches are the pipeline's, its padding is inert.

The screen replays a CPU budget's updates on another device from batches made by numpy,
so what it measures is only the recipe's if (1) every epoch's batches have the shapes
`make_dataset` gives the same pairs, each kept pair once, and (2) padding a batch to the
screen's fixed shapes changes neither the loss nor the update.
"""

import collections
import json
import os
import pathlib
import sys

import keras
import numpy as np
import pytest

import keras_transformer as kt
from conftest import once_on, tiny_config, to_numpy
from keras_transformer.data.pipeline import evenly_spaced_boundaries, make_dataset
from keras_transformer.data.tokenizer import train_tokenizer
from keras_transformer.special_tokens import BOS_ID, EOS_ID
from test_pipeline import make_pairs
from tiny_translation import VOCAB_SIZE, tiny_sentences

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.step_matched_screen import epoch_batches, fitting, main, padded_batches, pair_length  # noqa: E402

MAX_LENGTH = 12  # some toy pairs are longer: the drop is exercised
TOKENS_PER_BATCH = 48


@pytest.fixture(scope="module")
def pairs():
    return make_pairs()


@pytest.fixture(scope="module")
def tokenizer(pairs):
    return train_tokenizer([side for pair in pairs for side in pair], 40)


def sgd_step(model, inputs, labels):
    """One SGD step; returns the loss and the updated weights."""
    model.compile(optimizer=keras.optimizers.SGD(learning_rate=1.0), loss=kt.LabelSmoothedCrossEntropy())
    loss = model.train_on_batch(inputs, labels)
    return float(np.ravel(loss)[0]), [to_numpy(weight) for weight in model.trainable_weights]


def token_ids(tokenizer, pairs):
    source = [list(map(int, ids)) for ids in tokenizer.tokenize([s for s, _ in pairs]).to_list()]
    target = [list(map(int, ids)) for ids in tokenizer.tokenize([t for _, t in pairs]).to_list()]
    return source, target


def test_an_epoch_has_the_batch_shapes_of_make_dataset_and_each_kept_pair_once(pairs, tokenizer):
    boundaries = evenly_spaced_boundaries(4, MAX_LENGTH)
    dataset, stats = make_dataset(
        pairs, tokenizer, max_length=MAX_LENGTH, tokens_per_batch=TOKENS_PER_BATCH,
        bucket_boundaries=boundaries,
    )
    expected = collections.Counter(labels.shape[::-1] for _, labels in dataset.as_numpy_iterator())
    source, target = fitting(*token_ids(tokenizer, pairs), MAX_LENGTH)
    assert len(source) == stats.kept < stats.total  # the same pairs dropped
    rng = np.random.default_rng(0)
    for _ in range(2):  # each epoch, reshuffled
        batches = epoch_batches(source, target, rng, np.array(boundaries), TOKENS_PER_BATCH)
        assert collections.Counter((boundary, len(rows)) for rows, boundary in batches) == expected
        assert sorted(np.concatenate([rows for rows, _ in batches]).tolist()) == list(range(len(source)))
        for rows, boundary in batches:
            lengths = [pair_length(source[i], target[i]) for i in rows]
            assert max(lengths) <= boundary and min(lengths) > boundary - 4  # the right bucket


def archive_of(source, target, batches, max_length):
    """What `prepare` writes, as `padded_batches` reads it."""
    flat = [ids for rows, _ in batches for i in rows for ids in (source[i], target[i])]
    meta = {"model": {"max_length": max_length}}
    archive = {
        "tokens": np.concatenate([np.asarray(ids, np.int16) for ids in flat]),
        "lengths": np.array([len(ids) for ids in flat], np.int16),
        "batch_rows": np.array([len(rows) for rows, _ in batches]),
        "batch_boundaries": np.array([boundary for _, boundary in batches]),
    }
    return archive, meta


def test_padded_batches_hold_each_pair_as_the_pipeline_shapes_it():
    source, target = [[5, 6], [7], [8, 9, 10], [17]], [[11], [12, 13, 14], [15, 16], [18]]
    batches = [(np.array([2, 0]), 4), (np.array([1]), 20), (np.array([3]), 8)]
    archive, meta = archive_of(source, target, batches, max_length=24)
    (first, first_labels), (second, second_labels), (third, third_labels) = padded_batches(archive, meta)
    # Buckets 4 and 8 pad to 16 columns and the 2 rows of the group's largest batch; bucket
    # 20 pads to the last group, the model's max_length (24).
    assert first["encoder_inputs"].shape == third["encoder_inputs"].shape == (2, 16)
    assert second["encoder_inputs"].shape == (1, 24)
    np.testing.assert_array_equal(first["encoder_inputs"][:, :4], [[8, 9, 10, EOS_ID], [5, 6, EOS_ID, 0]])
    np.testing.assert_array_equal(first["decoder_inputs"][:, :3], [[BOS_ID, 15, 16], [BOS_ID, 11, 0]])
    np.testing.assert_array_equal(first_labels[:, :3], [[15, 16, EOS_ID], [11, EOS_ID, 0]])
    np.testing.assert_array_equal(second["decoder_inputs"][0, :5], [BOS_ID, 12, 13, 14, 0])
    np.testing.assert_array_equal(second_labels[0, :5], [12, 13, 14, EOS_ID, 0])
    np.testing.assert_array_equal(third["encoder_inputs"][:, :3], [[17, EOS_ID, 0], [0, 0, 0]])
    np.testing.assert_array_equal(third_labels[:, :3], [[18, EOS_ID, 0], [0, 0, 0]])
    for inputs, labels, real in ((first, first_labels, 7), (second, second_labels, 2), (third, third_labels, 2)):
        # Everything past the pairs is padding.
        assert int((inputs["encoder_inputs"] > 0).sum()) == real
        assert int((inputs["decoder_inputs"] > 0).sum()) == int((labels > 0).sum())


def test_padding_to_the_screen_shapes_changes_neither_loss_nor_update(pairs, tokenizer):
    source, target = fitting(*token_ids(tokenizer, pairs), MAX_LENGTH)
    batches = epoch_batches(source, target, np.random.default_rng(1), np.array([4, 8, 12]), TOKENS_PER_BATCH)
    rows, boundary = next((rows, boundary) for rows, boundary in batches if boundary == 8 and len(rows) > 2)
    larger = max(batches, key=lambda batch: len(batch[0]))
    assert len(larger[0]) > len(rows)
    archive, meta = archive_of(source, target, [(rows, boundary), larger], MAX_LENGTH)
    padded, padded_labels = padded_batches(archive, meta)[0]
    # Padded in both directions: to the group's length (12) and to the larger batch's rows.
    assert padded_labels.shape == (len(larger[0]), MAX_LENGTH)
    exact = {key: value[:len(rows), :boundary] for key, value in padded.items()}
    keras.utils.set_random_seed(3)
    first = kt.build_transformer(tiny_config(vocab_size=tokenizer.vocab_size, max_length=16))
    second = kt.build_transformer(tiny_config(vocab_size=tokenizer.vocab_size, max_length=16))
    second.set_weights(first.get_weights())
    before = [to_numpy(weight) for weight in first.trainable_weights]
    loss_exact, after_exact = sgd_step(first, exact, padded_labels[:len(rows), :boundary])
    loss_padded, after_padded = sgd_step(second, padded, padded_labels)
    np.testing.assert_allclose(loss_padded, loss_exact, rtol=1e-5)
    for start, alone, together in zip(before, after_exact, after_padded):
        np.testing.assert_allclose(together - start, alone - start, atol=2e-5)
    assert sum(int(np.abs(a - s).max() > 1e-4) for s, a in zip(before, after_exact)) > len(before) // 2


def _screen_run(tmp_path):
    """A run directory (config.toml, tokenizer.model) and a data directory for `prepare`."""
    sentences = tiny_sentences()
    data, run = tmp_path / "data", tmp_path / "run"
    data.mkdir()
    run.mkdir()
    for split, rows in (("train", sentences), ("val", sentences[:10])):
        (data / f"{split}.en").write_text("\n".join(rows) + "\n")
        (data / f"{split}.de").write_text("\n".join(" ".join(row.split()[::-1]) for row in rows) + "\n")
    kt.train_tokenizer(sentences, vocab_size=VOCAB_SIZE, model_type="bpe").save(str(run))
    (run / "config.toml").write_text(
        f'name = "screen"\npreset = "tiny"\ncorpus = "files"\ndata_dir = "{data}"\n'
        'source_lang = "en"\ntarget_lang = "de"\ntrain_split = "train"\nvalidation_split = "val"\n'
        f"vocab_size = {VOCAB_SIZE}\nbucket_width = 4\ntokens_per_batch = 64\n\n[model]\nmax_length = 16\n"
    )
    return data, run


def test_a_shorter_prepare_writes_the_first_updates_of_a_longer_one(tmp_path):
    # `train --steps N` replays the first N updates of a longer archive as if `prepare`
    # had been run with --steps N: the same seed must draw the same epochs in order.
    data, run = _screen_run(tmp_path)
    archives = {}
    for steps in (7, 60):  # 60 updates read several epochs of the 100 pairs
        output = tmp_path / f"screen{steps}.npz"
        main(["prepare", str(data), "--model-dir", str(run), "--steps", str(steps), "--output", str(output)])
        archives[steps] = np.load(output)
    short, long = archives[7], archives[60]
    short_meta, long_meta = (json.loads(str(a["meta"])) for a in (short, long))
    assert long_meta["epochs_read"] >= 2 and short_meta["epochs_read"] == 1
    assert (short_meta["training"]["total_steps"], long_meta["training"]["total_steps"]) == (7, 60)
    assert len(long["batch_rows"]) == 60
    np.testing.assert_array_equal(long["batch_rows"][:7], short["batch_rows"])
    np.testing.assert_array_equal(long["batch_boundaries"][:7], short["batch_boundaries"])
    np.testing.assert_array_equal(long["lengths"][:len(short["lengths"])], short["lengths"])
    np.testing.assert_array_equal(long["tokens"][:len(short["tokens"])], short["tokens"])
    # What `train --steps 7` feeds from the longer archive: the same pairs, where the longer
    # archive's padding to its larger batches may only add rows of padding.
    replayed = padded_batches(long, long_meta)[:7]
    for (inputs, labels), (long_inputs, long_labels) in zip(padded_batches(short, short_meta), replayed):
        alone, replay = dict(inputs, labels=labels), dict(long_inputs, labels=long_labels)
        for key, value in alone.items():
            rows, columns = value.shape
            np.testing.assert_array_equal(replay[key][:rows, :columns], value)
            assert not replay[key][rows:].any() and replay[key].shape[1] == columns
    # Another seed draws other batches: the equality above is not one of empty archives.
    main(["prepare", str(data), "--model-dir", str(run), "--steps", "7", "--seed", "1",
          "--output", str(tmp_path / "other.npz")])
    other = np.load(tmp_path / "other.npz")
    assert not np.array_equal(other["tokens"], short["tokens"])


def test_train_refuses_more_steps_than_the_archive_holds(tmp_path, monkeypatch):
    data, run = _screen_run(tmp_path)
    main(["prepare", str(data), "--model-dir", str(run), "--steps", "5", "--output", str(tmp_path / "a.npz")])
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    with pytest.raises(SystemExit, match="--steps 6: the archive holds 5 updates"):
        main(["train", str(tmp_path / "a.npz"), "--steps", "6"])
    assert "KERAS_BACKEND" not in os.environ  # refused before it picks a backend for the process


def test_prepare_stores_the_test_split_beside_val_and_train_scores_the_splits_asked_for(tmp_path):
    data, run = _screen_run(tmp_path)
    sentences = tiny_sentences()[10:16]
    (data / "test.en").write_text("\n".join(sentences) + "\n")
    (data / "test.de").write_text("\n".join(" ".join(row.split()[::-1]) for row in sentences) + "\n")
    config = (run / "config.toml").read_text().replace('validation_split = "val"\n',
                                                       'validation_split = "val"\ntest_split = "test"\n')
    (run / "config.toml").write_text(config)
    main(["prepare", str(data), "--model-dir", str(run), "--steps", "4", "--output", str(tmp_path / "t.npz")])
    archive = np.load(tmp_path / "t.npz")
    assert json.loads(str(archive["meta"]))["splits"] == {"val": "val", "test": "test"}
    processor = kt.SubwordTokenizer.load(str(run))
    assert json.loads(str(archive["test_reference"])) == [" ".join(row.split()[::-1]) for row in sentences]
    expected = [list(map(int, ids)) for ids in processor.tokenize(sentences).to_list()]
    assert json.loads(str(archive["test_source"])) == expected
    assert len(json.loads(str(archive["val_source"]))) == 10
    if keras.backend.backend() != "jax":
        pytest.skip("the screen's `train` stage runs with the JAX backend (its accelerator machine need not "
                    "have TensorFlow; on PyTorch its jit_compile=True builds inductor kernels, about a minute "
                    "on a 2-core CPU): it runs in the jax session")
    results = tmp_path / "results.jsonl"
    main(["train", str(tmp_path / "t.npz"), "--splits", "val", "test", "--decode", "greedy",
          "--max-sentences", "3", "--log-every", "2", "--results", str(results)])
    result = json.loads(results.read_text())
    assert result["steps"] == 4
    assert set(key for key in result if key.endswith("_greedy")) == {"val_greedy", "test_greedy"}
    assert all(0.0 <= result[key] <= 100.0 for key in ("val_greedy", "test_greedy"))


def test_train_refuses_a_split_the_archive_does_not_hold(tmp_path, monkeypatch):
    data, run = _screen_run(tmp_path)  # no test files: the archive holds val alone
    main(["prepare", str(data), "--model-dir", str(run), "--steps", "3", "--output", str(tmp_path / "a.npz")])
    assert "test_source" not in np.load(tmp_path / "a.npz").files
    monkeypatch.delenv("KERAS_BACKEND", raising=False)
    with pytest.raises(SystemExit, match="--splits val test: the archive holds val only"):
        main(["train", str(tmp_path / "a.npz"), "--splits", "val", "test"])
    assert "KERAS_BACKEND" not in os.environ


@once_on("tensorflow", "prepare is numpy, sentencepiece and the TensorFlow-side tokenizer, the same on every backend")
def test_prepare_from_a_shipped_recipe_takes_its_settings_and_trains_its_tokenizer(tmp_path):
    data, _ = _screen_run(tmp_path)  # its data only: --recipe needs no run directory
    output = tmp_path / "recipe.npz"
    main(["prepare", str(data), "--recipe", "en-de", "--steps", "3", "--output", str(output),
          "--set", f"vocab_size={VOCAB_SIZE}", "--set", "test_split=", "--set", "model.max_length=16"])
    archive = np.load(output)
    meta = json.loads(str(archive["meta"]))
    # training/configs/multi30k_en_de.toml's own values, none of them a default: the recipe
    # (and its base, multi30k.toml) were read, with the overrides on top.
    assert (meta["source_lang"], meta["target_lang"]) == ("en", "de")
    assert (meta["tokens_per_batch"], meta["beam_size"], meta["length_penalty"]) == (1024, 4, 1.4)
    assert (meta["model"]["d_model"], meta["model"]["attention_dropout"], meta["model"]["max_length"]) == (256, 0.1, 16)
    assert (meta["training"]["weight_decay"], meta["training"]["warmup_steps"]) == (0.4, 800)
    assert meta["training"]["total_steps"] == 3 and meta["splits"] == {"val": "val"}
    # The tokenizer a run of the recipe trains: BPE on both sides of the training pairs.
    english = (data / "train.en").read_text().splitlines()
    german = (data / "train.de").read_text().splitlines()
    expected = kt.train_tokenizer([s for pair in zip(english, german) for s in pair], VOCAB_SIZE, model_type="bpe")
    expected.save(str(tmp_path / "expected"))
    assert archive["tokenizer"].tobytes() == (tmp_path / "expected" / "tokenizer.model").read_bytes()
    assert json.loads(str(archive["val_source"]))[0] == list(map(int, expected.tokenize(english[:1]).to_list()[0]))
