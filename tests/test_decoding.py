"""Greedy and beam search: hand-built next-token tables, and the tiny model through its cache.

Table tests drive `greedy_search` / `beam_search` with a step function whose next-token
probabilities depend on the previous token only, so every expected score is a product
of table entries written out below, and an exhaustive enumeration confirms it is the best.
Model tests check the cached decoder against full recomputation and rescoring with the
teacher-forced model. Decoding is eager except in the two compilation tests (each
distinct shape costs an XLA compile on TensorFlow and JAX).
"""

import inspect
import itertools
import math

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy
from keras import ops

import keras_transformer as kt
from keras_transformer.inference import decoding
from keras_transformer.inference.compiled import CompiledDecoder
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID

UNK, A, B = 1, 4, 5  # token ids of the 6-token table vocabulary: PAD UNK BOS EOS A B
VOCAB = 6


def table_step_fn(rows):
    """A step function whose next-token probabilities are `rows[previous token]`."""
    probs = np.full((VOCAB, VOCAB), 1.0 / 4)  # rows not given: uniform over UNK EOS A B
    probs[:, [PAD_ID, BOS_ID]] = 0.0
    for previous, row in rows.items():
        probs[previous] = 0.0
        for token, p in row.items():
            probs[previous, token] = p
    assert np.allclose(probs.sum(axis=1), 1.0)
    # log(0) would be -inf; 1e-30 keeps logits finite and changes nothing at float32.
    logits = ops.convert_to_tensor(np.log(np.maximum(probs, 1e-30)), "float32")

    def step_fn(token_ids, index, state):
        return ops.take(logits, token_ids[:, 0], axis=0), state

    return step_fn, probs


def enumerate_best(probs, alpha, limit):
    """Exhaustive search: the EOS-ended sequence of <= limit tokens with the best score."""
    best = (-math.inf, None)
    for length in range(1, limit + 1):
        for body in itertools.product((UNK, A, B), repeat=length - 1):
            sequence = list(body) + [EOS_ID]
            previous, log_prob = BOS_ID, 0.0
            for token in sequence:
                log_prob += math.log(probs[previous, token])
                previous = token
            score = log_prob / ((5 + length) / 6) ** alpha
            best = max(best, (score, sequence))
    return best


def padded(sequence, width):
    return list(sequence) + [0] * (width - len(sequence))


# A -> EOS is the greedy path (0.5 * 0.35); B -> EOS is better (0.4 * 0.9).
GREEDY_TRAP = {
    BOS_ID: {UNK: 0.05, EOS_ID: 0.05, A: 0.5, B: 0.4},
    A: {UNK: 0.05, EOS_ID: 0.35, A: 0.3, B: 0.3},
    B: {UNK: 0.05, EOS_ID: 0.9, A: 0.025, B: 0.025},
}
# Short [EOS] (0.5) against long [A, B, EOS] (0.45 * 0.9 * 0.9 = 0.3645).
SHORT_OR_LONG = {
    BOS_ID: {UNK: 0.025, EOS_ID: 0.5, A: 0.45, B: 0.025},
    A: {UNK: 0.025, EOS_ID: 0.05, A: 0.025, B: 0.9},
    B: {UNK: 0.025, EOS_ID: 0.9, A: 0.05, B: 0.025},
}
# EOS is always unlikely, so sentences end where their limit forces it.
NEVER_ENDS = {token: {UNK: 0.04, EOS_ID: 0.01, A: 0.9, B: 0.05} for token in (BOS_ID, UNK, A, B)}
# A is always likeliest and EOS second: an EOS extension is among the best two at every
# step, while the most probable extension never ends.
A_THEN_EOS = {token: {UNK: 0.025, EOS_ID: 0.05, A: 0.9, B: 0.025} for token in (BOS_ID, UNK, A, B)}


def test_length_penalty_is_gnmt_formula():
    assert float(decoding.length_penalty(7, 0.6)) == pytest.approx((12 / 6) ** 0.6)
    assert float(decoding.length_penalty(3, 0.0)) == 1.0


def test_paper_defaults_are_defined_once_here():
    assert (decoding.BEAM_SIZE, decoding.LENGTH_PENALTY, decoding.MAX_DECODE_EXTRA) == (4, 0.6, 50)
    assert decoding.DECODE_METHODS == ("beam", "greedy")
    defaults = inspect.signature(decoding.beam_decode).parameters
    assert defaults["beam_size"].default == 4 and defaults["alpha"].default == 0.6
    for function in (decoding.decode_lengths, decoding.greedy_decode, decoding.beam_decode):
        assert inspect.signature(function).parameters["max_extra"].default == 50


