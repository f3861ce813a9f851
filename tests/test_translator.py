"""`Translator`: the decoder's results as text, whatever the batching, threads or input.

The tiny model has random weights; each test compares two ways of reaching the same
decoding (see tiny_translation.py), or checks an input rule from the bad-input list.
"""

import concurrent.futures
import random
import warnings

import keras
import numpy as np
import pytest
from tiny_translation import (  # noqa: F401  (session fixtures)
    BATCH_SIZE,
    BEAM_SIZE,
    MAX_EXTRA,
    MAX_LENGTH,
    model_dir,
    pick_sentences,
    sentences,
    tiny_sentences,
    translator,
)

import keras_transformer as kt
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID
from keras_transformer.inference import decoding
from keras_transformer.inference.compiled import JAX_CACHE_MAX_BYTES, use_jax_compilation_cache
from keras_transformer.inference.translator import Hypothesis, Translator, pad_batch


def alone(translator, sentence):
    """`sentence` through the translator's own decoder, alone in a [1, 16] batch."""
    ids = translator.tokenizer.encode([sentence])[0][: translator.max_source_tokens]
    tokens, _ = translator.decoder(pad_batch([ids + [EOS_ID]], MAX_LENGTH, 1))
    return translator.tokenizer.decode(keras.ops.convert_to_numpy(tokens))[0]


def test_translations_are_the_decoded_tokens_of_each_sentence(translator, sentences):
    expected = [alone(translator, sentence) for sentence in sentences]
    assert translator.translate(sentences) == expected
    assert all(expected)  # random weights still produce text, so the comparison means something


def test_batch_composition_and_order_do_not_change_a_translation(translator, sentences):
    together = translator.translate(sentences)
    one_by_one = [translator.translate([sentence])[0] for sentence in sentences]
    shuffled = list(range(len(sentences)))
    random.Random(0).shuffle(shuffled)
    reordered = translator.translate([sentences[i] for i in shuffled])
    assert one_by_one == together
    assert [together[i] for i in shuffled] == reordered


def test_same_shapes_reuse_the_compiled_decoder(translator, sentences):
    translator.translate(sentences)
    translator.translate(sentences[:1])
    count = translator.decoder.trace_count
    others = pick_sentences(translator.tokenizer, count=16)[8:]
    translator.translate(others)  # 8 new sentences: two batches of 4, length bucket 16
    translator.translate(others[3:4])
    assert translator.decoder.trace_count == count
    if keras.backend.backend() != "torch":  # PyTorch runs eagerly: nothing is traced
        assert count >= 1


def test_empty_and_whitespace_only_inputs_translate_to_empty_strings(translator, sentences):
    translations, scores = translator.translate(["", sentences[0], "   ", "\t\n"], return_scores=True)
    assert translations == ["", alone(translator, sentences[0]), "", ""]
    assert translations[1] != ""
    assert scores[0] == scores[2] == scores[3] == 0.0 != scores[1]
    assert translator.translate([]) == []
    assert translator.translate(["", " "]) == ["", ""]


def test_over_long_input_is_truncated_with_a_warning_naming_it(translator, sentences):
    long = f"{sentences[0]} {sentences[1]}"
    tokens = len(translator.tokenizer.encode([long])[0])
    assert tokens > translator.max_source_tokens == 15
    warning = (
        rf"Input 1 has {tokens} tokens, more than the model's maximum source length of 15 "
        r"tokens .* truncated to its first 15 tokens"
    )
    with pytest.warns(UserWarning, match=warning):
        translations = translator.translate(["", long])
    assert translations[1] == alone(translator, long)  # `alone` cuts to 15 tokens too


@pytest.mark.parametrize(
    "inputs, message",
    [
        (["cats see cars", None], r"Received: NoneType \(None\) at index 1"),
        ([b"cats see cars"], r"Received: bytes \(b'cats see cars'\) at index 0"),
        (["cats", "dogs", 3], r"Received: int \(3\) at index 2"),
        ("cats see cars", r"must be a list of str, not a single str; wrap it in a list"),
        (b"cats", r"must be a list of str, not a single bytes"),
        (5, r"must be a list of str. Received: int"),
    ],
    ids=["none", "bytes", "int", "lone_str", "lone_bytes", "not_iterable"],
)
def test_non_string_input_raises_type_error_naming_it(translator, inputs, message):
    with pytest.raises(TypeError, match=message):
        translator.translate(inputs)


