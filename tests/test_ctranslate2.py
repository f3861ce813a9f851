"""CTranslate2: the export carries the model over exactly, and translates as ours does.

The model is trained here for a few seconds to reverse the word order of the 100 tiny
sentences of tiny_translation (its outputs end with EOS, as a real model's do, where
random weights run to the length limit). The export is read by CTranslate2 in C++,
so every test runs on each Keras backend: the converter reads the weights as NumPy.
"""

import json
import os
import pathlib
import sys

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy
from test_quantization import quantize_int8
from tiny_translation import MAX_LENGTH, VOCAB_SIZE, tiny_sentences

import keras_transformer as kt
from keras_transformer.inference import decoding
from keras_transformer.inference.ctranslate2_export import SETTINGS_FILE, export_ctranslate2
from keras_transformer.inference.translator import Translator
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID

ctranslate2 = pytest.importorskip("ctranslate2", reason="the ctranslate2 extra is not installed")

MAX_EXTRA = 4
TRAIN_EPOCHS = 20  # 80 steps: every training sentence reversed exactly (greedy)


def _reversed(sentence):
    return " ".join(reversed(sentence.split()))


def _padded(rows, width, start=None, end=None):
    batch = np.zeros((len(rows), width), "int32")
    for i, ids in enumerate(rows):
        ids = ([start] if start is not None else []) + list(ids) + ([end] if end is not None else [])
        batch[i, : len(ids)] = ids
    return batch


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A model directory whose model reverses the words of tiny sentences."""
    directory = tmp_path_factory.mktemp("ct2_trained")
    tokenizer = kt.train_tokenizer(tiny_sentences(), vocab_size=VOCAB_SIZE, model_type="bpe")
    sources = tokenizer.encode(tiny_sentences())
    targets = tokenizer.encode([_reversed(s) for s in tiny_sentences()])
    keras.utils.set_random_seed(0)
    model = kt.Transformer(tiny_config(vocab_size=VOCAB_SIZE, max_length=MAX_LENGTH, d_model=32, d_ff=64))
    model.compile(
        optimizer=keras.optimizers.Adam(5e-3),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        # jax.jit on JAX (eager JAX is slow); TensorFlow's XLA compile costs more than it saves here.
        jit_compile=keras.backend.backend() == "jax",
    )
    labels = _padded(targets, MAX_LENGTH, end=EOS_ID)
    inputs = {
        "encoder_inputs": _padded(sources, MAX_LENGTH, end=EOS_ID),
        "decoder_inputs": _padded(targets, MAX_LENGTH, start=BOS_ID),
    }
    # The epochs as one pass over repeated data: Keras' per-epoch overhead is most of the cost.
    repeat = lambda x: np.tile(x, (TRAIN_EPOCHS, 1))  # noqa: E731
    inputs = {key: repeat(value) for key, value in inputs.items()}
    labels = repeat(labels)
    model.fit(inputs, labels, sample_weight=(labels > 0).astype("float32"), batch_size=25, shuffle=False, verbose=0)
    model.save(str(directory / "model.keras"))
    tokenizer.save(str(directory))
    return directory


@pytest.fixture(scope="module")
def ct2_dir(trained_dir, tmp_path_factory):
    return export_ctranslate2(trained_dir, tmp_path_factory.mktemp("ct2") / "float32")


@pytest.fixture(scope="module")
def keras_beam(trained_dir):
    """Our beam-4 translations (alpha 0.6) of every tiny sentence, and the translator."""
    translator = Translator(trained_dir, beam_size=4, length_penalty=0.6, max_extra=MAX_EXTRA, batch_size=128, jit_compile=False)
    return translator, translator.translate(tiny_sentences(), return_scores=True)


def test_export_writes_ctranslate2_files_our_vocabulary_and_settings(trained_dir, ct2_dir):
    ct2_dir = pathlib.Path(ct2_dir)
    assert {"model.bin", "config.json", "shared_vocabulary.json", "tokenizer.model", SETTINGS_FILE} <= {
        path.name for path in ct2_dir.iterdir()
    }
    vocabulary = json.loads((ct2_dir / "shared_vocabulary.json").read_text())
    tokenizer = kt.SubwordTokenizer.load(trained_dir)
    assert vocabulary == [tokenizer.id_to_piece(i) for i in range(VOCAB_SIZE)]
    assert vocabulary[PAD_ID : EOS_ID + 1] == ["<pad>", "<unk>", "<s>", "</s>"]
    config = json.loads((ct2_dir / "config.json").read_text())
    assert (config["add_source_eos"], config["decoder_start_token"], config["eos_token"]) == (True, "<s>", "</s>")
    settings = json.loads((ct2_dir / SETTINGS_FILE).read_text())
    assert (settings["max_length"], settings["tokenizer_sha256"]) == (MAX_LENGTH, tokenizer.fingerprint)


def test_greedy_output_ids_and_scores_equal_ours(trained_dir, ct2_dir):
    model = keras.saving.load_model(str(trained_dir / "model.keras"))
    tokenizer = kt.SubwordTokenizer.load(trained_dir)
    sources = tokenizer.encode(tiny_sentences())
    ours, our_scores = decoding.greedy_decode(model, _padded(sources, MAX_LENGTH, end=EOS_ID), max_extra=MAX_EXTRA)
    ours, our_scores = to_numpy(ours), to_numpy(our_scores)
    theirs = kt.CTranslate2Translator(ct2_dir, beam_size=1, max_extra=MAX_EXTRA).translate_ids(sources)
    for row, (ids, score) in enumerate(theirs):
        expected = [int(t) for t in ours[row] if t not in (PAD_ID, EOS_ID)]
        assert ids == expected, row
        # CTranslate2 renormalizes after removing PAD and BOS; ours does not: a hair apart.
        assert score == pytest.approx(float(our_scores[row]), abs=2e-3 * len(ids) + 1e-3)
    # The task was learned: outputs end with EOS, not at the limit.
    assert np.mean([ids == t for (ids, _), t in zip(theirs, tokenizer.encode([_reversed(s) for s in tiny_sentences()]))]) == 1.0


def test_beam_4_with_alpha_06_gives_our_best_hypotheses(ct2_dir, keras_beam):
    _, (ours, our_scores) = keras_beam
    translator = kt.CTranslate2Translator(ct2_dir, beam_size=4, length_penalty=0.6, max_extra=MAX_EXTRA)
    theirs, their_scores = translator.translate(tiny_sentences(), return_scores=True)
    assert theirs == ours
    # Close, not equal: CTranslate2 renormalizes over the tokens left after PAD and BOS
    # are removed, so its log-probabilities are a little higher (measured: at most 3%).
    np.testing.assert_allclose(their_scores, our_scores, rtol=0.05)
    assert all(a >= b for a, b in zip(their_scores, our_scores))


@pytest.mark.parametrize("alpha", [0.6, 2.0])
def test_our_early_stopping_gives_ctranslate2s_translations(ct2_dir, trained_dir, alpha):
    """CTranslate2's only stopping rule is `early_stopping=True`'s; our default is exact."""
    ours = Translator(
        trained_dir, beam_size=4, length_penalty=alpha, max_extra=MAX_EXTRA, batch_size=128, jit_compile=False,
        early_stopping=True,
    )
    theirs = kt.CTranslate2Translator(ct2_dir, beam_size=4, length_penalty=alpha, max_extra=MAX_EXTRA, early_stopping=True)
    assert ours.translate(tiny_sentences()) == theirs.translate(tiny_sentences())
    with pytest.raises(ValueError, match=r"no rule that searches on.*Received: early_stopping=False"):
        kt.CTranslate2Translator(ct2_dir, early_stopping=False)


def test_int8_translations_mostly_equal_float(ct2_dir, trained_dir, keras_beam, tmp_path):
    _, (ours, _) = keras_beam
    int8_dir = export_ctranslate2(trained_dir, tmp_path / "int8", quantization="int8")
    int8 = kt.CTranslate2Translator(int8_dir, beam_size=4, max_extra=MAX_EXTRA).translate(tiny_sentences())
    # Measured: 100 of 100 equal on TensorFlow, JAX and PyTorch; the margin allows
    # another CPU's int8 kernels to round a close call the other way.
    assert np.mean([a == b for a, b in zip(int8, ours)]) >= 0.9
    # compute_type quantizes a float32 export at load time, to the same translations.
    loaded = kt.CTranslate2Translator(ct2_dir, beam_size=4, max_extra=MAX_EXTRA, compute_type="int8")
    assert loaded.translate(tiny_sentences()) == int8


def test_a_model_directory_is_converted_on_the_fly_and_cleaned_up(trained_dir, keras_beam):
    _, (ours, _) = keras_beam
    with kt.CTranslate2Translator(trained_dir, max_extra=MAX_EXTRA) as translator:
        temporary = translator.model_dir
        assert translator.translate(tiny_sentences()[:10] + ["", "  "]) == ours[:10] + ["", ""]
    assert not os.path.exists(temporary)


def test_translate_keeps_the_translator_contract(ct2_dir):
    translator = kt.CTranslate2Translator(ct2_dir, beam_size=1, max_extra=MAX_EXTRA)
    with pytest.raises(TypeError, match="not a single str"):
        translator.translate("cats see trees")
    with pytest.raises(TypeError, match="at index 1"):
        translator.translate(["cats see trees", 3])
    with pytest.warns(UserWarning, match="truncated to its first 15 tokens"):
        (long,) = translator.translate([" ".join(["cats see trees"] * 10)])
    assert isinstance(long, str)


def _assert_ctranslate2_log_probs_equal(reference, path, tokenizer):
    """CTranslate2's per-token log-probabilities of reversed tiny sentences equal `reference`'s."""
    sources = tokenizer.encode(tiny_sentences()[:4])
    targets = tokenizer.encode([_reversed(s) for s in tiny_sentences()[:4]])
    pieces = lambda rows: [[tokenizer.id_to_piece(i) for i in ids] for ids in rows]  # noqa: E731
    scored = ctranslate2.Translator(str(path)).score_batch(pieces(sources), pieces(targets))
    logits = reference(
        {
            "encoder_inputs": _padded(sources, MAX_LENGTH, end=EOS_ID),
            "decoder_inputs": _padded(targets, MAX_LENGTH, start=BOS_ID),
        }
    )
    log_probs = to_numpy(keras.ops.log_softmax(logits, axis=-1))
    for row, (ids, result) in enumerate(zip(targets, scored)):
        expected = [log_probs[row, t, token] for t, token in enumerate(ids + [EOS_ID])]
        np.testing.assert_allclose(result.log_probs, expected, atol=1e-4)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {"norm_first": True, "share_embeddings": False, "position_encoding": "learned"},
        {"gated_ffn": True, "activation": "swish"},
    ],
    ids=["post-norm tied sinusoidal", "pre-norm untied learned", "gated swish FFN"],
)
def test_ctranslate2_log_probabilities_equal_the_model_teacher_forced(overrides, tmp_path):
    """Every architecture option reaches CTranslate2 exactly: per-token log-probs agree."""
    tokenizer = kt.train_tokenizer(tiny_sentences(), vocab_size=VOCAB_SIZE, model_type="bpe")
    model = kt.Transformer(tiny_config(vocab_size=VOCAB_SIZE, max_length=MAX_LENGTH, **overrides))
    # Nonzero layer-norm offsets and biases, so a misplaced one shows.
    for weight in model.weights:
        if weight.path.endswith(("beta", "bias")):
            weight.assign(keras.random.normal(weight.shape, stddev=0.1, seed=1))
    path = export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    _assert_ctranslate2_log_probs_equal(model, path, tokenizer)


def test_a_keras_int8_model_exports_its_dequantized_kernels(tmp_path, monkeypatch):
    tokenizer = kt.train_tokenizer(tiny_sentences(), vocab_size=VOCAB_SIZE, model_type="bpe")
    model = quantize_int8(kt.Transformer(tiny_config(vocab_size=VOCAB_SIZE, max_length=MAX_LENGTH)), monkeypatch)
    path = export_ctranslate2(model, tmp_path / "ct2", tokenizer=tokenizer)
    # The reference: a float model holding each int8 kernel divided by its scale.
    reference = kt.Transformer(model.config)
    values = {weight.path: to_numpy(weight) for weight in model.weights}
    for weight in reference.weights:
        layer = weight.path.rsplit("/", 1)[0]
        value = values[weight.path]
        if f"{layer}/kernel_scale" in values:
            value = value.astype("float32") / values[f"{layer}/kernel_scale"]
        weight.assign(value)
    _assert_ctranslate2_log_probs_equal(reference, path, tokenizer)


def test_bad_quantization_is_refused_naming_the_choices(trained_dir, tmp_path):
    with pytest.raises(ValueError, match=r"`quantization` must be one of \(None, 'int8', 'int8_float32', 'float16'\)\. Received: quantization='int4'"):
        export_ctranslate2(trained_dir, tmp_path / "out", quantization="int4")
    assert not (tmp_path / "out").exists()


def test_an_existing_output_directory_is_kept_unless_overwrite(trained_dir, tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(FileExistsError, match="overwrite=True"):
        export_ctranslate2(trained_dir, tmp_path / "out")


def test_missing_ctranslate2_raises_an_import_error_naming_the_extra(trained_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` now fails
    with pytest.raises(ImportError, match=r"pip install keras-transformer\[ctranslate2\]"):
        export_ctranslate2(trained_dir, tmp_path / "out")
    with pytest.raises(ImportError, match=r"pip install keras-transformer\[ctranslate2\]"):
        kt.CTranslate2Translator(trained_dir)


def test_kt_export_format_ctranslate2_writes_and_checks(trained_dir, tmp_path, capsys):
    from keras_transformer.cli import export as export_command

    out = tmp_path / "cli_ct2"
    argv = ["--model-dir", str(trained_dir), "--format", "ctranslate2", "--quantization", "int8"]
    search = ["--beam-size", "4", "--length-penalty", "0.6", "--max-extra", str(MAX_EXTRA)]
    assert export_command.main(argv + search + ["--output-dir", str(out), "--check", "cats see trees"]) == 0
    printed = capsys.readouterr().out
    assert f"CTranslate2 model written to {out}" in printed
    # --check prints what the int8 export itself translates (int8 rounding of a model trained
    # for seconds may change a word, so the line is compared with the export, not the float model).
    [target], [score] = kt.CTranslate2Translator(out, beam_size=4, length_penalty=0.6, max_extra=MAX_EXTRA).translate(
        ["cats see trees"], return_scores=True
    )
    assert f"  'cats see trees' -> {target!r} ({score:.3f})" in printed
    assert json.loads((out / SETTINGS_FILE).read_text())["quantization"] == "int8"
    with pytest.raises(SystemExit):
        export_command.main(argv)  # no --output-dir
    assert "--format ctranslate2 needs --output-dir" in capsys.readouterr().err