def test_nested_state_is_carried_through_both_searches():
    """`step_fn` state of any structure: here a dict whose tensors count the steps."""
    step_fn, _ = table_step_fn(NEVER_ENDS)

    def counting_step_fn(token_ids, index, state):
        logits, _ = step_fn(token_ids, index, state)
        steps = {"steps": state["steps"] + 1, "pair": (state["pair"][0], state["pair"][1] * 2)}
        return logits, steps

    state = {"steps": ops.zeros((2, 1), "int32"), "pair": (ops.ones((2, 3)), ops.ones((2,)))}
    limits = ops.convert_to_tensor([2, 4], "int32")
    expected = [padded([A, EOS_ID], 5), padded([A, A, A, EOS_ID], 5)]
    tokens, _ = decoding.greedy_search(counting_step_fn, state, 2, 5, sentence_max_lengths=limits)
    assert to_numpy(tokens).tolist() == expected
    tokens, _ = decoding.beam_search(
        counting_step_fn, state, 2, 5, beam_size=2, sentence_max_lengths=limits
    )
    assert to_numpy(tokens).tolist() == expected


def test_beam_finds_the_better_sequence_greedy_misses():
    step_fn, probs = table_step_fn(GREEDY_TRAP)
    tokens, scores = decoding.greedy_search(step_fn, (), 1, 4)
    assert to_numpy(tokens).tolist() == [padded([A, EOS_ID], 4)]
    assert to_numpy(scores)[0] == pytest.approx(math.log(0.5 * 0.35), abs=1e-5)

    tokens, scores = decoding.beam_search(step_fn, (), 1, 4, beam_size=2, alpha=0.6)
    expected_score = math.log(0.4 * 0.9) / ((5 + 2) / 6) ** 0.6
    assert to_numpy(tokens).tolist() == [padded([B, EOS_ID], 4)]
    assert to_numpy(scores)[0] == pytest.approx(expected_score, abs=1e-5)
    assert enumerate_best(probs, 0.6, 4) == (pytest.approx(expected_score), [B, EOS_ID])


def test_alpha_decides_between_short_and_long_hypotheses():
    step_fn, probs = table_step_fn(SHORT_OR_LONG)
    short_score = math.log(0.5)  # length penalty of length 1 is 1 for every alpha
    long_log_prob = math.log(0.45 * 0.9 * 0.9)

    tokens, scores = decoding.beam_search(step_fn, (), 1, 5, beam_size=2, alpha=0.0)
    assert to_numpy(tokens).tolist() == [padded([EOS_ID], 5)]
    assert to_numpy(scores)[0] == pytest.approx(short_score, abs=1e-5)
    assert enumerate_best(probs, 0.0, 5)[1] == [EOS_ID]

    tokens, scores = decoding.beam_search(
        step_fn, (), 1, 5, beam_size=2, alpha=2.0, return_all_beams=True
    )
    long_score = long_log_prob / (8 / 6) ** 2.0  # -0.568 beats -0.693
    assert to_numpy(tokens).tolist() == [[padded([A, B, EOS_ID], 5), padded([EOS_ID], 5)]]
    np.testing.assert_allclose(to_numpy(scores), [[long_score, short_score]], atol=1e-5)
    assert enumerate_best(probs, 2.0, 5)[1] == [A, B, EOS_ID]