def test_one_translator_shared_by_four_threads_gives_sequential_results(translator, sentences):
    jobs = [sentences, sentences[::-1], sentences[2:3], sentences[:4]]
    sequential = [translator.translate(job) for job in jobs]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(translator.translate, jobs))
    assert parallel == sequential


def test_beam_size_one_is_greedy_search_and_a_model_object_works(translator, model_dir, sentences):
    greedy = Translator(
        translator.model,
        tokenizer=str(model_dir / "tokenizer.model"),
        beam_size=1,
        max_extra=MAX_EXTRA,
        batch_size=len(sentences),
        jit_compile=False,
    )
    assert greedy.decoder.method == "greedy"
    sources = pad_batch([ids + [EOS_ID] for ids in greedy.tokenizer.encode(sentences)], MAX_LENGTH, 8)
    tokens = keras.ops.convert_to_numpy(greedy.decoder(sources)[0])
    assert greedy.translate(sentences) == greedy.tokenizer.decode(tokens)
    # Greedy: each token is the argmax (PAD and BOS excluded) of the teacher-forced
    # logits after the tokens before it; the EOS that ends the sentence is the argmax
    # too, or is forced at the sentence's limit (source length + MAX_EXTRA, at most 15).
    decoder_inputs = np.concatenate([np.full((len(tokens), 1), BOS_ID), tokens[:, :-1]], axis=1)
    logits = keras.ops.convert_to_numpy(
        translator.model({"encoder_inputs": sources, "decoder_inputs": decoder_inputs.astype("int32")})
    )
    logits[:, :, [PAD_ID, BOS_ID]] = -np.inf
    limits = np.minimum((sources != PAD_ID).sum(axis=1) + MAX_EXTRA, MAX_LENGTH - 1)
    for row, sequence in enumerate(tokens.tolist()):
        length = sequence.index(EOS_ID) + 1
        best = logits[row, :length].argmax(axis=-1).tolist()
        assert sequence[: length - 1] == best[: length - 1]
        assert best[length - 1] == EOS_ID or length == limits[row]


def test_xla_compiled_translator_gives_the_same_translations(translator, sentences):
    if keras.backend.backend() != "tensorflow":
        pytest.skip("jit_compile only changes the TensorFlow backend (JAX always compiles)")
    compiled = Translator(
        translator.model, translator.tokenizer, beam_size=BEAM_SIZE, max_extra=MAX_EXTRA, batch_size=BATCH_SIZE
    )
    assert compiled.translate(sentences) == translator.translate(sentences)


def test_early_stopping_is_the_beam_searches_setting(translator, sentences):
    """The search's rule itself is tested on tables (test_decoding) and against CTranslate2."""
    early = Translator(
        translator.model, translator.tokenizer, beam_size=BEAM_SIZE, max_extra=MAX_EXTRA, jit_compile=False,
        early_stopping=True,
    )
    assert early.early_stopping is True and translator.early_stopping is False
    assert early.decoder.decode_kwargs["early_stopping"] is True
    assert translator.decoder.decode_kwargs["early_stopping"] is False
    early.translate(sentences[:2], n_best=2)  # the n-best decoder is made on first use
    assert early._n_best_decoder.decode_kwargs["early_stopping"] is True


def test_default_batches_hold_32_hypotheses_and_decode_each_sentence_alike(translator, sentences):
    """8 sentences at beam 4, 32 greedy; any batching gives the same translations."""
    model, tokenizer = translator.model, translator.tokenizer
    settings = dict(max_extra=MAX_EXTRA, jit_compile=False)
    assert Translator(model, tokenizer, beam_size=4, **settings).batch_size == 8
    assert Translator(model, tokenizer, beam_size=1, **settings).batch_size == 32
    assert Translator(model, tokenizer, beam_size=64, **settings).batch_size == 1
    assert Translator(model, tokenizer, beam_size=4, batch_size=3, **settings).batch_size == 3
    by_default = Translator(model, tokenizer, beam_size=BEAM_SIZE, **settings)
    assert by_default.batch_size == 16
    assert by_default.translate(sentences) == translator.translate(sentences)  # batches of 16 and of 4


