"""The catalogue of bad inputs: one case per row, each with its expected outcome.

docs/errors_and_limits.md lists the same rows (the README links to it, never copies it), and
the rows of the sibling files (test_faults, test_properties, test_concurrency,
test_determinism, test_safe_loading, and the validation tests of each module); the
last tests here keep that table and the tests in step, both ways.
"""

import ast
import os
import re
import shutil
import warnings

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy
from tiny_reliability import greedy_translator, tiny_dir  # noqa: F401  (session fixtures)
from tiny_translation import tiny_sentences

import keras_transformer as kt
from keras_transformer.model.directory import MODEL_FILE

GOOD = np.array([[4, 5, 6, 3]], "int32")
# 100 made-up pairs: each sentence and its words reversed.
TINY_PAIRS = [(sentence, " ".join(reversed(sentence.split()))) for sentence in tiny_sentences()]


@pytest.fixture(scope="module")
def model():
    return kt.build_transformer(tiny_config())


# ---------------------------------------------------------------- model inputs
@pytest.mark.parametrize(
    "encoder, message",
    [
        (np.array([[4, 5, 32]], "int32"), r"holds token id 32 at position \(0, 2\), outside \[0, vocab_size=32\)"),
        (np.array([[4, -1, 6]], "int32"), r"holds token id -1 at position \(0, 1\), outside \[0, vocab_size=32\)"),
        (np.array([[4.0, 5.0, 6.0]], "float32"), "must hold integer token ids. Received: dtype=float32"),
        (np.array([4, 5, 6], "int32"), r"must have shape \[batch, length\]. Received: shape=\(3,\)"),
        (np.zeros((1, 2, 3), "int32"), r"must have shape \[batch, length\]. Received: shape=\(1, 2, 3\)"),
    ],
    ids=["id_too_large", "negative_id", "float_ids", "rank_1", "rank_3"],
)
def test_bad_model_inputs_raise_clear_errors(model, encoder, message):
    with pytest.raises(ValueError, match=message):
        model({"encoder_inputs": encoder, "decoder_inputs": GOOD})
    with pytest.raises(ValueError, match=message):
        model({"encoder_inputs": GOOD, "decoder_inputs": encoder})


def test_all_padding_batch_gives_finite_logits(model):
    padding = np.zeros((2, 5), "int32")
    logits = to_numpy(model({"encoder_inputs": padding, "decoder_inputs": padding}))
    assert np.all(np.isfinite(logits))
    # A real sentence next to an all-padding one is unaffected by it.
    mixed_encoder = np.stack([np.pad(GOOD[0], (0, 1)), padding[0]])
    mixed_decoder = np.stack([np.array([2, 7, 8, 9, 0], "int32"), padding[0]])
    mixed = to_numpy(model({"encoder_inputs": mixed_encoder, "decoder_inputs": mixed_decoder}))
    alone = to_numpy(model({"encoder_inputs": GOOD, "decoder_inputs": mixed_decoder[:1, :4]}))
    assert np.all(np.isfinite(mixed))
    np.testing.assert_allclose(mixed[0, :4], alone[0], atol=1e-5)


def test_all_padding_source_gives_finite_logits_and_gradients(model):
    """Cross-attention over no visible key yields zeros, never NaN, in the backward pass too."""
    model.compile(optimizer="sgd", loss=kt.LabelSmoothedCrossEntropy())
    inputs = {"encoder_inputs": np.zeros((2, 4), "int32"), "decoder_inputs": np.array([[2, 5, 6, 7]] * 2, "int32")}
    labels = np.array([[5, 6, 7, 3]] * 2, "int32")
    loss = float(model.train_on_batch(inputs, labels))
    assert np.isfinite(loss)
    assert all(np.all(np.isfinite(to_numpy(w))) for w in model.weights)


def test_check_token_ids_is_the_boundary_check():
    """Compiled calls (fit, predict) cannot inspect values; data and translation call this."""
    with pytest.raises(ValueError, match="outside"):
        kt.model.transformer.check_token_ids(np.array([[1, 99]]), vocab_size=32, name="encoder_inputs")
    kt.model.transformer.check_token_ids(np.array([[0, 31]]), vocab_size=32)  # the edges are valid


