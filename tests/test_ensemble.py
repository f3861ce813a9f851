"""Ensemble decoding: members' distributions combined per step, searched as one model.

The combination rules are checked on hand-computed numbers; the cached ensemble
search against a reference that reruns every member's full teacher-forced decoder at
each step and combines in NumPy; the beam scores against that combination rescoring
the hypotheses returned. Two members differ in weights and in shape (width, depth,
heads), so a cache or an encoder output handed to the wrong member shows. Decoding is
eager here, except through `Translator` (a plain tf.function on TensorFlow).
"""

import math
import os
import re

import keras
import numpy as np
import pytest
from conftest import once_on, tiny_config, to_numpy
from tiny_translation import BATCH_SIZE, MAX_EXTRA, make_tiny_model_dir, pick_sentences

import keras_transformer as kt
from keras_transformer.inference import decoding, sampling
from keras_transformer.inference.compiled import CompiledDecoder
from keras_transformer.inference.ensemble import Ensemble, load_ensemble
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID

EXTRA = 2  # max_extra: short decodes
SOURCES = np.array([[5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 12, 13]], "int32")
LIMITS = [3 + EXTRA, 6 + EXTRA]


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def member_log_probs(model, sources, decoder_inputs):
    """One member's teacher-forced log-probabilities `[B, T, V]`, float64."""
    inputs = {"encoder_inputs": sources, "decoder_inputs": decoder_inputs.astype("int32")}
    if keras.backend.backend() == "jax":  # one jitted program, not one per op and shape
        logits = model.predict_on_batch(inputs)
    else:
        logits = model(inputs)
    return log_softmax(np.asarray(to_numpy(logits), "float64"))


def combined(models, weights, rule, sources, decoder_inputs):
    """The ensemble's log-probabilities `[B, T, V]` in NumPy, normalised either way."""
    members = [member_log_probs(model, sources, decoder_inputs) for model in models]
    if rule == "probs":
        return np.log(sum(w * np.exp(lp) for w, lp in zip(weights, members)))
    return log_softmax(sum(w * lp for w, lp in zip(weights, members)))


def reference_greedy(models, weights, rule, sources, limits, width):
    """Greedy search over the combination, every member's full decoder rerun each step."""
    prefix = np.zeros((len(sources), width), "int32")
    prefix[:, 0] = BOS_ID
    tokens = np.zeros_like(prefix)
    scores = np.zeros(len(sources))
    finished = np.zeros(len(sources), bool)
    for i in range(width):
        log_probs = combined(models, weights, rule, sources, prefix)[:, i]
        log_probs[:, [PAD_ID, BOS_ID]] = -np.inf
        for row, limit in enumerate(limits):
            if finished[row]:
                continue
            token = EOS_ID if i == limit - 1 else int(np.argmax(log_probs[row]))
            tokens[row, i] = token
            scores[row] += log_probs[row, token]
            finished[row] = token == EOS_ID
            if i + 1 < width:
                prefix[row, i + 1] = token
    return tokens, scores


@pytest.fixture(scope="module")
def members():
    """Two tiny models of one vocabulary, different in weights and in shape."""
    keras.utils.set_random_seed(11)
    first = kt.build_transformer(tiny_config())
    keras.utils.set_random_seed(12)
    second = kt.build_transformer(tiny_config(d_model=24, d_ff=40, num_heads=3, num_decoder_layers=2))
    return first, second