def test_jax_keeps_compiled_searches_in_the_user_cache(monkeypatch, tmp_path):
    if keras.backend.backend() != "jax":
        assert use_jax_compilation_cache() is None  # only JAX has a persistent cache to point
        return
    import jax

    chosen = jax.config.jax_compilation_cache_dir  # the test session's (conftest.py)
    assert use_jax_compilation_cache() == chosen  # a directory the process chose stays
    monkeypatch.setenv("KERAS_TRANSFORMER_CACHE", str(tmp_path))
    try:
        jax.config.update("jax_compilation_cache_dir", None)
        assert use_jax_compilation_cache() == str(tmp_path / "jax_compilation")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "jax_compilation")
        assert jax.config.jax_compilation_cache_max_size == JAX_CACHE_MAX_BYTES
        jax.config.update("jax_compilation_cache_dir", None)
        (tmp_path / "file").write_text("")
        with pytest.warns(RuntimeWarning, match=r"compilation cache stays off: its directory .*file/jax"):
            assert use_jax_compilation_cache(tmp_path / "file" / "jax") is None
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", chosen)
        jax.config.update("jax_compilation_cache_max_size", -1)


def test_tokenizer_of_another_vocabulary_is_refused(translator, sentences):
    other = kt.train_tokenizer(tiny_sentences(), vocab_size=32)
    message = r"tokenizer's vocab_size \(32\) differs from the model's config.vocab_size \(48\)"
    with pytest.raises(ValueError, match=message):
        Translator(translator.model, tokenizer=other)


def test_bad_construction_arguments_are_refused(translator, tmp_path):
    with pytest.raises(FileNotFoundError, match="No model.keras in the model directory"):
        Translator(tmp_path)
    with pytest.raises(ValueError, match="A model object needs its tokenizer"):
        Translator(translator.model)
    with pytest.raises(TypeError, match="Received: int"):
        Translator(3)
    with pytest.raises(ValueError, match="`beam_size` must be a positive integer. Received: beam_size=0"):
        Translator(translator.model, translator.tokenizer, beam_size=0)
    with pytest.raises(ValueError, match="`length_penalty` must be a finite number >= 0"):
        Translator(translator.model, translator.tokenizer, length_penalty=-1.0)
    with pytest.raises(ValueError, match="`length_penalty` must be a finite number >= 0. Received: length_penalty=nan"):
        Translator(translator.model, translator.tokenizer, length_penalty=float("nan"))
    with pytest.raises(ValueError, match="`max_extra` must be an integer >= 0. Received: max_extra=-1"):
        Translator(translator.model, translator.tokenizer, max_extra=-1)
    with pytest.raises(ValueError, match="`early_stopping` must be True or False. Received: early_stopping='yes'"):
        Translator(translator.model, translator.tokenizer, early_stopping="yes")
    # The decoding settings are keyword-only: a positional 3rd argument is not a beam size.
    with pytest.raises(TypeError):
        Translator(translator.model, translator.tokenizer, 4)


def test_pad_batch_pads_length_to_multiples_of_8_and_rows_to_powers_of_2():
    padded = pad_batch([[5, 3], [6, 7, 8, 3], [9, 3]], max_length=16, batch_size=64)
    expected = np.zeros((4, 8), "int32")
    expected[0, :2] = [5, 3]
    expected[1, :4] = [6, 7, 8, 3]
    expected[2, :2] = [9, 3]
    expected[3, 0] = EOS_ID  # filler row: an empty sentence
    np.testing.assert_array_equal(padded, expected)
    assert pad_batch([[4] * 9], max_length=12, batch_size=64).shape == (1, 12)  # capped
    assert pad_batch([[4]] * 5, max_length=16, batch_size=6).shape == (6, 8)  # at most batch_size