def _refusals(cases):
    """`pytest.param`s of `(make, error, message)` rows, each with its id (the table's)."""
    return [pytest.param(make, error, message, id=case_id) for case_id, make, error, message in cases]


# ---------------------------------------------------------------- model inputs, all backends
# The check runs on NumPy values (`check_token_ids`), whatever tensor type came in, so the
# message is the same string on every backend: these rows are literal strings, checked in
# all three backend sessions, for NumPy inputs and for the backend's own tensors. Keras
# puts a header ("Exception encountered when calling Transformer.call()") and the call's
# arguments, whose repr is the backend's, around it; with traceback filtering off
# (`keras.config.disable_traceback_filtering()`) the message is exactly the line.
SAME_ON_EVERY_BACKEND = [
    pytest.param(
        np.array([[4, 5, 32]], "int32"),
        "`{key}` holds token id 32 at position (0, 2), outside [0, vocab_size=32). "
        "Was the data tokenized with another vocabulary?",
        id="id_too_large",
    ),
    pytest.param(
        np.array([[4.0, 5.0, 6.0]], "float32"),
        "`{key}` must hold integer token ids. Received: dtype=float32. "
        "Tokenize text first; ids are never floats.",
        id="float_ids",
    ),
    pytest.param(
        np.array([4, 5, 6], "int32"),
        "`{key}` must have shape [batch, length]. Received: shape=(3,)",
        id="rank_1",
    ),
]


@pytest.mark.parametrize("bad, message", SAME_ON_EVERY_BACKEND)
def test_bad_model_input_messages_are_identical_on_every_backend(model, bad, message):
    # NumPy, then this backend's tensors (Keras refuses a dict that mixes the two).
    for value, good in ((bad, GOOD), (keras.ops.convert_to_tensor(bad), keras.ops.convert_to_tensor(GOOD))):
        for key, other in (("encoder_inputs", "decoder_inputs"), ("decoder_inputs", "encoder_inputs")):
            with pytest.raises(ValueError) as raised:
                model({key: value, other: good})
            assert message.format(key=key) in str(raised.value)
            filtering = keras.config.is_traceback_filtering_enabled()
            keras.config.disable_traceback_filtering()
            try:
                with pytest.raises(ValueError) as raised:
                    model({key: value, other: good})
            finally:
                if filtering:
                    keras.config.enable_traceback_filtering()
            assert str(raised.value) == message.format(key=key)


def test_out_of_range_id_inside_predict_is_the_backends_own_outcome(model):
    """A documented limit: compiled calls cannot check values, so each backend does its own thing.

    PyTorch runs `predict` eagerly, so the check runs there too; TensorFlow's gather
    raises on CPU; JAX's gather fills out-of-range rows with NaN, silently.
    """
    inputs = {"encoder_inputs": np.array([[4, 40, 5]], "int32"), "decoder_inputs": np.array([[2, 4, 5]], "int32")}
    backend = keras.backend.backend()
    if backend == "jax":
        assert np.isnan(model.predict(inputs, verbose=0)).all()
    else:
        error = ValueError if backend == "torch" else Exception  # tf.errors.InvalidArgumentError
        message = "holds token id 40" if backend == "torch" else r"indices\[0,1\] = 40 is not in \[0, 32\)"
        with pytest.raises(error, match=message):
            model.predict(inputs, verbose=0)


# ---------------------------------------------------------------- configuration
CONFIG_CASES = _refusals(
    [
        ("dropout_negative", lambda: tiny_config(dropout=-0.1), ValueError,
         r"`dropout` must be a number in \[0, 1\). Received: dropout=-0.1"),
        ("attention_dropout_above_1", lambda: tiny_config(attention_dropout=1.5), ValueError,
         r"`attention_dropout` must be a number in \[0, 1\). Received: attention_dropout=1.5"),
        ("warmup_negative", lambda: kt.TrainingConfig(warmup_steps=-4000), ValueError,
         "`warmup_steps` must be a positive integer. Received: warmup_steps=-4000"),
        ("bool_for_int", lambda: tiny_config(num_heads=True), ValueError,
         r"`num_heads` must be of type int. Received: num_heads=True \(type bool\)"),
        ("float_for_int", lambda: tiny_config(vocab_size=32.0), ValueError,
         r"`vocab_size` must be of type int. Received: vocab_size=32.0 \(type float\)"),
        ("none_for_int", lambda: tiny_config(d_model=None), ValueError,
         r"`d_model` must be of type int. Received: d_model=None \(type NoneType\)"),
        ("replace_unknown_key", lambda: tiny_config().replace(heads=2), ValueError,
         r"Unknown TransformerConfig field\(s\): \['heads'\]"),
        ("from_dict_not_a_dict", lambda: kt.TransformerConfig.from_dict([("d_model", 8)]), ValueError,
         "Expected a dict of config values. Received: list"),
        ("unknown_preset", lambda: kt.TransformerConfig.from_preset("huge"), ValueError,
         r"Unknown preset 'huge'. Expected one of \['base', 'big', 'small', 'tiny'\]"),
    ]
)


