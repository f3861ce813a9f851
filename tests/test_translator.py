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
from keras_transformer.inference.translator import Translator, pad_batch


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