def test_early_stopping_ends_a_sentence_once_its_beam_of_finished_hypotheses_is_full():
    """With alpha 2 the long [A, B, EOS] wins (test above); early stopping never reaches it.

    Beam 2, step 0: the 4 best extensions are EOS 0.5, A 0.45, UNK 0.025, B 0.025. The most
    probable one ends, and EOS is among the best 2, so [EOS] finishes. Step 1: from A, B
    0.405 then EOS 0.0225 (UNK's extensions are 0.025 / 4 each), so [A, EOS] finishes too:
    two finished fill the beam and the sentence stops, where the exact search goes on to
    [A, B, EOS] at step 2.
    """
    step_fn, _ = table_step_fn(SHORT_OR_LONG)
    short_score = math.log(0.5)
    a_eos_score = math.log(0.45 * 0.05) / (7 / 6) ** 2.0
    tokens, scores = decoding.beam_search(
        step_fn, (), 1, 5, beam_size=2, alpha=2.0, return_all_beams=True, early_stopping=True
    )
    assert to_numpy(tokens).tolist() == [[padded([EOS_ID], 5), padded([A, EOS_ID], 5)]]
    np.testing.assert_allclose(to_numpy(scores), [[short_score, a_eos_score]], atol=1e-5)
    # A beam of 1 stops as soon as its most probable extension is EOS: greedy's choice.
    tokens, _ = decoding.beam_search(step_fn, (), 1, 5, beam_size=1, alpha=2.0, early_stopping=True)
    assert to_numpy(tokens).tolist() == [padded([EOS_ID], 5)]
    tokens, _ = decoding.beam_search(step_fn, (), 1, 5, beam_size=1, alpha=2.0)
    assert to_numpy(tokens).tolist() == [padded([A, B, EOS_ID], 5)]
    # Where the exact rule already stops as soon as the beam is full, the two agree.
    step_fn, _ = table_step_fn(GREEDY_TRAP)
    exact = decoding.beam_search(step_fn, (), 1, 4, beam_size=2, alpha=0.6, return_all_beams=True)
    early = decoding.beam_search(
        step_fn, (), 1, 4, beam_size=2, alpha=0.6, return_all_beams=True, early_stopping=True
    )
    assert to_numpy(early[0]).tolist() == to_numpy(exact[0]).tolist()
    np.testing.assert_allclose(to_numpy(early[1]), to_numpy(exact[1]), atol=1e-6)


def test_early_stopping_waits_for_the_most_probable_extension_to_end():
    """K finished hypotheses stop a sentence only once its most probable extension was EOS.

    A_THEN_EOS, beam 2, alpha 1, limit 5: at every step an EOS extension is second best,
    so [EOS] (0.05) finishes at step 0 and [A, EOS] (0.9 * 0.05) at step 1, filling the
    beam; but A is always the most probable, so the search goes on to the limit, as the
    exact rule does, and keeps the two best: [A, A, A, A, EOS] (EOS forced at the limit)
    and [A, A, A, EOS].
    """
    step_fn, probs = table_step_fn(A_THEN_EOS)
    expected_tokens = [[padded([A, A, A, A, EOS_ID], 5), padded([A, A, A, EOS_ID], 5)]]
    expected_scores = [[math.log(0.9**4 * 0.05) / (10 / 6), math.log(0.9**3 * 0.05) / (9 / 6)]]
    assert enumerate_best(probs, 1.0, 5) == (pytest.approx(expected_scores[0][0]), [A, A, A, A, EOS_ID])
    for early_stopping in (False, True):
        tokens, scores = decoding.beam_search(
            step_fn, (), 1, 5, beam_size=2, alpha=1.0, return_all_beams=True, early_stopping=early_stopping
        )
        assert to_numpy(tokens).tolist() == expected_tokens, early_stopping
        np.testing.assert_allclose(to_numpy(scores), expected_scores, atol=1e-5)


def test_each_sentence_stops_at_its_own_limit_with_eos_then_zeros():
    step_fn, probs = table_step_fn(NEVER_ENDS)
    limits = ops.convert_to_tensor([2, 4], "int32")
    tokens, scores = decoding.greedy_search(step_fn, (), 2, 5, sentence_max_lengths=limits)
    assert to_numpy(tokens).tolist() == [padded([A, EOS_ID], 5), padded([A, A, A, EOS_ID], 5)]
    np.testing.assert_allclose(
        to_numpy(scores), [math.log(0.9 * 0.01), math.log(0.9**3 * 0.01)], atol=1e-5
    )

    tokens, scores = decoding.beam_search(
        step_fn, (), 2, 5, beam_size=2, alpha=0.6, sentence_max_lengths=limits
    )
    assert to_numpy(tokens).tolist() == [padded([A, EOS_ID], 5), padded([A, A, A, EOS_ID], 5)]
    expected = [
        math.log(0.9 * 0.01) / (7 / 6) ** 0.6,
        math.log(0.9**3 * 0.01) / (9 / 6) ** 0.6,
    ]
    np.testing.assert_allclose(to_numpy(scores), expected, atol=1e-5)
    assert [enumerate_best(probs, 0.6, n)[1] for n in (2, 4)] == [[A, EOS_ID], [A, A, A, EOS_ID]]