@pytest.mark.parametrize("make, error, message", CONFIG_CASES)
def test_bad_config_values_raise_naming_the_field(make, error, message):
    with pytest.raises(error, match=message):
        make()


# A run config (TOML) whose [model] table is a valid tiny model; each row changes one line.
RUN_TOML = """\
name = "bad"
preset = "tiny"
epochs = 1
{top}
[model]
d_model = 16
num_heads = 2
{model}
"""

RUN_CONFIG_CASES = [
    pytest.param({"model": "dropout = 1.5"}, (),
                 r"bad.toml: \[model\]: `dropout` must be a number in \[0, 1\). Received: dropout=1.5", id="toml_dropout_1_5"),
    pytest.param({"model": "dropout = -0.1"}, (),
                 r"bad.toml: \[model\]: `dropout` must be a number in \[0, 1\). Received: dropout=-0.1", id="toml_dropout_negative"),
    pytest.param({"model": "[training]\nwarmup_steps = 0"}, (),
                 r"bad.toml: \[training\]: `warmup_steps` must be a positive integer. Received: warmup_steps=0",
                 id="toml_warmup_0"),
    pytest.param({"top": 'epochs_ = 2'}, (),
                 r"bad.toml: Unknown run config key\(s\): \['epochs_'\]", id="toml_unknown_key"),
    pytest.param({"model": "heads = 2"}, (),
                 r"bad.toml: \[model\]: Unknown TransformerConfig field\(s\): \['heads'\]", id="toml_unknown_model_key"),
    pytest.param({"top": 'vocab_size = "8000"'}, (),
                 r"bad.toml: `vocab_size` must be of type int. Received: vocab_size='8000' \(type str\)",
                 id="toml_string_for_int"),
    pytest.param({"top": "vocab_size = true"}, (),
                 r"bad.toml: `vocab_size` must be of type int. Received: vocab_size=True \(type bool\)",
                 id="toml_bool_for_int"),
    pytest.param({"model": "d_ff = 32.0"}, (),
                 r"bad.toml: \[model\]: `d_ff` must be of type int. Received: d_ff=32.0 \(type float\)",
                 id="toml_float_for_int"),
    pytest.param({"top": "epochs = "}, (), r"bad.toml is not valid TOML: ", id="toml_syntax_error"),
    pytest.param({}, ("model.dropout=-0.1",),
                 r"\[model\]: `dropout` must be a number in \[0, 1\). Received: dropout=-0.1", id="set_dropout_negative"),
    pytest.param({}, ("training.warmup_steps=0",),
                 r"\[training\]: `warmup_steps` must be a positive integer. Received: warmup_steps=0", id="set_warmup_0"),
    pytest.param({}, ("model.num_heads=two",),
                 "`model.num_heads` must be an integer. Received: 'two'", id="set_wrong_type"),
]


@pytest.mark.parametrize("lines, overrides, message", RUN_CONFIG_CASES)
def test_bad_run_config_toml_raises_naming_the_file_and_field(tmp_path, lines, overrides, message):
    from keras_transformer.train.run_config import RunConfig

    path = tmp_path / "bad.toml"
    path.write_text(RUN_TOML.format(top=lines.get("top", ""), model=lines.get("model", "")))
    with pytest.raises(ValueError, match=message):
        RunConfig.from_toml(path, overrides)


# ---------------------------------------------------------------- data
def _make_dataset(pairs, **options):
    from keras_transformer.data.pipeline import make_dataset

    return make_dataset(pairs, _tokenizer(), **{"max_length": 16, "tokens_per_batch": 64, **options})