# ------------------------------------------------------------------- combination
def test_the_two_rules_combine_as_computed_by_hand():
    log = np.log
    first = keras.ops.convert_to_tensor(log([[0.5, 0.3, 0.2]]), "float32")
    second = keras.ops.convert_to_tensor(log([[0.1, 0.1, 0.8]]), "float32")
    ensemble = Ensemble.__new__(Ensemble)
    ensemble.weights, ensemble.combine = (0.25, 0.75), "probs"
    # 0.25 * p1 + 0.75 * p2, token by token.
    expected = log([[0.25 * 0.5 + 0.75 * 0.1, 0.25 * 0.3 + 0.75 * 0.1, 0.25 * 0.2 + 0.75 * 0.8]])
    np.testing.assert_allclose(to_numpy(ensemble.combine_log_probs([first, second])), expected, atol=1e-6)
    ensemble.combine = "log_probs"
    # 0.25 * log p1 + 0.75 * log p2, left unnormalised for the search's log-softmax.
    expected = 0.25 * log([[0.5, 0.3, 0.2]]) + 0.75 * log([[0.1, 0.1, 0.8]])
    np.testing.assert_allclose(to_numpy(ensemble.combine_log_probs([first, second])), expected, atol=1e-6)


def test_weights_are_normalised_and_the_config_is_the_shortest_members(members):
    first, second = members
    longer = kt.build_transformer(tiny_config(max_length=48))
    ensemble = Ensemble([longer, first, second], weights=[1, 2, 1])
    assert ensemble.weights == (0.25, 0.5, 0.25) and len(ensemble) == 3
    assert ensemble.config.max_length == 32 and ensemble.config.vocab_size == 32
    assert ensemble.variables == [*longer.variables, *first.variables, *second.variables]
    assert repr(ensemble) == "Ensemble(3 models, weights=(0.25, 0.5, 0.25), combine='probs')"


# ------------------------------------------------------------------- the searches
@pytest.mark.parametrize("rule", ["probs", "log_probs"])
def test_cached_ensemble_greedy_equals_full_recomputation(members, rule):
    weights = (0.3, 0.7)
    ensemble = Ensemble(members, weights=weights, combine=rule)
    tokens, scores = decoding.greedy_decode(ensemble, SOURCES, max_extra=EXTRA)
    expected_tokens, expected_scores = reference_greedy(members, weights, rule, SOURCES, LIMITS, max(LIMITS))
    np.testing.assert_array_equal(to_numpy(tokens), expected_tokens)
    np.testing.assert_allclose(to_numpy(scores), expected_scores, atol=1e-4)
    if rule == "log_probs":
        return
    # The uncached reference of the package (`Ensemble.decode`) agrees too.
    uncached_tokens, uncached_scores = decoding.greedy_decode_uncached(ensemble, SOURCES, max_extra=EXTRA)
    np.testing.assert_array_equal(to_numpy(uncached_tokens), expected_tokens)
    np.testing.assert_allclose(to_numpy(uncached_scores), expected_scores, atol=1e-4)


def test_ensemble_beam_hypotheses_are_scored_as_the_combination_scores_them(members):
    ensemble = Ensemble(members)
    tokens, scores = decoding.beam_decode(
        ensemble, SOURCES, beam_size=3, alpha=0.6, max_extra=EXTRA, return_all_beams=True
    )
    tokens, scores = to_numpy(tokens).reshape(6, -1), to_numpy(scores).reshape(6)
    assert np.all(np.isfinite(scores))
    sources = np.repeat(SOURCES, 3, axis=0)
    decoder_inputs = np.concatenate([np.full((6, 1), BOS_ID), tokens[:, :-1]], 1)
    log_probs = combined(members, (0.5, 0.5), "probs", sources, decoder_inputs)
    picked = np.take_along_axis(log_probs, tokens[:, :, None].astype("int64"), -1)[:, :, 0]
    lengths = np.argmax(tokens == EOS_ID, axis=1) + 1
    real = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    # A member's cache gathered from the wrong beam would score another prefix than returned.
    np.testing.assert_allclose(scores, np.where(real, picked, 0).sum(1) / ((5 + lengths) / 6) ** 0.6, atol=1e-4)


