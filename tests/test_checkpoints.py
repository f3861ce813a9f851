"""Tests of checkpoint averaging (paper, section 6.1) and checkpoint file lists."""

import os

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy

import keras_transformer as kt
from keras_transformer.train.checkpoints import (
    average_checkpoints,
    average_model_directory,
    latest_checkpoints,
    prune_checkpoints,
)


def touch(directory, *names):
    os.makedirs(directory, exist_ok=True)
    for name in names:
        open(os.path.join(directory, name), "wb").close()


def saved_weights(tmp_path, seed, name):
    """A tiny Transformer initialized from `seed`, its weights saved to `name`."""
    keras.utils.set_random_seed(seed)
    model = kt.build_transformer(tiny_config())
    path = str(tmp_path / name)
    model.save_weights(path)
    return model, path


def write_tokenizer(model_dir):
    """A real tokenizer of the tiny model's vocabulary size (32), saved into `model_dir`."""
    from tiny_translation import tiny_sentences

    tokenizer = kt.train_tokenizer(tiny_sentences(), vocab_size=32)
    tokenizer.save(str(model_dir))
    return tokenizer


def test_average_of_two_weight_files_is_their_element_wise_mean(tmp_path):
    first, first_path = saved_weights(tmp_path, 1, "epoch_001.weights.h5")
    second, second_path = saved_weights(tmp_path, 2, "epoch_002.weights.h5")
    keras.utils.set_random_seed(3)
    averaged = average_checkpoints(kt.build_transformer(tiny_config()), [first_path, second_path])
    assert len(averaged.weights) == len(first.weights) > 10
    differ = 0
    for a, b, mean in zip(first.weights, second.weights, averaged.weights):
        a, b = to_numpy(a).astype("float64"), to_numpy(b).astype("float64")
        expected = ((a + b) / 2).astype("float32")
        np.testing.assert_array_equal(to_numpy(mean), expected, err_msg=mean.path)
        differ += not np.array_equal(a, b)
    assert differ > 5  # the two files really hold different weights


def test_averaging_one_file_loads_it(tmp_path):
    first, path = saved_weights(tmp_path, 1, "epoch_001.weights.h5")
    keras.utils.set_random_seed(7)
    loaded = average_checkpoints(kt.build_transformer(tiny_config()), [path])
    for a, b in zip(first.weights, loaded.weights):
        np.testing.assert_array_equal(to_numpy(a), to_numpy(b))


def test_average_checkpoints_refuses_bad_paths(tmp_path):
    model = kt.build_transformer(tiny_config())
    with pytest.raises(ValueError, match=r"at least one \.weights\.h5 file. Received: \[\]"):
        average_checkpoints(model, [])
    with pytest.raises(FileNotFoundError, match="No checkpoint file at .*missing.weights.h5"):
        average_checkpoints(model, [str(tmp_path / "missing.weights.h5")])


def test_latest_checkpoints_orders_by_epoch_number_not_name(tmp_path):
    touch(tmp_path, "epoch_2.weights.h5", "epoch_10.weights.h5", "epoch_9.weights.h5", "notes.txt",
          "model.keras")
    names = [os.path.basename(p) for p in latest_checkpoints(tmp_path, 2)]
    assert names == ["epoch_9.weights.h5", "epoch_10.weights.h5"]
    assert len(latest_checkpoints(tmp_path, 5)) == 3
    with pytest.raises(ValueError, match="`k` must be a positive integer. Received: k=0"):
        latest_checkpoints(tmp_path, 0)
    with pytest.raises(FileNotFoundError, match="No checkpoint directory at"):
        latest_checkpoints(tmp_path / "nope", 1)


def test_prune_keeps_the_newest(tmp_path):
    touch(tmp_path, *[f"epoch_{i:03d}.weights.h5" for i in range(1, 8)], "other.txt")
    deleted = prune_checkpoints(tmp_path, 3)
    assert [os.path.basename(p) for p in deleted] == [f"epoch_{i:03d}.weights.h5" for i in range(1, 5)]
    assert sorted(os.listdir(tmp_path)) == [
        "epoch_005.weights.h5", "epoch_006.weights.h5", "epoch_007.weights.h5", "other.txt",
    ]


def test_averaging_writes_a_model_directory_beside_the_run(tmp_path, capsys):
    from keras_transformer.cli.average_checkpoints import main

    model_dir = tmp_path / "run"
    checkpoints = model_dir / "checkpoints"
    os.makedirs(checkpoints)
    models = [saved_weights(checkpoints, seed, f"epoch_{seed:03d}.weights.h5")[0] for seed in (1, 2, 3)]
    models[0].save(str(model_dir / "model.keras"))
    tokenizer = write_tokenizer(model_dir)
    (model_dir / "config.toml").write_text('name = "run"\n')
    assert main(["--model-dir", str(model_dir), "--last", "2"]) == 0
    output = capsys.readouterr().out
    assert "Averaged 2 checkpoints" in output and "epoch_003.weights.h5" in output

    output_dir = tmp_path / "run_averaged"  # the default: a sibling, not inside the run
    assert sorted(os.listdir(tmp_path)) == ["run", "run_averaged"]  # no temporary left
    assert sorted(os.listdir(output_dir)) == ["config.toml", "manifest.json", "model.keras", "tokenizer.model"]
    for name in ("config.toml", "tokenizer.model"):
        assert (output_dir / name).read_bytes() == (model_dir / name).read_bytes()
    # The averaged directory records its tokenizer, so it refuses any other one.
    from keras_transformer.model.directory import read_manifest

    assert read_manifest(str(output_dir))["tokenizer_sha256"] == tokenizer.fingerprint
    averaged = keras.saving.load_model(str(output_dir / "model.keras"), safe_mode=True)
    for a, b, mean in zip(models[1].weights, models[2].weights, averaged.weights):
        expected = ((to_numpy(a).astype("float64") + to_numpy(b)) / 2).astype("float32")
        np.testing.assert_array_equal(to_numpy(mean), expected)


def test_averaging_refuses_to_replace_a_directory_unless_told(tmp_path):
    model_dir = tmp_path / "run"
    os.makedirs(model_dir / "checkpoints")
    model, _ = saved_weights(model_dir / "checkpoints", 1, "epoch_001.weights.h5")
    model.save(str(model_dir / "model.keras"))
    write_tokenizer(model_dir)
    output_dir = tmp_path / "chosen"
    os.makedirs(output_dir)  # an empty directory may be written into
    written, paths = average_model_directory(model_dir, output_dir=output_dir)
    assert written == str(output_dir) and len(paths) == 1
    assert sorted(os.listdir(output_dir)) == ["manifest.json", "model.keras", "tokenizer.model"]  # no config.toml
    with pytest.raises(FileExistsError, match="chosen already exists and is not empty; pass overwrite=True"):
        average_model_directory(model_dir, output_dir=output_dir)
    assert average_model_directory(model_dir, output_dir=output_dir, overwrite=True)[0] == str(output_dir)
    with pytest.raises(ValueError, match="`output_dir` must differ from `model_dir`"):
        average_model_directory(model_dir, output_dir=model_dir)
    os.remove(model_dir / "tokenizer.model")
    with pytest.raises(FileNotFoundError, match="No tokenizer model file at .*run.tokenizer.model"):
        average_model_directory(model_dir, output_dir=tmp_path / "other")
    assert sorted(os.listdir(tmp_path)) == ["chosen", "run"]