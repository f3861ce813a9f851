"""Sampling: the filters on hand-computed distributions, the draws, and the tiny model.

The filter tests write each expected distribution out by hand. The draw tests check
that a seed repeats exactly and that draws follow the filtered distribution. The
model tests check that `top_k=1` and a tiny temperature are greedy search, and that
the compiled decoder takes the seed as an input (one trace, repeatable per seed).
"""

import math

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy

import keras_transformer as kt
from keras_transformer.inference import decoding, sampling
from keras_transformer.inference.compiled import CompiledDecoder

PROBS = np.array([[0.5, 0.3, 0.15, 0.05]])
EXTRA = 2
SOURCES = np.array([[5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 12, 13]], "int32")


def probs(log_probs):
    return np.exp(to_numpy(log_probs).astype("float64"))


# ------------------------------------------------------------------ filters, by hand
def test_temperature_raises_each_probability_to_one_over_t():
    # T = 0.5: p^2 / sum p^2 = [0.36, 0.09, 0.01] / 0.46.
    got = probs(sampling.apply_temperature(np.log([[0.6, 0.3, 0.1]]), 0.5))
    np.testing.assert_allclose(got, [[0.36 / 0.46, 0.09 / 0.46, 0.01 / 0.46]], atol=1e-6)
    # T = 2: sqrt(p) / sum sqrt(p).
    root = np.sqrt([0.6, 0.3, 0.1])
    np.testing.assert_allclose(probs(sampling.apply_temperature(np.log([[0.6, 0.3, 0.1]]), 2.0)), [root / root.sum()], atol=1e-6)
    # T -> 0: all the mass on the most probable token, no NaN; -inf stays out.
    np.testing.assert_allclose(probs(sampling.apply_temperature(np.log([[0.3, 0.6, 0.1]]), 1e-6)), [[0, 1, 0]], atol=1e-6)
    np.testing.assert_allclose(
        probs(sampling.apply_temperature([[-math.inf, math.log(0.25), math.log(0.75)]], 1.0)), [[0, 0.25, 0.75]], atol=1e-6
    )


def test_top_k_keeps_the_k_most_probable_tokens_renormalised():
    expected = {
        1: [1.0, 0, 0, 0],
        2: [0.5 / 0.8, 0.3 / 0.8, 0, 0],
        3: [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0],
        4: [0.5, 0.3, 0.15, 0.05],
        10: [0.5, 0.3, 0.15, 0.05],  # more than the vocabulary: everything
    }
    for k, distribution in expected.items():
        np.testing.assert_allclose(probs(sampling.top_k_filter(np.log(PROBS), k)), [distribution], atol=1e-6)
    # Tokens tied with the k-th are kept (as Hugging Face's filter does).
    tied = probs(sampling.top_k_filter(np.log([[0.4, 0.2, 0.2, 0.2]]), 2))
    np.testing.assert_allclose(tied, [[0.4, 0.2, 0.2, 0.2]], atol=1e-6)


def test_top_p_keeps_the_smallest_set_that_reaches_p():
    expected = {
        0.4: [1.0, 0, 0, 0],  # 0.5 >= 0.4 already
        0.75: [0.5 / 0.8, 0.3 / 0.8, 0, 0],  # 0.5 < 0.75 <= 0.8
        0.85: [0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0],
        0.97: [0.5, 0.3, 0.15, 0.05],
        1.0: [0.5, 0.3, 0.15, 0.05],
    }
    for p, distribution in expected.items():
        np.testing.assert_allclose(probs(sampling.top_p_filter(np.log(PROBS), p)), [distribution], atol=1e-6)
    # Rows are independent, and their order does not matter: the nucleus is by probability.
    rows = np.log([[0.05, 0.15, 0.3, 0.5], [0.8, 0.1, 0.05, 0.05]])
    np.testing.assert_allclose(
        probs(sampling.top_p_filter(rows, 0.75)), [[0, 0, 0.3 / 0.8, 0.5 / 0.8], [1.0, 0, 0, 0]], atol=1e-6
    )


def test_filters_apply_in_order_temperature_then_top_k_then_top_p():
    # T = 0.5: [0.25, 0.09, 0.0225, 0.0025] / 0.365; top 3: / 0.3625 -> [0.690, 0.248, 0.062];
    # top_p 0.9: 0.690 + 0.248 = 0.938 >= 0.9, so two tokens: [0.25, 0.09] / 0.34.
    got = probs(sampling.sampling_log_probs(np.log(PROBS), temperature=0.5, top_k=3, top_p=0.9))
    np.testing.assert_allclose(got, [[0.25 / 0.34, 0.09 / 0.34, 0, 0]], atol=1e-6)
    # Neutral settings leave the distribution as it is.
    np.testing.assert_allclose(probs(sampling.sampling_log_probs(np.log(PROBS))), PROBS, atol=1e-6)


