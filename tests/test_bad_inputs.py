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
from conftest import once_on, tiny_config, to_numpy
from tiny_reliability import greedy_export, greedy_translator, tiny_dir  # noqa: F401  (session fixtures)
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


@pytest.mark.parametrize("bad_id", [40, -1], ids=["id_too_large", "negative_id"])
def test_out_of_range_id_inside_predict_gives_nan_logits(model, bad_id):
    """Compiled calls cannot check values: the embedding makes a bad id NaN, on every backend.

    Left to the backends, a negative id would wrap around to the end of the embedding
    table (a finite, wrong answer) and a too-large one would raise on TensorFlow's CPU,
    read zeros on its GPU and give NaN on JAX. PyTorch runs `predict` eagerly, so the
    model's own check raises there.
    """
    inputs = {
        "encoder_inputs": np.array([[4, bad_id, 5], [4, 6, 5]], "int32"),
        "decoder_inputs": np.array([[2, 4, 5], [2, 4, 5]], "int32"),
    }
    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match=f"holds token id {bad_id} at position \\(0, 1\\)"):
            model.predict(inputs, verbose=0)
        return
    logits = model.predict(inputs, verbose=0)
    assert np.isnan(logits[0]).all()  # the bad id's sentence: NaN, loudly
    alone = model.predict({key: value[1:] for key, value in inputs.items()}, verbose=0)
    np.testing.assert_allclose(logits[1], alone[0], atol=1e-5)  # its neighbour: untouched


def _fit_three_batches(model, inputs, labels, as_dataset=False):
    """`fit` on three batches of two pairs, the 2nd batch holding the bad value; steps run."""
    model.compile(optimizer="sgd", loss=kt.LabelSmoothedCrossEntropy())
    data = {"x": inputs, "y": labels, "batch_size": 2, "shuffle": False}
    if as_dataset:  # batches made elsewhere: no array for `fit` to check up front
        batches = [({k: v[i : i + 2] for k, v in inputs.items()}, labels[i : i + 2]) for i in range(0, 6, 2)]
        data = {"x": keras.utils.PyDataset.__new__(_Batches).setup(batches)}
    model.fit(**data, epochs=1, verbose=0, callbacks=[keras.callbacks.TerminateOnNaN()])
    return int(to_numpy(model.optimizer.iterations))


class _Batches(keras.utils.PyDataset):
    def setup(self, batches):
        super().__init__()
        self.batches = batches
        return self

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        return self.batches[index]


def _pairs_with(bad, where):
    """Six training pairs; `bad` is put at (2, 1) of the encoder inputs or of the labels."""
    inputs = {
        "encoder_inputs": np.tile(np.array([[4, 5, 6, 3]], "int32"), (6, 1)),
        "decoder_inputs": np.tile(np.array([[2, 7, 8, 9]], "int32"), (6, 1)),
    }
    labels = np.tile(np.array([[7, 8, 9, 3]], "int32"), (6, 1))
    if where == "labels":
        labels[2, 1] = bad
    else:
        inputs[where][2, 1] = bad
    return inputs, labels


BAD_IDS_IN_FIT = pytest.mark.parametrize(
    "bad, where, message",
    [
        (-1, "encoder_inputs", r"`encoder_inputs` holds token id -1 at position \(2, 1\)"),
        (32, "labels", r"`y` holds id 32 at position \(2, 1\), outside \[0, vocab_size=32\) \(or ignore_id=0\)"),
        (-5, "labels", r"`y` holds id -5 at position \(2, 1\)"),
    ],
    ids=["negative_input_id", "label_too_large", "negative_label"],
)


@BAD_IDS_IN_FIT
def test_out_of_range_id_or_label_in_fit_arrays_is_named_before_the_first_step(bad, where, message):
    """Arrays given to `fit` are checked once, on the host, before any step, on every backend."""
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(tiny_config())
    inputs, labels = _pairs_with(bad, where)
    with pytest.raises(ValueError, match=message):
        _fit_three_batches(model, inputs, labels)
    assert int(to_numpy(model.optimizer.iterations)) == 0


@BAD_IDS_IN_FIT
def test_out_of_range_id_or_label_in_a_dataset_stops_the_run(bad, where, message):
    """Batches from a dataset are never read on the host inside the step (on PyTorch that
    would be a device-to-host copy a step): on every backend the bad batch's loss is NaN
    and `TerminateOnNaN` stops the run at it (the 2nd of 3), never a wrapped id or a
    finite wrong loss."""
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(tiny_config())
    inputs, labels = _pairs_with(bad, where)
    assert _fit_three_batches(model, inputs, labels, as_dataset=True) == 2