def test_an_ensemble_of_one_model_or_of_copies_decodes_as_the_model(members):
    model = members[1]
    greedy = [to_numpy(x) for x in decoding.greedy_decode(model, SOURCES, max_extra=EXTRA)]
    beam = [to_numpy(x) for x in decoding.beam_decode(model, SOURCES, beam_size=3, max_extra=EXTRA)]
    # Identical members: the mean of equal probabilities, or of equal log-probabilities, is theirs.
    for ensemble in (Ensemble([model]), Ensemble([model, model], combine="log_probs")):
        tokens, scores = decoding.greedy_decode(ensemble, SOURCES, max_extra=EXTRA)
        np.testing.assert_array_equal(to_numpy(tokens), greedy[0])
        np.testing.assert_allclose(to_numpy(scores), greedy[1], atol=1e-5)
    tokens, scores = decoding.beam_decode(Ensemble([model, model]), SOURCES, beam_size=3, max_extra=EXTRA)
    np.testing.assert_array_equal(to_numpy(tokens), beam[0])
    np.testing.assert_allclose(to_numpy(scores), beam[1], atol=1e-5)


def test_sampling_and_prefixes_run_over_the_ensemble(members):
    ensemble = Ensemble(members)
    prefix = np.array([[9], [0]], "int32")  # sentence 0 starts with 9, sentence 1 is free
    tokens, _ = decoding.greedy_decode(ensemble, SOURCES, max_extra=EXTRA, prefix_ids=prefix)
    tokens = to_numpy(tokens)
    free, _ = decoding.greedy_decode(ensemble, SOURCES, max_extra=EXTRA)
    assert tokens[0, 0] == 9 and tokens[1].tolist() == to_numpy(free)[1].tolist()
    # Drawing among the top 1 is greedy search over the same combination.
    sampled, _ = sampling.sample_decode(ensemble, SOURCES, seed=3, top_k=1, max_extra=EXTRA)
    np.testing.assert_array_equal(to_numpy(sampled), to_numpy(free))


def test_a_compiled_ensemble_decodes_as_the_eager_one_and_sees_new_weights(members):
    ensemble = Ensemble(members)
    decoder = CompiledDecoder(ensemble, "beam", jit_compile=False, beam_size=2, max_extra=EXTRA)
    eager = decoding.beam_decode(ensemble, SOURCES, beam_size=2, max_extra=EXTRA)
    tokens, scores = decoder(SOURCES)
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(eager[0]))
    np.testing.assert_allclose(to_numpy(scores), to_numpy(eager[1]), atol=1e-5)
    # The second member's weights are read by the compiled program, not baked into it.
    kernel = members[1].decoder_layers[0].weights[0]
    saved = to_numpy(kernel)
    try:
        kernel.assign(saved * 0)
        changed = decoding.beam_decode(ensemble, SOURCES, beam_size=2, max_extra=EXTRA)
        np.testing.assert_allclose(to_numpy(decoder(SOURCES)[1]), to_numpy(changed[1]), atol=1e-5)
    finally:
        kernel.assign(saved)
    assert decoder.trace_count <= 1


# ------------------------------------------------------------------- bad input
def test_members_and_weights_are_checked_with_clear_messages(members):
    first, _ = members
    with pytest.raises(ValueError, match=r"share one vocabulary.*vocab_size \[32, 40\]"):
        Ensemble([first, kt.build_transformer(tiny_config(vocab_size=40))])
    with pytest.raises(ValueError, match=r"at least one Transformer. Received: \[\]"):
        Ensemble([])
    with pytest.raises(TypeError, match=r"models\[1\] of type str"):
        Ensemble([first, "saved_models/demo"])
    with pytest.raises(TypeError, match="load_ensemble loads model directories"):
        Ensemble("saved_models/demo")
    with pytest.raises(ValueError, match=r"one positive number per model \(2\)"):
        Ensemble([first, first], weights=[1.0])
    with pytest.raises(ValueError, match=r"weights\[1\]=0"):
        Ensemble([first, first], weights=[1.0, 0])
    with pytest.raises(ValueError, match=r"weights\[0\]=nan"):
        Ensemble([first, first], weights=[math.nan, 1.0])
    with pytest.raises(ValueError, match="combine"):
        Ensemble([first], combine="max")