# ------------------------------------------------------------------------- draws
def test_draws_follow_the_filtered_distribution_and_repeat_per_seed():
    rows = np.repeat(np.log(PROBS), 20000, axis=0).astype("float32")
    seed = sampling.seed_tensor(5)
    tokens = to_numpy(sampling.sample_tokens(rows, seed))
    np.testing.assert_allclose(np.bincount(tokens, minlength=4) / len(tokens), PROBS[0], atol=0.015)
    np.testing.assert_array_equal(to_numpy(sampling.sample_tokens(rows, seed)), tokens)
    assert not np.array_equal(to_numpy(sampling.sample_tokens(rows, sampling.seed_tensor(6))), tokens)
    filtered = to_numpy(sampling.sample_tokens(rows, seed, top_k=2))
    np.testing.assert_allclose(np.bincount(filtered, minlength=4) / len(filtered), [0.625, 0.375, 0, 0], atol=0.015)
    # A row with one finite entry (a forced token) always draws it.
    forced = np.full((1000, 4), -np.inf, "float32")
    forced[:, 2] = math.log(1e-6)
    assert set(to_numpy(sampling.sample_tokens(forced, seed, temperature=3.0)).tolist()) == {2}


# ----------------------------------------------------------------------- the model
@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(7)
    return kt.build_transformer(tiny_config())


def test_top_k_1_and_a_tiny_temperature_are_greedy_search(model):
    tokens, scores = (to_numpy(x) for x in decoding.greedy_decode(model, SOURCES, max_extra=EXTRA))
    for settings in (dict(top_k=1), dict(temperature=1e-6), dict(top_k=1, top_p=0.3, temperature=2.0)):
        sampled, sampled_scores = sampling.sample_decode(model, SOURCES, 3, max_extra=EXTRA, **settings)
        np.testing.assert_array_equal(to_numpy(sampled), tokens)
        np.testing.assert_allclose(to_numpy(sampled_scores), scores, atol=1e-5)  # the model's log-probs


def test_compiled_sampling_takes_the_seed_as_an_input_and_repeats_per_seed(model):
    decoder = CompiledDecoder(model, "sample", jit_compile=False, max_extra=EXTRA)
    first, first_scores = (to_numpy(x) for x in decoder(SOURCES, seed=[1, 0]))
    again, again_scores = (to_numpy(x) for x in decoder(SOURCES, seed=[1, 0]))
    others = [to_numpy(decoder(SOURCES, seed=[seed, 0])[0]) for seed in (2, 3)]
    np.testing.assert_array_equal(again, first)
    np.testing.assert_array_equal(again_scores, first_scores)
    assert any(not np.array_equal(other, first) for other in others)
    # The compiled program draws what the eager search draws (XLA on TensorFlow would not).
    eager, _ = sampling.sample_decode(model, SOURCES, [1, 0], max_extra=EXTRA)
    np.testing.assert_array_equal(to_numpy(eager), first)
    # Prefixes pass through sampling as through the searches.
    prefixed = to_numpy(decoder(SOURCES, seed=[1, 0], prefix_ids=np.array([[20, 21], [22, 0]]))[0])
    assert prefixed[0, :2].tolist() == [20, 21] and prefixed[1, 0] == 22
    if keras.backend.backend() != "torch":  # PyTorch runs eagerly: nothing is traced
        assert decoder.trace_count == 2  # one per input structure: the seed values are inputs
    with pytest.raises(ValueError, match=r"`seed` is required by the \"sample\" method"):
        decoder(SOURCES)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(temperature=0.0), r"`temperature` must be a finite number > 0. Received: temperature=0.0"),
        (dict(temperature=-1.0), r"`temperature` must be a finite number > 0. Received: temperature=-1.0"),
        (dict(temperature=float("nan")), r"Received: temperature=nan"),
        (dict(top_p=0.0), r"`top_p` must be a number in \(0, 1\]. Received: top_p=0.0"),
        (dict(top_p=1.5), r"`top_p` must be a number in \(0, 1\]. Received: top_p=1.5"),
        (dict(top_k=0), r"`top_k` must be a positive integer. Received: top_k=0"),
        (dict(top_k=2.5), r"`top_k` must be a positive integer. Received: top_k=2.5"),
        (dict(seed="1"), r"`seed` must be an integer or None. Received: seed='1'"),
        (dict(seed=1.5), r"`seed` must be an integer or None. Received: seed=1.5"),
    ],
    ids=["temperature_zero", "temperature_negative", "temperature_nan", "top_p_zero", "top_p_above_1",
         "top_k_zero", "top_k_float", "seed_str", "seed_float"],
)
def test_bad_sampling_arguments_are_refused_naming_them(settings, message):
    with pytest.raises(ValueError, match=message):
        sampling.check_sampling_arguments(**settings)