@pytest.mark.parametrize(
    "bad", [32, 40, -1, -5], ids=["label_equals_vocab_size", "label_too_large", "negative_label", "label_minus_5"]
)
def test_out_of_range_label_gives_nan_never_a_finite_loss(bad):
    """The traced path (`call`, as inside compiled `fit`): a NaN loss and NaN metrics,
    on every backend; an eager `__call__` raises, naming the label and its position."""
    from keras_transformer.train.metrics import MaskedAccuracy, Perplexity

    labels = np.array([[5, 6, 0], [7, bad, 0]], "int32")
    logits = np.random.default_rng(0).normal(size=(2, 3, 32)).astype("float32")
    loss = kt.LabelSmoothedCrossEntropy()
    per_token = to_numpy(loss.call(labels, logits))
    assert np.isnan(per_token[1, 1]) and np.isfinite(np.delete(per_token.ravel(), 4)).all()
    for metric in (MaskedAccuracy(), Perplexity()):
        metric.update_state(labels, logits)
        assert np.isnan(to_numpy(metric.result())), metric.name
    with pytest.raises(ValueError, match=rf"`y_true` holds id {bad} at position \(1, 1\), outside \[0, vocab_size=32\)"):
        loss(labels, logits)
    with pytest.raises(ValueError, match=rf"holds id {bad} at position"):  # the backend's own tensors too
        loss(keras.ops.convert_to_tensor(labels), keras.ops.convert_to_tensor(logits))


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


def _layers():
    from keras_transformer import layers

    return layers


NAN, INF = float("nan"), float("inf")

# Every float a layer, the loss or the translator takes is a finite number: NaN compares
# false with everything, so a range check alone would let it through.
ARGUMENT_CASES = _refusals(
    [
        ("layer_norm_epsilon_nan", lambda: _layers().EncoderBlock(2, 32, layer_norm_epsilon=NAN), ValueError,
         r"`layer_norm_epsilon` must be a finite number > 0. Received: layer_norm_epsilon=nan"),
        ("layer_norm_epsilon_inf", lambda: _layers().DecoderBlock(2, 32, layer_norm_epsilon=INF), ValueError,
         r"`layer_norm_epsilon` must be a finite number > 0. Received: layer_norm_epsilon=inf"),
        ("layer_norm_epsilon_zero", lambda: _layers().EncoderBlock(2, 32, layer_norm_epsilon=0.0), ValueError,
         r"`layer_norm_epsilon` must be a finite number > 0. Received: layer_norm_epsilon=0.0"),
        ("attention_dropout_nan", lambda: _layers().MultiHeadAttention(2, 8, dropout=NAN), ValueError,
         r"`dropout` must be a number in \[0, 1\). Received: dropout=nan"),
        ("feed_forward_dropout_inf", lambda: _layers().PositionwiseFeedForward(8, 32, dropout=INF), ValueError,
         r"`dropout` must be a number in \[0, 1\). Received: dropout=inf"),
        ("label_smoothing_nan", lambda: kt.LabelSmoothedCrossEntropy(label_smoothing=NAN), ValueError,
         r"`label_smoothing` must be a number in \[0, 1\). Received: label_smoothing=nan"),
        ("norm_first_int", lambda: _layers().EncoderBlock(2, 32, norm_first=1), ValueError,
         r"`norm_first` must be True or False. Received: norm_first=1"),
        ("use_bias_str", lambda: _layers().MultiHeadAttention(2, 8, use_bias="no"), ValueError,
         r"`use_bias` must be True or False. Received: use_bias='no'"),
        ("embedding_scale_str", lambda: _layers().TokenEmbedding(32, 8, scale="yes"), ValueError,
         r"`scale` must be True or False. Received: scale='yes'"),
        ("schedule_scale_nan", lambda: kt.TransformerSchedule(512, scale=NAN), ValueError,
         r"`scale` must be a finite number > 0. Received: scale=nan"),
    ]
)


@pytest.mark.parametrize("make, error, message", ARGUMENT_CASES)
def test_non_finite_or_mistyped_arguments_raise_naming_them(make, error, message):
    with pytest.raises(error, match=message):
        make()