def _tokenizer():
    from keras_transformer.data.tokenizer import train_tokenizer

    if "tokenizer" not in _TOKENIZER:
        _TOKENIZER["tokenizer"] = train_tokenizer(tiny_sentences(), vocab_size=48, model_type="bpe")
    return _TOKENIZER["tokenizer"]


_TOKENIZER = {}


def _empty_dataset():
    import tensorflow as tf

    empty = tf.constant([], tf.string)
    return tf.data.Dataset.from_tensor_slices((empty, empty))


DATA_CASES = _refusals(
    [
        ("empty_list", lambda: _make_dataset([]), ValueError,
         r"`pairs` is empty: there are no sentence pairs to batch"),
        ("empty_dataset", lambda: _make_dataset(_empty_dataset()), ValueError,
         r"`pairs` is empty: there are no sentence pairs to batch"),
        ("all_pairs_over_max_length", lambda: _make_dataset(TINY_PAIRS, max_length=4, tokens_per_batch=8),
         ValueError, r"No pair fits max_length=4: all 100 pairs are longer. Raise max_length or use "
         r"overlong='truncate'"),
        ("bytes_pair", lambda: _make_dataset([(b"cats see cars", "Katzen")]), ValueError,
         r"`pairs` must be \(source, target\) pairs of str. Received: \(b'cats see cars', 'Katzen'\) "
         r"at index 0"),
        ("none_in_pair", lambda: _make_dataset([("cats", "Katzen"), ("dogs", None)]), ValueError,
         r"Received: \('dogs', None\) at index 1"),
    ]
)


@pytest.mark.parametrize("make, error, message", DATA_CASES)
def test_bad_corpora_raise_before_any_batch(make, error, message):
    with pytest.raises(error, match=message):
        make()


def test_all_pairs_over_max_length_fit_with_truncation():
    """The remedy the error names works: the same corpus, truncated, gives every pair."""
    _, stats = _make_dataset(TINY_PAIRS, max_length=4, tokens_per_batch=8, overlong="truncate")
    assert (stats.total, stats.kept, stats.truncated, stats.dropped) == (100, 100, 100, 0)


# ---------------------------------------------------------------- tokenizer and model directory
def _model_dir_with(tmp_path, tiny_dir, tokenizer):
    directory = tmp_path / "model"
    directory.mkdir()
    shutil.copy(tiny_dir / MODEL_FILE, directory / MODEL_FILE)
    if tokenizer is not None:
        tokenizer.save(str(directory))
    return directory


def test_tokenizer_of_another_vocabulary_in_the_model_directory_is_refused(tmp_path, tiny_dir):
    from keras_transformer.data.tokenizer import train_tokenizer
    from keras_transformer.inference.translator import Translator
    from keras_transformer.model.directory import load_model_and_tokenizer

    directory = _model_dir_with(tmp_path, tiny_dir, train_tokenizer(tiny_sentences(), vocab_size=32))
    message = r"tokenizer's vocab_size \(32\) differs from the model's config.vocab_size \(48\)"
    with pytest.raises(ValueError, match=message):
        Translator(directory)
    with pytest.raises(ValueError, match=message):  # a tokenizer path given with the directory
        load_model_and_tokenizer(tiny_dir, tokenizer=str(directory / "tokenizer.model"))


def test_model_directory_without_its_tokenizer_is_refused(tmp_path, tiny_dir):
    from keras_transformer.inference.translator import Translator

    directory = _model_dir_with(tmp_path, tiny_dir, None)
    with pytest.raises(FileNotFoundError, match=r"No tokenizer model file at .*model/tokenizer.model"):
        Translator(directory)


# ---------------------------------------------------------------- translation
def _decoded_alone(translator, text):
    """What the translator's decoder makes of `text` cut to fit, alone in a batch of one."""
    from keras_transformer.special_tokens import EOS_ID
    from keras_transformer.inference.translator import pad_batch

    ids = translator.tokenizer.encode([text])[0][: translator.max_source_tokens]
    tokens, _ = translator.decoder(pad_batch([ids + [EOS_ID]], translator.model.config.max_length, 1))
    return translator.tokenizer.decode(to_numpy(tokens))[0]