# ------------------------------------------------------------------ the model
EXTRA = 2  # max_extra: limits of source length + 2 keep every decode short
SOURCES = np.array([[5, 6, 7, 0, 0, 0], [8, 9, 10, 11, 12, 13]], "int32")
LIMITS = [3 + EXTRA, 6 + EXTRA]
GREEDY = dict(max_extra=EXTRA)
BEAMS = dict(beam_size=3, alpha=0.6, max_extra=EXTRA, return_all_beams=True)


def forward(model, encoder_inputs, decoder_inputs):
    """Teacher-forced logits as NumPy float64.

    JAX runs it as one jitted program (`predict_on_batch`): called eagerly, JAX compiles
    every op separately for each new shape, which costs seconds per shape here.
    """
    inputs = {"encoder_inputs": encoder_inputs, "decoder_inputs": decoder_inputs.astype("int32")}
    if keras.backend.backend() == "jax":
        return np.asarray(model.predict_on_batch(inputs), "float64")
    return to_numpy(model(inputs)).astype("float64")


def log_softmax(logits):
    shifted = logits - logits.max(-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))


def teacher_forced_log_probs(model, sources, tokens):
    """Summed model log-probabilities of EOS-ended `tokens [N, L]`, and their lengths."""
    decoder_inputs = np.concatenate([np.full((len(tokens), 1), BOS_ID), tokens[:, :-1]], 1)
    log_probs = log_softmax(forward(model, sources, decoder_inputs))
    picked = np.take_along_axis(log_probs, tokens[:, :, None].astype("int64"), -1)[:, :, 0]
    lengths = np.argmax(tokens == EOS_ID, axis=1) + 1
    real = np.arange(tokens.shape[1])[None, :] < lengths[:, None]
    return np.where(real, picked, 0.0).sum(1), lengths


@pytest.fixture(scope="module")
def decoded():
    """One tiny model, its greedy and beam decodes of SOURCES, and the model's rescoring.

    Returns `(model, (greedy tokens, scores), (beam tokens, scores), (log_probs,
    lengths))`, the last for the 2 greedy rows then the 6 beam rows, in one forward pass.
    """
    keras.utils.set_random_seed(7)
    model = kt.build_transformer(tiny_config())
    greedy = [to_numpy(x) for x in decoding.greedy_decode(model, SOURCES, **GREEDY)]
    beams = [to_numpy(x) for x in decoding.beam_decode(model, SOURCES, **BEAMS)]
    rows = np.concatenate([greedy[0], beams[0].reshape(6, -1)])
    sources = np.concatenate([SOURCES, np.repeat(SOURCES, 3, axis=0)])
    return model, greedy, beams, teacher_forced_log_probs(model, sources, rows)


def reference_greedy(model, sources, limits, width):
    """Greedy decoding by running the full teacher-forced model over the prefix each step."""
    prefix = np.zeros((len(sources), width), "int32")
    prefix[:, 0] = BOS_ID
    tokens = np.zeros_like(prefix)
    finished = np.zeros(len(sources), bool)
    for i in range(width):
        log_probs = log_softmax(forward(model, sources, prefix)[:, i])
        log_probs[:, [PAD_ID, BOS_ID]] = -np.inf
        for row, limit in enumerate(limits):
            if finished[row]:
                continue
            token = EOS_ID if i == limit - 1 else int(np.argmax(log_probs[row]))
            tokens[row, i] = token
            finished[row] = token == EOS_ID
            if i + 1 < width:
                prefix[row, i + 1] = token
    return tokens


def test_cached_greedy_equals_full_recomputation(decoded):
    model, (tokens, scores), _, (log_probs, _) = decoded
    width = max(LIMITS)
    assert tokens.shape == (2, width)
    np.testing.assert_array_equal(tokens, reference_greedy(model, SOURCES, LIMITS, width))
    uncached_tokens, uncached_scores = decoding.greedy_decode_uncached(model, SOURCES, **GREEDY)
    np.testing.assert_array_equal(to_numpy(uncached_tokens), tokens)
    np.testing.assert_allclose(to_numpy(uncached_scores), scores, atol=1e-5)
    np.testing.assert_allclose(scores, log_probs[:2], atol=1e-4)