# ------------------------------------------------------------------- directories
@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two model directories of one tokenizer."""
    root = tmp_path_factory.mktemp("ensemble_runs")
    (root / "a").mkdir()
    (root / "b").mkdir()
    first_model, tokenizer = make_tiny_model_dir(root / "a")
    keras.utils.set_random_seed(21)
    second_model = kt.Transformer(first_model.config)
    second_model.save(str(root / "b" / "model.keras"))
    tokenizer.save(str(root / "b"))
    return root, first_model, second_model, tokenizer


def _translate(source, tokenizer, sentences, **kwargs):
    # Greedy: the cheapest search to compile; the beam's per-member caches are checked above.
    settings = dict(decoding="greedy", max_extra=MAX_EXTRA, batch_size=BATCH_SIZE, jit_compile=False)
    return kt.Translator(source, tokenizer, **settings, **kwargs).translate(sentences, return_scores=True)


def test_directories_translate_as_the_ensemble_of_their_models(runs):
    root, first, second, tokenizer = runs
    sentences = pick_sentences(tokenizer, count=4)
    expected = _translate(Ensemble([first, second]), tokenizer, sentences)
    alone = _translate(first, tokenizer, sentences)
    assert not np.allclose(expected[1], alone[1], atol=1e-3)  # the second member counts
    from_dirs = _translate([root / "a", root / "b"], None, sentences)
    assert from_dirs[0] == expected[0]
    np.testing.assert_allclose(from_dirs[1], expected[1], atol=1e-5)


def test_directories_are_refused_when_they_cannot_be_ensembled(runs, tmp_path):
    root, first, _, tokenizer = runs
    # Another tokenizer (of the same size, trained on other text) gives ids other meanings.
    other = tmp_path / "other"
    other_tokenizer = kt.train_tokenizer(
        [f"{w} and {v}" for w in ("red", "green", "blue", "pale", "dark") for v in ("sky", "sea", "moss", "sand")] * 3,
        vocab_size=tokenizer.vocab_size,
        model_type="bpe",
    )
    assert other_tokenizer.vocab_size == tokenizer.vocab_size
    other.mkdir()
    first.save(str(other / "model.keras"))
    other_tokenizer.save(str(other))
    from keras_transformer.model.directory import write_manifest

    write_manifest(other, other_tokenizer)
    message = f"{re.escape(os.fspath(other))} and {re.escape(os.fspath(root / 'a'))} were trained with different"
    with pytest.raises(ValueError, match=message):
        load_ensemble([root / "a", other])
    with pytest.raises(ValueError, match="An Ensemble needs its tokenizer"):
        kt.Translator(Ensemble([first]))
    with pytest.raises(TypeError, match="an Ensemble decodes with a Translator"):
        from keras_transformer.model.directory import load_model_and_tokenizer

        load_model_and_tokenizer(Ensemble([first]), tokenizer)


@once_on("torch", "the commands' arguments and loading are Python, the same on every backend (the ensemble "
         "decodes on every backend above)")
def test_the_commands_take_several_model_directories(runs, tmp_path, capsys):
    from keras_transformer.cli import evaluate, translate

    root, first, second, tokenizer = runs
    sentences = pick_sentences(tokenizer, count=4)
    expected = _translate(Ensemble([first, second]), tokenizer, sentences)[0]
    argv = ["--greedy", "--max-extra", str(MAX_EXTRA), "--batch-size", str(BATCH_SIZE)]
    assert translate.main(["--model-dir", str(root / "a"), "--model-dir", str(root / "b"), *argv, *sentences]) == 0
    assert capsys.readouterr().out.splitlines() == expected
    (tmp_path / "source.txt").write_text("cats see cars\n")
    with pytest.raises(SystemExit) as exit_info:
        evaluate.main(
            ["--model-dir", str(root / "a"), "--model-dir", str(root / "b"), "--write-metrics",
             "--source", str(tmp_path / "source.txt"), "--reference", str(tmp_path / "source.txt")]
        )
    assert exit_info.value.code == 2 and "--write-metrics records one model's scores" in capsys.readouterr().err
    assert not (root / "a" / "metrics.json").exists()