@pytest.mark.parametrize("penalty", [NAN, INF, -INF], ids=["nan", "inf", "minus_inf"])
def test_non_finite_length_penalty_is_refused_by_translator_and_export(greedy_translator, penalty, tmp_path):
    from keras_transformer.inference.translator import Translator

    message = rf"`length_penalty` must be a finite number >= 0. Received: length_penalty={penalty}"
    with pytest.raises(ValueError, match=message):
        Translator(greedy_translator.model, greedy_translator.tokenizer, length_penalty=penalty)
    if keras.backend.backend() == "tensorflow":
        from keras_transformer.inference.export import export_saved_model

        with pytest.raises(ValueError, match=message):
            export_saved_model(greedy_translator.model, greedy_translator.tokenizer, base_dir=str(tmp_path),
                               length_penalty=penalty)
        assert not os.listdir(tmp_path)


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
def _make_dataset(pairs, tokenizer=None, **options):
    from keras_transformer.data.pipeline import make_dataset

    tokenizer = tokenizer or _tokenizer()
    return make_dataset(pairs, tokenizer, **{"max_length": 16, "tokens_per_batch": 64, **options})


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
        ("lone_surrogate_in_pair", lambda: _make_dataset([("cats", "Katzen"), ("dogs", "Hun\ud800de")]),
         ValueError, r"The target of the pair at index 1 is not valid Unicode: it holds the lone surrogate "
         r"'\\ud800' at character 3, which UTF-8 cannot encode"),
        ("tokenizer_larger_than_vocab_size", lambda: _make_dataset(TINY_PAIRS, vocab_size=40), ValueError,
         r"The tokenizer's vocab_size \(48\) is larger than vocab_size=40"),
        ("tokenizer_ids_out_of_range", lambda: _make_dataset(TINY_PAIRS, tokenizer=_ShiftedTokenizer()),
         ValueError, r"The tokenizer made token ids outside \[0, vocab_size=48\); no batch was made"),
    ]
)


class _ShiftedTokenizer:
    """A tokenizer of the pipeline's duck type whose ids run past its vocabulary."""

    vocab_size = 48

    def tokenize(self, text):
        return _tokenizer().tokenize(text) + self.vocab_size


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


@pytest.mark.parametrize(
    "text, position",
    [("cats\ud800 see cars", 4), ("\udcff", 0), ("cats see \ude00", 9)],
    ids=["lone_high_surrogate", "surrogateescape_byte", "lone_low_surrogate"],
)
def test_lone_surrogate_is_replaced_and_the_other_sentences_translate(greedy_translator, text, position):
    """Replaced by U+FFFD with a warning naming the input: one bad item never sinks the call."""
    from keras_transformer.data.tokenizer import replace_lone_surrogates

    sentences = ["cats see cars", text, "dogs like trees"]
    warning = rf"Input 1 is not valid Unicode: it holds the lone surrogate '\\ud[89a-f][0-9a-f]{{2}}' at character {position}"
    with pytest.warns(UserWarning, match=warning):
        translations = greedy_translator.translate(sentences)
    repaired = replace_lone_surrogates(text)
    assert "\ufffd" in repaired
    assert translations == greedy_translator.translate([sentences[0], repaired, sentences[2]])
    assert translations[0] == _decoded_alone(greedy_translator, sentences[0])


def test_tokenizer_encode_names_the_sentence_that_is_not_valid_unicode(greedy_translator):
    """The tokenizer itself refuses, naming the sentence, instead of sentencepiece's
    "List elements must be str or bytes" for the whole list."""
    message = r"Sentence 2 is not valid Unicode: it holds the lone surrogate '\\ud800' at character 1"
    with pytest.raises(ValueError, match=message):
        greedy_translator.tokenizer.encode(["cats", "dogs", "a\ud800b"])


# ---------------------------------------------------------------- SavedModel signatures
def _loaded_export(greedy_export):
    import tensorflow as tf

    if "loaded" not in _LOADED:
        _LOADED["loaded"] = tf.saved_model.load(greedy_export[1])
    return _LOADED["loaded"]


_LOADED = {}


@pytest.mark.parametrize(
    "signature, key, value, message",
    [
        ("serving_default", "text", [["cats see cars"]],
         r"`text` must be a vector \[batch\] of strings, one sentence each"),
        ("serving_default", "text", "cats see cars", r"`text` must be a vector \[batch\] of strings"),
        ("translate_ids", "encoder_inputs", [4, 5, 3], r"`encoder_inputs` must have shape \[batch, length\]"),
        ("translate_ids", "encoder_inputs", [[[4, 5, 3]]], r"`encoder_inputs` must have shape \[batch, length\]"),
        ("translate_ids", "encoder_inputs", [[4] * 16 + [3]],
         r"`encoder_inputs` is longer than max_length=16 \(at most 15 source ids and EOS\)"),
        ("translate_ids", "encoder_inputs", [[4, -1, 3]], r"`encoder_inputs` holds token ids outside \[0, vocab_size=48\)"),
        ("translate_ids", "encoder_inputs", [[4, 48, 3]], r"`encoder_inputs` holds token ids outside \[0, vocab_size=48\)"),
    ],
    ids=["text_rank_2", "text_scalar", "ids_rank_1", "ids_rank_3", "ids_over_max_length", "negative_id", "id_equals_vocab_size"],
)
def test_saved_model_signatures_check_rank_length_and_ids_in_the_graph(greedy_export, signature, key, value, message):
    """A server hands tensors over whatever shape a signature declares: the graph checks."""
    import tensorflow as tf

    function = _loaded_export(greedy_export).signatures[signature]
    dtype = tf.string if key == "text" else tf.int32
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        function(**{key: tf.constant(value, dtype)})