def test_beam_hypotheses_are_scored_as_the_model_scores_them(decoded):
    _, _, (tokens, scores), (log_probs, lengths) = decoded
    log_probs, lengths = log_probs[2:], lengths[2:]
    assert tokens.shape == (2, 3, max(LIMITS)) and scores.shape == (2, 3)
    assert np.all(np.isfinite(scores)) and np.all(np.diff(scores, axis=1) <= 0)
    # A cache gathered from the wrong beam would score a different prefix than it returns.
    np.testing.assert_allclose(scores.reshape(-1), log_probs / ((5 + lengths) / 6) ** 0.6, atol=1e-4)
    for row, length in zip(tokens.reshape(6, -1), lengths):
        assert row[length - 1] == EOS_ID and not np.any(row[length:])
        assert EOS_ID not in row[: length - 1] and PAD_ID not in row[:length]
    assert np.all(lengths.reshape(2, 3) <= np.array(LIMITS)[:, None])
    for sentence in tokens:
        assert len({tuple(row) for row in sentence}) == 3


def test_beam_of_one_without_length_penalty_is_greedy(decoded):
    model, (greedy_tokens, greedy_scores), _, _ = decoded
    tokens, scores = decoding.beam_decode(model, SOURCES, beam_size=1, alpha=0.0, **GREEDY)
    np.testing.assert_array_equal(to_numpy(tokens), greedy_tokens)
    np.testing.assert_allclose(to_numpy(scores), greedy_scores, atol=1e-5)


def test_a_batch_decodes_each_sentence_as_it_decodes_alone(decoded):
    model, (greedy_tokens, greedy_scores), (beam_tokens, beam_scores), _ = decoded
    for row, limit in enumerate(LIMITS):
        alone = SOURCES[row : row + 1, : np.count_nonzero(SOURCES[row])]
        tokens, scores = (to_numpy(x) for x in decoding.greedy_decode(model, alone, **GREEDY))
        assert tokens.shape == (1, limit)
        np.testing.assert_array_equal(greedy_tokens[row, :limit], tokens[0])
        assert not np.any(greedy_tokens[row, limit:])
        np.testing.assert_allclose(greedy_scores[row], scores[0], atol=1e-5)

        tokens, scores = (to_numpy(x) for x in decoding.beam_decode(model, alone, **BEAMS))
        np.testing.assert_array_equal(beam_tokens[row, :, :limit], tokens[0])
        assert not np.any(beam_tokens[row, :, limit:])
        np.testing.assert_allclose(beam_scores[row], scores[0], atol=1e-5)


def test_lengths_follow_the_paper_and_the_model(decoded):
    model = decoded[0]
    width, limits = decoding.decode_lengths(model, SOURCES, max_extra=EXTRA)
    assert width == 6 + EXTRA and to_numpy(limits).tolist() == LIMITS
    # By default source length + 50 (6.1), capped so BOS + output fits max_length=32.
    width, limits = decoding.decode_lengths(model, SOURCES)
    assert width == 31 and to_numpy(limits).tolist() == [31, 31]
    width, limits = decoding.decode_lengths(model, SOURCES, max_length=4)
    assert width == 4 and to_numpy(limits).tolist() == [4, 4]


def test_bad_arguments_are_refused_with_clear_messages(decoded):
    model = decoded[0]
    with pytest.raises(ValueError, match=r"`beam_size` must be a positive integer. Received: beam_size=0"):
        decoding.beam_decode(model, SOURCES, beam_size=0)
    with pytest.raises(ValueError, match=r"`alpha` must be a finite number >= 0. Received: alpha=-1"):
        decoding.beam_decode(model, SOURCES, alpha=-1.0)
    with pytest.raises(ValueError, match=r"`max_extra` must be an integer >= 0. Received: max_extra=True"):
        decoding.greedy_decode(model, SOURCES, max_extra=True)
    with pytest.raises(ValueError, match=r"shape \[batch, source_length\]. Received: shape=\(6,\)"):
        decoding.greedy_decode(model, SOURCES[0])
    with pytest.raises(ValueError, match=r"integer token ids. Received: dtype=float32"):
        decoding.greedy_decode(model, SOURCES.astype("float32"))
    with pytest.raises(ValueError, match=r"`max_length` must be an integer in \[1, 31\].*max_length=40"):
        decoding.greedy_decode(model, SOURCES, max_length=40)
    with pytest.raises(ValueError, match=r"`method` must be one of .* Received: method='nucleus'"):
        CompiledDecoder(model, "nucleus")
    with pytest.raises(ValueError, match=r"`seed` is required by the \"sample\" method and taken by no other"):
        CompiledDecoder(model, "greedy", **GREEDY)(SOURCES, seed=3)