def test_a_translator_made_before_quantize_retraces_and_decodes_like_a_new_one(model_dir, sentences):
    # Its own copy of the model (the session's translator is shared): quantize changes it.
    old = Translator(model_dir, beam_size=BEAM_SIZE, max_extra=MAX_EXTRA, batch_size=BATCH_SIZE, jit_compile=False)
    _, float_scores = old.translate(sentences, return_scores=True)
    traces = old.decoder.trace_count
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Keras names each layer it leaves in float
        old.model.quantize("int8")  # new variables: int8 kernels and their scales
    translations, scores = old.translate(sentences, return_scores=True)
    new = Translator(old.model, old.tokenizer, beam_size=BEAM_SIZE, max_extra=MAX_EXTRA, batch_size=BATCH_SIZE, jit_compile=False)
    assert (translations, scores) == new.translate(sentences, return_scores=True)
    assert scores != float_scores  # a stale program would still give the float model's
    if keras.backend.backend() != "torch":  # PyTorch decodes eagerly: nothing is traced
        assert old.decoder.trace_count > traces


def test_translate_command_line_rules_run_as_their_examples_say():
    """`kt-translate`'s line rules (`split_lines`, `one_line`): the docstring examples run."""
    import doctest

    from keras_transformer.cli import translate

    failures, tried = doctest.testmod(translate, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert tried >= 2 and failures == 0
    lines, invalid = translate.split_lines(b"\xef\xbb\xbfa\x1cb\r\r\n\xe2\x80\xa8\n")
    assert lines == ["a\x1cb\r", "\u2028"] and invalid == []  # BOM dropped; one "\r" only
    assert translate.split_lines(b"") == ([], []) and translate.split_lines(b"\n") == ([""], [])


# ------------------------------------------------------------------ n-best lists
@pytest.fixture(scope="module")
def greedy(translator):
    """A greedy translator of the session's model (a plain tf.function graph on TensorFlow)."""
    return Translator(
        translator.model, translator.tokenizer, beam_size=1, max_extra=MAX_EXTRA, batch_size=BATCH_SIZE, jit_compile=False
    )


def test_n_best_lists_are_the_beams_best_first_starting_with_the_translation(translator, sentences):
    best, best_scores = translator.translate(sentences, return_scores=True)
    lists = translator.translate(sentences + [""], n_best=BEAM_SIZE)
    assert lists[-1] == [Hypothesis("", 0.0)]
    # Every beam, as beam search returns them (one eager call for all), detokenized.
    ids = [ids + [EOS_ID] for ids in translator.tokenizer.encode(sentences)]
    tokens, scores = (
        keras.ops.convert_to_numpy(x)
        for x in decoding.beam_decode(
            translator.model, pad_batch(ids, MAX_LENGTH, len(ids)), BEAM_SIZE, max_extra=MAX_EXTRA, return_all_beams=True
        )
    )
    for row, (hypotheses, text, score) in enumerate(zip(lists, best, best_scores)):
        assert [h.text for h in hypotheses] == translator.tokenizer.decode(tokens[row])
        np.testing.assert_allclose([h.score for h in hypotheses], scores[row], atol=1e-5)
        assert hypotheses[0].text == text and hypotheses[0].score == pytest.approx(score, abs=1e-5)
        assert hypotheses[0].score >= hypotheses[1].score
    one_best = translator.translate(sentences[:2], n_best=1)
    assert [[h.text for h in hypotheses] for hypotheses in one_best] == [[h[0].text] for h in lists[:2]]
    np.testing.assert_allclose([h[0].score for h in one_best], [h[0].score for h in lists[:2]], atol=1e-5)


def test_n_best_above_the_beam_size_is_refused_naming_both(translator, greedy, sentences):
    with pytest.raises(ValueError, match=r"`n_best` must be at most the beam size.*n_best=3, beam_size=2"):
        translator.translate(sentences, n_best=3)
    with pytest.raises(ValueError, match=r"n_best=2, beam_size=1 \(greedy search keeps one\)"):
        greedy.translate(sentences, n_best=2)
    with pytest.raises(ValueError, match=r"`n_best` must be a positive integer. Received: n_best=0"):
        translator.translate(sentences, n_best=0)
    with pytest.raises(ValueError, match=r"`return_scores` and `n_best` do not go together"):
        translator.translate(sentences, n_best=1, return_scores=True)
    # Greedy search has an n-best list of one: its translation.
    translations, scores = greedy.translate(sentences[:4], return_scores=True)
    assert greedy.translate(sentences[:4], n_best=1) == [[Hypothesis(t, s)] for t, s in zip(translations, scores)]


# ------------------------------------------------------------------ forced prefixes
def _greedy_tokens(translator, sentence):
    ids = translator.tokenizer.encode([sentence])[0][: translator.max_source_tokens]
    tokens, _ = translator.decoder(pad_batch([ids + [EOS_ID]], MAX_LENGTH, 1))
    tokens = keras.ops.convert_to_numpy(tokens)[0].tolist()
    return tokens[: tokens.index(EOS_ID)]


def test_a_prefix_of_the_greedy_output_gives_the_greedy_output(greedy, sentences):
    """Prefixes cut from each output where the text tokenizes back to the same pieces."""
    cases = []
    for sentence in pick_sentences(greedy.tokenizer, count=16):
        tokens = _greedy_tokens(greedy, sentence)
        for length in range(len(tokens) - 1, 0, -1):
            text = greedy.tokenizer.decode(np.array([tokens[:length]]))[0]
            if greedy.tokenizer.encode([text])[0] == tokens[:length]:
                cases.append((sentence, text))
                break
    if not cases:  # test_decoding checks the same with token ids, on every backend
        pytest.skip(
            "this backend's random weights start every output inside a word, so no prefix of "
            "an output tokenizes back to the same pieces"
        )
    sources, prefixes = [case[0] for case in cases], [case[1] for case in cases]
    expected = greedy.translate(sources, return_scores=True)
    got = greedy.translate(sources, prefixes=prefixes, return_scores=True)
    assert got[0] == expected[0]
    np.testing.assert_allclose(got[1], expected[1], atol=1e-5)


def test_a_prefix_starts_the_translation_and_changes_its_continuation(translator, greedy, sentences):
    prefix = "birds like"
    prefixes = [prefix, "", prefix, prefix]
    outputs = {}
    for search in (greedy, translator):
        plain = search.translate(sentences[:4])
        prefixed = outputs[search] = search.translate(sentences[:4], prefixes=prefixes)
        assert all(text.startswith(prefix) for text in (prefixed[0], prefixed[2], prefixed[3]))
        assert prefixed[1] == plain[1]  # "" forces nothing
        assert prefixed[0] != plain[0]
    # Each sentence keeps its own prefix whatever the order of the call.
    order = [3, 1, 0, 2]
    reordered = greedy.translate([sentences[i] for i in order], prefixes=[prefixes[i] for i in order])
    assert reordered == [outputs[greedy][i] for i in order]
    lists = translator.translate(sentences[:4], prefixes=[prefix] * 4, n_best=BEAM_SIZE)
    assert all(h.text.startswith(prefix) for hypotheses in lists for h in hypotheses)
    assert [hypotheses[0].text for hypotheses in lists] == translator.translate(sentences[:4], prefixes=[prefix] * 4)
    # An empty source with a prefix is decoded from EOS alone: its output starts with the prefix.
    assert greedy.translate(["", ""], prefixes=["cats", ""])[0].startswith("cats")


@pytest.mark.parametrize(
    "prefixes, error, message",
    [
        ([], ValueError, r"one prefix per sentence .*: 2 sentences, but received 0 prefixes"),
        (["birds"], ValueError, r"2 sentences, but received 1 prefixes"),
        ("birds", TypeError, r"`prefixes` must be a list of str, not a single str"),
        (["birds", None], TypeError, r"Every prefix must be a str. Received: NoneType \(None\) at index 1"),
        (["", "birds see " * 4], ValueError, r"Prefix 1 has \d+ tokens, but sentence 1's output limit is \d+ tokens"),
    ],
    ids=["empty_list", "one_short", "lone_str", "none_item", "too_long"],
)
def test_bad_prefixes_are_refused_before_decoding(greedy, sentences, prefixes, error, message):
    with pytest.raises(error, match=message):
        greedy.translate(sentences[:2], prefixes=prefixes)


def test_a_prefix_over_the_output_limit_names_both_lengths(greedy, sentences):
    ids = greedy.tokenizer.encode([sentences[0]])[0]
    limit = min(len(ids) + 1 + MAX_EXTRA, MAX_LENGTH - 1)
    prefix = " ".join(["birds see cars"] * 6)
    length = len(greedy.tokenizer.encode([prefix])[0])
    assert length >= limit
    message = (
        rf"Prefix 0 has {length} tokens, but sentence 0's output limit is {limit} tokens "
        rf"\(its {len(ids) + 1} source tokens with EOS \+ max_extra={MAX_EXTRA}, at most max_length - 1 = 15\), "
        rf"EOS included: a prefix may have at most {limit - 1} tokens"
    )
    with pytest.raises(ValueError, match=message):
        greedy.translate(sentences[:1], prefixes=[prefix])


# ------------------------------------------------------------------ sampling
def test_seeded_sampling_repeats_exactly_and_top_k_1_is_greedy(translator, greedy, sentences):
    def sampler(**settings):
        return Translator(
            translator.model, translator.tokenizer, decoding="sample", max_extra=MAX_EXTRA,
            batch_size=BATCH_SIZE, jit_compile=False, **settings,
        )

    first = sampler(seed=11)
    calls = [first.translate(sentences, return_scores=True) for _ in range(2)]
    traces = first.decoder.trace_count
    again = sampler(seed=11)
    assert [again.translate(sentences, return_scores=True) for _ in range(2)] == calls
    assert calls[0][0] != calls[1][0]  # later calls draw afresh
    assert first.decoder.trace_count == traces  # new seeds reuse the program
    assert sampler(seed=12).translate(sentences) != calls[0][0]
    assert first.translate(sentences[:2], n_best=1)[0][0].text  # an n-best list of one
    top1, top1_scores = sampler(seed=11, top_k=1).translate(sentences, return_scores=True)
    expected, expected_scores = greedy.translate(sentences, return_scores=True)
    assert top1 == expected
    np.testing.assert_allclose(top1_scores, expected_scores, atol=1e-5)


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(decoding="sample", temperature=0.0), r"`temperature` must be a finite number > 0. Received: temperature=0.0"),
        (dict(decoding="sample", top_p=1.5), r"`top_p` must be a number in \(0, 1\]. Received: top_p=1.5"),
        (dict(decoding="sample", top_p=0.0), r"`top_p` must be a number in \(0, 1\]. Received: top_p=0.0"),
        (dict(decoding="sample", top_k=0), r"`top_k` must be a positive integer. Received: top_k=0"),
        (dict(decoding="sample", seed="7"), r"`seed` must be an integer or None. Received: seed='7'"),
        (dict(temperature=0.7), r"temperature=0.7: `temperature`, `top_k`, `top_p` and `seed` apply to decoding=\"sample\". Received: decoding='beam'"),
        (dict(decoding="nucleus"), r"`decoding` must be one of \('beam', 'greedy', 'sample'\). Received: decoding='nucleus'"),
    ],
    ids=["temperature_zero", "top_p_above_1", "top_p_zero", "top_k_zero", "seed_str", "sampling_for_beam", "unknown_decoding"],
)
def test_bad_decoding_settings_are_refused_naming_them(translator, settings, message):
    with pytest.raises(ValueError, match=message):
        Translator(translator.model, translator.tokenizer, **settings)