def test_saved_model_signature_refuses_another_dtype(greedy_export):
    """The dtype is TensorFlow's own check at the signature, before the graph runs."""
    import tensorflow as tf

    function = _loaded_export(greedy_export).signatures["translate_ids"]
    with pytest.raises(tf.errors.InvalidArgumentError, match="expected to be a int32 tensor but is a int64 tensor"):
        function(encoder_inputs=tf.constant([[4, 5, 3]], tf.int64))
    good = function(encoder_inputs=tf.constant([[4, 5, 3]], tf.int32))  # and the same call, right
    assert good["output_ids"].shape[0] == 1


# ---------------------------------------------------------------- kt-translate
# What the command reads and writes is Python, the same on every backend; the translations
# it prints are the greedy translator's, which is tested on every backend.
TRANSLATE_COMMAND_IO = once_on("torch", "kt-translate's reading and writing is Python, the same on every backend")


def _translate_command(tiny_dir, data, capsys, monkeypatch, *options):
    """Runs `kt-translate --greedy` on `data` (bytes) given on standard input.

    Returns `(exit status, stdout lines split on "\\n" only, stderr)`.
    """
    import io
    import sys

    from keras_transformer.cli.translate import main

    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))
    status = main(["--model-dir", str(tiny_dir), "--greedy", "--batch-size", "4", *options])
    captured = capsys.readouterr()
    out = captured.out
    assert out == "" or out.endswith("\n")
    return status, out.split("\n")[:-1], captured.err


@TRANSLATE_COMMAND_IO
def test_translate_command_keeps_one_output_line_per_input_line(tiny_dir, greedy_translator, capsys, monkeypatch):
    """Lines end at "\\n" only (one "\\r" before it dropped): the separators that
    `str.splitlines` also breaks at stay inside their line."""
    lines = [
        "cats see cars\x0bdogs see trees",  # vertical tab
        "birds\x1cfind bread",  # file separator
        "people paint\u2028gardens",  # line separator
        "horses\x85like houses",  # next line (NEL)
        "",
        "dogs like\x0ccars\rtrees",  # form feed, a lone carriage return
        "cats find houses",  # ends with \r\n
        "birds see cars",  # the last line, without "\\n"
    ]
    data = "\n".join(lines[:6]).encode() + b"\n" + lines[6].encode() + b"\r\n" + lines[7].encode()
    status, printed, _ = _translate_command(tiny_dir, data, capsys, monkeypatch)
    assert status == 0
    assert len(printed) == len(lines) == 8
    assert printed == [text.replace("\n", " ").replace("\r", " ") for text in greedy_translator.translate(lines)]
    assert printed[4] == ""


@TRANSLATE_COMMAND_IO
def test_translate_command_reads_invalid_utf8_as_replacement_with_a_warning(tiny_dir, greedy_translator, capsys, monkeypatch):
    data = b"cats see cars\nbirds \xff\xfe find bread\n\xed\xa0\x80\ndogs like trees\n"
    status, printed, err = _translate_command(tiny_dir, data, capsys, monkeypatch)
    assert status == 0
    assert "standard input: line(s) 2, 3 are not valid UTF-8; their invalid bytes were read as U+FFFD" in err
    expected = ["cats see cars", "birds \ufffd\ufffd find bread", "\ufffd\ufffd\ufffd", "dogs like trees"]
    assert printed == greedy_translator.translate(expected)


@TRANSLATE_COMMAND_IO
def test_translate_command_exits_non_zero_when_it_cannot_write(tiny_dir, capsys, monkeypatch, tmp_path):
    with pytest.raises(SystemExit) as stop:  # one line on stderr, exit status 2, like every kt-* error
        _translate_command(tiny_dir, b"cats see cars\n", capsys, monkeypatch, "--output", str(tmp_path))
    status, err = stop.value.code, capsys.readouterr().err
    errors = [line for line in err.splitlines() if "error" in line]  # beside the progress bar
    assert status == 2 and len(errors) == 1
    assert errors[0].startswith("kt-translate: error: could not write the translations")
    assert os.listdir(tmp_path) == []  # no partial file left


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
    "test_fault_injection.py",
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