def test_compiled_decoder_traces_once_per_shape_and_sees_new_weights(decoded):
    model, _, (beam_tokens, beam_scores), _ = decoded
    decoder = CompiledDecoder(model, "beam", **BEAMS)
    tokens, scores = decoder(SOURCES)
    np.testing.assert_array_equal(to_numpy(tokens), beam_tokens)
    np.testing.assert_allclose(to_numpy(scores), beam_scores, atol=1e-5)

    other = np.array([[9, 8, 7, 6, 0, 0], [4, 5, 0, 0, 0, 0]], "int32")  # same bucket shape
    _, old_scores = decoder(other)
    embedding = model.get_layer("token_embedding").weights[0]
    original = to_numpy(embedding)
    try:
        embedding.assign(original * 3.0)  # weights baked in as constants would not see this
        tokens, scores = decoder(other)
        expected = decoding.beam_decode(model, other, **BEAMS)
    finally:
        embedding.assign(original)
    np.testing.assert_array_equal(to_numpy(tokens), to_numpy(expected[0]))
    np.testing.assert_allclose(to_numpy(scores), to_numpy(expected[1]), atol=1e-5)
    assert np.abs(to_numpy(scores) - to_numpy(old_scores)).max() > 1e-2
    if keras.backend.backend() == "torch":
        assert decoder.trace_count == 0  # eager by design: nothing is traced
    else:
        assert decoder.trace_count == 1


def test_decoding_traces_in_a_tf_function_with_dynamic_batch_and_length(decoded):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("tf.function with an input_signature (the SavedModel path) is TensorFlow only")
    import tensorflow as tf

    model, _, (beam_tokens, beam_scores), _ = decoded
    traces = []

    def decode(ids):
        traces.append(ids.shape)  # runs only while tracing
        return decoding.beam_decode(model, ids, **BEAMS)

    beam = tf.function(decode, input_signature=[tf.TensorSpec([None, None], tf.int32)])
    tokens, scores = beam(SOURCES)
    np.testing.assert_array_equal(tokens.numpy(), beam_tokens)
    np.testing.assert_allclose(scores.numpy(), beam_scores, atol=1e-5)
    tokens, scores = beam(SOURCES[1:, :4])  # another batch size and source length
    expected = decoding.beam_decode(model, SOURCES[1:, :4], **BEAMS)
    np.testing.assert_array_equal(tokens.numpy(), to_numpy(expected[0]))
    np.testing.assert_allclose(scores.numpy(), to_numpy(expected[1]), atol=1e-5)
    assert [shape.as_list() for shape in traces] == [[None, None]]  # one trace served both


# ------------------------------------------------------------------ forced prefixes
PREFIXES = np.array([[20, 21, 0], [22, 0, 0]], "int32")  # two tokens, one token


def test_a_prefix_is_forced_then_the_table_decides():
    """Forcing B (the trap's second choice) makes greedy find B -> EOS; scores include it."""
    step_fn, _ = table_step_fn(GREEDY_TRAP)
    prefix = np.array([[B]], "int32")
    tokens, scores = decoding.greedy_search(step_fn, (), 1, 4, prefix_ids=prefix)
    assert to_numpy(tokens).tolist() == [padded([B, EOS_ID], 4)]
    assert to_numpy(scores)[0] == pytest.approx(math.log(0.4 * 0.9), abs=1e-5)
    # Forcing A, A: every beam follows it, then branches.
    tokens, scores = decoding.beam_search(
        step_fn, (), 1, 5, beam_size=2, alpha=0.0, prefix_ids=np.array([[A, A]], "int32"), return_all_beams=True
    )
    # A A EOS (0.5 * 0.3 * 0.35) beats A A B EOS (0.5 * 0.3 * 0.3 * 0.9) at alpha = 0.
    assert to_numpy(tokens).tolist() == [[padded([A, A, EOS_ID], 5), padded([A, A, B, EOS_ID], 5)]]
    np.testing.assert_allclose(
        to_numpy(scores), [[math.log(0.5 * 0.3 * 0.35), math.log(0.5 * 0.3 * 0.3 * 0.9)]], atol=1e-5
    )
    # The length limit wins over a prefix that does not fit (what a compiled search does).
    tokens, _ = decoding.greedy_search(step_fn, (), 1, 2, prefix_ids=np.array([[A, A, A]], "int32"))
    assert to_numpy(tokens).tolist() == [[A, EOS_ID]]