def test_ten_thousand_character_input_is_truncated_with_a_warning(greedy_translator):
    text = ("cats see houses " * 700)[:10_000]
    tokens = len(greedy_translator.tokenizer.encode([text])[0])
    assert len(text) == 10_000 and tokens > 1000
    warning = rf"Input 0 has {tokens} tokens, more than the model's maximum source length of 15"
    with pytest.warns(UserWarning, match=warning):
        translations = greedy_translator.translate([text])
    assert translations == [_decoded_alone(greedy_translator, text)]
    assert isinstance(translations[0], str)


@pytest.mark.parametrize(
    "text",
    ["cats 🐈 see 家 houses Ωμέγα", "🐈🙂", "Ωμέγα ∑ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢", "cats\x00see\u200bcars"],
    ids=["emoji_and_scripts_in_a_sentence", "emoji_only", "greek_math_fraktur", "control_and_zero_width"],
)
def test_characters_outside_the_vocabulary_translate_without_error(greedy_translator, text):
    from keras_transformer.special_tokens import UNK_ID

    tokenizer = greedy_translator.tokenizer
    if text.isprintable():  # every row but the last has characters the tiny corpus never saw
        assert UNK_ID in tokenizer.encode([text])[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # short inputs: no truncation warning either
        translations = greedy_translator.translate([text, "cats see cars"])
    assert translations[0] == _decoded_alone(greedy_translator, text)
    assert all(isinstance(t, str) for t in translations)


# ---------------------------------------------------------------- the table stays in step
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TABLE = os.path.join(ROOT, "docs", "errors_and_limits.md")


def _table_test_ids():
    with open(TABLE, encoding="utf-8") as file:
        return re.findall(r"`(tests/test_\w+\.py::test_\w+(?:\[[^\]`]+\])?)`", file.read())


def test_errors_and_limits_table_names_only_existing_tests():
    """Every test the docs table cites exists, with its parameter id, in the file it names."""
    cited = _table_test_ids()
    assert len(cited) > 50
    for test_id in cited:
        path, name = test_id.split("::")
        function, _, case = name.partition("[")
        with open(os.path.join(ROOT, path), encoding="utf-8") as file:
            source = file.read()
        assert f"def {function}(" in source, test_id
        if case:
            assert f'"{case.rstrip("]")}"' in source, test_id


def _catalogue_ids_here():
    """`tests/test_bad_inputs.py::name[case]` for each test function and case of this file."""
    test_ids = []
    for name, function in sorted(globals().items()):
        if not (name.startswith("test_") and callable(function)) or "table" in name:
            continue
        marks = [mark for mark in getattr(function, "pytestmark", []) if mark.name == "parametrize"]
        cases = [param.id for mark in marks for param in mark.args[1] if getattr(param, "id", None)]
        cases += [case for mark in marks for case in mark.kwargs.get("ids", ())]
        test_ids += [f"tests/test_bad_inputs.py::{name}[{case}]" for case in cases] or [
            f"tests/test_bad_inputs.py::{name}"
        ]
    return test_ids


def _catalogue_ids_in(filename):
    """The same for a sibling reliability file, read with `ast` (its cases are literals)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), filename)
    with open(path, encoding="utf-8") as file:
        tree = ast.parse(file.read())
    test_ids = []
    for node in tree.body:
        if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
            continue
        cases = [
            element.value
            for decorator in node.decorator_list
            if isinstance(decorator, ast.Call) and ast.unparse(decorator.func) == "pytest.mark.parametrize"
            and isinstance(decorator.args[1], ast.List)
            for element in decorator.args[1].elts
            if isinstance(element, ast.Constant) and isinstance(element.value, str)
        ]
        test_ids += [f"tests/{filename}::{node.name}[{case}]" for case in cases] or [
            f"tests/{filename}::{node.name}"
        ]
    return test_ids


RELIABILITY_FILES = (
    "test_faults.py",
    "test_properties.py",
    "test_concurrency.py",
    "test_determinism.py",
    "test_safe_loading.py",
)


def test_every_catalogue_case_has_a_row_in_the_table():
    """The reverse: each case of this file and of the reliability files is cited."""
    cited = set(_table_test_ids())
    expected = _catalogue_ids_here() + [test_id for name in RELIABILITY_FILES for test_id in _catalogue_ids_in(name)]
    missing = [test_id for test_id in expected if test_id not in cited]
    assert not missing, f"not in docs/errors_and_limits.md: {missing}"
    assert len(expected) > 60