# ------------------------------------------------------------------ presets
def test_from_preset_builds_a_translator_from_what_load_preset_returns(translator, monkeypatch, sentences):
    """`from_preset` hands the handle to `presets.load_preset` and its settings to the constructor."""
    import sys
    import types

    handles = []

    def load_preset(handle):
        handles.append(handle)
        return translator.model, translator.tokenizer

    monkeypatch.setitem(sys.modules, "keras_transformer.presets", types.SimpleNamespace(load_preset=load_preset))
    loaded = Translator.from_preset("presets/tiny", beam_size=BEAM_SIZE, max_extra=MAX_EXTRA, batch_size=BATCH_SIZE, jit_compile=False)
    assert handles == ["presets/tiny"]
    assert loaded.model is translator.model and loaded.beam_size == BEAM_SIZE and loaded.max_extra == MAX_EXTRA
    assert loaded.translate(sentences[:2]) == translator.translate(sentences[:2])


def test_from_preset_loads_a_saved_preset_that_translates_as_its_model_directory(translator, model_dir, tmp_path, sentences):
    presets = pytest.importorskip("keras_transformer.presets", reason="the preset module is another change's")
    preset = presets.save_preset(model_dir, tmp_path / "preset")
    loaded = Translator.from_preset(preset, beam_size=BEAM_SIZE, max_extra=MAX_EXTRA, batch_size=BATCH_SIZE, jit_compile=False)
    assert loaded.translate(sentences[:4]) == translator.translate(sentences[:4])
