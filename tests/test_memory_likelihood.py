"""bench/memory_likelihood.py: the teacher-forced likelihood of references under a memory.

Checked exactly: with weight 0 it is the model's own mean token NLL, computed pair by pair
from `model.decode`'s logits; with a memory of the very pairs it scores, one neighbour and
weight 0.5, each token's nearest key is its own state, so its probability is
0.5 + 0.5 p_model; pairs too long for the model are skipped and counted.
"""

import pathlib
import sys

import keras
import numpy as np
import pytest
from conftest import SpaceTokenizer, tiny_config, to_numpy

import keras_transformer as kt
from keras_transformer.special_tokens import BOS_ID, EOS_ID

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))
from bench.memory_likelihood import main, reference_nll  # noqa: E402

SOURCES = ["5 6 7 8", "9 10 11", "12 13 14 15 16", "17 18"]
TARGETS = ["20 21 22 23 24", "25 26 27", "29 30 31 28", "19 24 26"]


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(7)
    return kt.build_transformer(tiny_config(d_model=32, num_heads=4, d_ff=64))


def model_gold_probs(model, source, target):
    """p_model of each reference token (EOS included), one pair at a time: float64 [T + 1]."""
    source_ids = [int(token) for token in source.split()] + [EOS_ID]
    target_ids = [int(token) for token in target.split()]
    encoder_outputs, mask = model.encode(np.array([source_ids], "int32"))
    logits = to_numpy(model.decode(np.array([[BOS_ID] + target_ids], "int32"), encoder_outputs, mask))[0]
    logits = logits.astype("float64")
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    return probs[np.arange(len(target_ids) + 1), target_ids + [EOS_ID]]


@pytest.mark.parametrize("batch_size", [1, 3])
def test_weight_zero_is_the_models_own_token_nll(model, batch_size):
    memory = kt.build_translation_memory(model, SpaceTokenizer(), SOURCES, TARGETS)
    alone = kt.MemoryModel(model, memory, weight=0.0)
    nll, tokens, skipped = reference_nll(alone, SpaceTokenizer(), SOURCES, TARGETS, batch_size=batch_size)
    gold = np.concatenate([model_gold_probs(model, s, t) for s, t in zip(SOURCES, TARGETS)])
    assert (tokens, skipped) == (len(gold), 0) == (19, 0)
    np.testing.assert_allclose(nll, -np.log(gold).mean(), rtol=1e-5)


def test_a_memory_of_the_references_adds_half_of_each_tokens_missing_probability(model):
    memory = kt.build_translation_memory(model, SpaceTokenizer(), SOURCES, TARGETS)
    mixed = kt.MemoryModel(model, memory, neighbors=1, temperature=1.0, weight=0.5)
    nll, _, _ = reference_nll(mixed, SpaceTokenizer(), SOURCES, TARGETS, batch_size=2)
    gold = np.concatenate([model_gold_probs(model, s, t) for s, t in zip(SOURCES, TARGETS)])
    np.testing.assert_allclose(nll, -np.log(0.5 + 0.5 * gold).mean(), rtol=1e-5)
    assert nll < -np.log(gold).mean()


def test_pairs_too_long_for_the_model_are_skipped_and_counted(model):
    memory = kt.build_translation_memory(model, SpaceTokenizer(), SOURCES, TARGETS)
    long_target = " ".join(["20"] * model.config.max_length)
    _, tokens, skipped = reference_nll(kt.MemoryModel(model, memory, weight=0.0), SpaceTokenizer(),
                                       SOURCES[:2] + ["5"], TARGETS[:2] + [long_target])
    assert (tokens, skipped) == (6 + 4, 1)


def test_decoding_settings_are_refused_with_the_setting_named(tmp_path):
    with pytest.raises(SystemExit, match="pairs= and alpha= are decoding settings.*'pairs': 32"):
        main([str(tmp_path), "--model-dir", str(tmp_path), "--direction", "en-de",
              "--settings", "16,30,0.5,pairs=32"])
