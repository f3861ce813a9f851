"""A 0.3 run config that names an option 0.4 removed is told so, with the reason."""

import json
import re

import pytest

from keras_transformer.train.removed_keys import REMOVED_KEYS
from keras_transformer.train.run_config import RunConfig


def write_config(tmp_path, values):
    """A run config of `{"key" or "table.key": value}`, written as TOML."""
    top = [f"{key} = {json.dumps(value)}" for key, value in values.items() if "." not in key]
    training = [f"{key[9:]} = {json.dumps(value)}" for key, value in values.items() if key.startswith("training.")]
    path = tmp_path / "old.toml"
    path.write_text("\n".join(['name = "old"', *top, "", "[training]", "warmup_steps = 100", *training]) + "\n")
    return path


def refused(message):
    return pytest.raises(ValueError, match=f"^{re.escape(message)}$")


def test_a_removed_top_level_key_is_an_error_saying_it_was_removed(tmp_path):
    path = write_config(tmp_path, {"late_dropout_start": 0.5})
    with refused(
        f"{path}: `late_dropout_start` was removed in keras-transformer 0.4 (late dropout scored val "
        "35.79 against 36.27 without it); delete it from the config. Received: late_dropout_start=0.5"
    ):
        RunConfig.from_toml(path)
    with refused(
        "`late_dropout_start` was removed in keras-transformer 0.4 (late dropout scored val 35.79 "
        "against 36.27 without it); delete it from the config. Received: late_dropout_start='0.5'"
    ):
        RunConfig().with_overrides(["late_dropout_start=0.5"])


def test_the_memory_keys_are_refused_with_the_reason(tmp_path):
    path = write_config(tmp_path, {"eval_memory_weight": 0.7, "eval_memory_neighbors": 32})
    with refused(
        f"{path}: `eval_memory_weight` was removed in keras-transformer 0.4 (the kNN translation memory "
        "did not beat the run-to-run spread); delete it from the config. Received: eval_memory_weight=0.7"
    ):
        RunConfig.from_toml(path)


def test_a_removed_training_key_is_an_error_saying_it_was_removed(tmp_path):
    path = write_config(tmp_path, {"training.rdrop_alpha": 5.0})
    with refused(
        f"{path}: `training.rdrop_alpha` was removed in keras-transformer 0.4 (R-Drop lost 5.1 BLEU "
        "at twice the step time); delete it from the config. Received: training.rdrop_alpha=5.0"
    ):
        RunConfig.from_toml(path)
    with refused(
        "`training.rdrop_alpha` was removed in keras-transformer 0.4 (R-Drop lost 5.1 BLEU at twice "
        "the step time); delete it from the config. Received: training.rdrop_alpha='5'"
    ):
        RunConfig().with_overrides(["training.rdrop_alpha=5"])


def test_removed_keys_at_their_0_3_defaults_are_dropped_with_a_warning(tmp_path):
    # Every 0.3 model directory's config.toml lists every key, the removed ones at their defaults.
    path = write_config(tmp_path, {key: default for key, (default, _) in REMOVED_KEYS.items()})
    with pytest.warns(UserWarning) as caught:
        config = RunConfig.from_toml(path)
    assert config == RunConfig(name="old", training={"warmup_steps": 100})
    named = [re.match(r"`(\S+)` was removed in keras-transformer 0.4; its 0.3 default", str(w.message)) for w in caught]
    assert sorted(match.group(1) for match in named) == sorted(REMOVED_KEYS)


def test_packing_is_refused_with_the_reason_and_a_packed_batch_by_the_model(tmp_path):
    import keras

    import keras_transformer as kt
    from conftest import tiny_config

    path = write_config(tmp_path, {"packing": True})
    with refused(
        f"{path}: `packing` was removed in keras-transformer 0.4 (sequence packing trained 0.96x the real "
        "target tokens/s of length buckets on Multi30k); delete it from the config. Received: packing=True"
    ):
        RunConfig.from_toml(path)
    # A batch of 0.3's packed rows would be read as unpacked pairs attending to each other: refused.
    model = kt.build_transformer(tiny_config())
    ids = keras.ops.ones((1, 4), "int32")
    packed = {"encoder_inputs": ids, "decoder_inputs": ids, "encoder_segment_ids": ids, "decoder_positions": ids}
    with pytest.raises(ValueError, match=re.escape(
        "The Transformer's inputs are ['encoder_inputs', 'decoder_inputs']. Received other keys too: "
        "['decoder_positions', 'encoder_segment_ids']; sequence packing (segment ids, restarting positions) "
        "was removed in keras-transformer 0.4")):
        model(packed)