def test_greedy_from_a_prefix_of_its_own_output_gives_that_output(decoded):
    model, (tokens, scores), _, _ = decoded
    for length in (1, 2, 3):
        prefix = tokens[:, :length].copy()
        prefixed_tokens, prefixed_scores = decoding.greedy_decode(model, SOURCES, prefix_ids=prefix, **GREEDY)
        np.testing.assert_array_equal(to_numpy(prefixed_tokens), tokens)
        np.testing.assert_allclose(to_numpy(prefixed_scores), scores, atol=1e-5)


def test_forced_prefixes_are_kept_and_decoded_as_the_uncached_model_decodes(decoded):
    model, (tokens, _), _, _ = decoded
    cached, cached_scores = (to_numpy(x) for x in decoding.greedy_decode(model, SOURCES, prefix_ids=PREFIXES, **GREEDY))
    uncached, uncached_scores = (
        to_numpy(x) for x in decoding.greedy_decode_uncached(model, SOURCES, prefix_ids=PREFIXES, **GREEDY)
    )
    np.testing.assert_array_equal(cached, uncached)
    np.testing.assert_allclose(cached_scores, uncached_scores, atol=1e-5)
    assert cached[0, :2].tolist() == [20, 21] and cached[1, 0] == 22
    assert not np.array_equal(cached, tokens)  # the continuation follows the prefix
    # The score is the model's log-probability of the whole output, prefix included.
    log_probs, _ = teacher_forced_log_probs(model, SOURCES, cached)
    np.testing.assert_allclose(cached_scores, log_probs, atol=1e-4)


def test_beam_search_from_a_prefix_starts_every_hypothesis_with_it(decoded):
    model = decoded[0]
    tokens, scores = (to_numpy(x) for x in decoding.beam_decode(model, SOURCES, prefix_ids=PREFIXES, **BEAMS))
    assert np.all(tokens[0, :, :2] == [20, 21]) and np.all(tokens[1, :, 0] == 22)
    assert np.all(np.diff(scores, axis=1) <= 0) and np.all(np.isfinite(scores))
    log_probs, lengths = teacher_forced_log_probs(model, np.repeat(SOURCES, 3, axis=0), tokens.reshape(6, -1))
    np.testing.assert_allclose(scores.reshape(-1), log_probs / ((5 + lengths) / 6) ** 0.6, atol=1e-4)
    decoder = CompiledDecoder(model, "beam", **BEAMS)
    compiled_tokens, compiled_scores = decoder(SOURCES, prefix_ids=PREFIXES)
    np.testing.assert_array_equal(to_numpy(compiled_tokens), tokens)
    np.testing.assert_allclose(to_numpy(compiled_scores), scores, atol=1e-5)


def test_bad_prefixes_are_refused_naming_the_lengths(decoded):
    model = decoded[0]
    too_long = np.array([[20, 21, 22, 23, 24], [22, 0, 0, 0, 0]], "int32")  # limit 3 + 2 = 5
    message = r"The prefix of sentence 0 has 5 tokens, but that sentence's output limit is 5 tokens, EOS included: a prefix may have at most 4"
    with pytest.raises(ValueError, match=message):
        decoding.greedy_decode(model, SOURCES, prefix_ids=too_long, **GREEDY)
    with pytest.raises(ValueError, match=message):
        decoding.beam_decode(model, SOURCES, prefix_ids=too_long, beam_size=2, max_extra=EXTRA)
    with pytest.raises(ValueError, match=r"one row per sentence: 2 rows. Received: shape=\(1, 2\)"):
        decoding.greedy_decode(model, SOURCES, prefix_ids=np.array([[20, 21]]), **GREEDY)
    with pytest.raises(ValueError, match=r"holds id 40 at position \(1, 0\), outside \[0, vocab_size=32\)"):
        decoding.greedy_decode(model, SOURCES, prefix_ids=np.array([[20], [40]]), **GREEDY)
    with pytest.raises(ValueError, match=r"holds BOS \(2\) at position \(0, 0\)"):
        decoding.greedy_decode(model, SOURCES, prefix_ids=np.array([[BOS_ID], [20]]), **GREEDY)
