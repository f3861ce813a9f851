"""SavedModel export: a served graph that translates as the in-process Translator does.

The exports are loaded in a fresh Python process that imports `tensorflow` (and, for
the text signature, `tensorflow_text`) and not this package, as a server would.
Exporting traces beam search into a TF graph, so these tests run on the
TensorFlow backend; on JAX and PyTorch only the refusal is checked.
"""

import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from tiny_translation import BEAM_SIZE, MAX_EXTRA, model_dir, sentences, translator  # noqa: F401

from keras_transformer.cli.demo import export_and_check
from keras_transformer import atomic
from keras_transformer.inference import export
from keras_transformer.special_tokens import EOS_ID
from keras_transformer.inference.translator import pad_batch

ON_TENSORFLOW = keras.backend.backend() == "tensorflow"
SOURCE = "cats see trees"
needs_tensorflow = pytest.mark.skipif(
    not ON_TENSORFLOW, reason="SavedModel export needs the TensorFlow backend"
)

# Runs in a fresh interpreter: the ids-only export must load before tensorflow_text is
# imported (no tokenizer op registered), then the full export with it.
LOADER = textwrap.dedent(
    """
    import json, sys
    import tensorflow as tf
    request = json.load(sys.stdin)
    ids_only = tf.saved_model.load(request["ids_only_dir"])
    ids_out = ids_only.signatures["serving_default"](
        encoder_inputs=tf.constant(request["ids"], tf.int32))
    import tensorflow_text  # registers the tokenizer ops of the full export
    full = tf.saved_model.load(request["full_dir"])
    result = {"ids_only": {"output_ids": ids_out["output_ids"].numpy().tolist(),
                           "score": ids_out["score"].numpy().tolist()},
              "modules": sorted(m for m in sys.modules if m.startswith("keras_transformer"))}
    for name, batch in request["batches"].items():
        out = full.signatures["serving_default"](text=tf.constant(batch))
        result[name] = {"translation": [t.decode() for t in out["translation"].numpy()],
                        "score": out["score"].numpy().tolist()}
    out = full.signatures["translate_ids"](encoder_inputs=tf.constant(request["ids"], tf.int32))
    result["translate_ids"] = {"output_ids": out["output_ids"].numpy().tolist(),
                               "score": out["score"].numpy().tolist()}
    out = full.signatures["translate_n_best"](text=tf.constant(request["batches"]["batch7"]))
    result["n_best"] = {"translations": [[t.decode() for t in row] for row in out["translations"].numpy()],
                        "scores": out["scores"].numpy().tolist()}
    for name, loaded in (("ids_n_best", full), ("ids_only_n_best", ids_only)):
        out = loaded.signatures["translate_ids_n_best"](encoder_inputs=tf.constant(request["ids"], tf.int32))
        result[name] = {"output_ids": out["output_ids"].numpy().tolist(), "scores": out["scores"].numpy().tolist()}
    result["ids_only_signatures"] = sorted(ids_only.signatures)
    print(json.dumps(result))
    """
)


@pytest.fixture(scope="module")
def exports(model_dir, tmp_path_factory):
    """The full export (version 1) and the ids-only one (version 2) of the tiny model."""
    if not ON_TENSORFLOW:
        pytest.skip("SavedModel export needs the TensorFlow backend")
    base = tmp_path_factory.mktemp("saved_models")
    # The full export through make demo's path: export, reload in-process, compare.
    check = export_and_check(
        model_dir, [SOURCE, ""], base_dir=str(base), name="tiny", beam_size=BEAM_SIZE,
        max_extra=MAX_EXTRA, jit_compile=False,
    )
    assert check.agrees == [True, True] and check.translations[1] == ""
    assert f"{SOURCE!r} -> {check.translations[0]!r}" in str(check)
    full = check.export_dir
    ids_only = export.export_saved_model(
        model_dir, base_dir=str(base), name="tiny", beam_size=BEAM_SIZE, max_extra=MAX_EXTRA, ids_only=True
    )
    return base, full, ids_only


@pytest.fixture(scope="module")
def served(exports, translator, sentences):
    """What fresh processes without this package get from the exports.

    Returns `(result, request, cli_output)`: the loader's JSON answer, what it was
    asked, and `saved_model_cli show --all` of the full export (run concurrently).
    """
    _, full, ids_only = exports
    batch7 = sentences[:4] + ["", sentences[4], "  "]  # 5 texts: batches of 4 and 1
    ids = [ids + [EOS_ID] for ids in translator.tokenizer.encode(sentences[:3])]
    request = {
        "full_dir": full,
        "ids_only_dir": ids_only,
        "batches": {"batch1": sentences[2:3], "batch7": batch7},
        "ids": pad_batch(ids, 16, 4)[:3].tolist(),
    }
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
    cli = os.path.join(os.path.dirname(sys.executable), "saved_model_cli")
    pipes = dict(stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    shown = subprocess.Popen([cli, "show", "--all", "--dir", full], **pipes)
    loader = subprocess.Popen([sys.executable, "-c", LOADER], stdin=subprocess.PIPE, **pipes)
    stdout, stderr = loader.communicate(json.dumps(request), timeout=300)
    assert loader.returncode == 0, stderr[-3000:]
    cli_stdout, cli_stderr = shown.communicate(timeout=300)
    assert shown.returncode == 0, cli_stderr[-2000:]
    return json.loads(stdout.strip().splitlines()[-1]), request, cli_stdout


@needs_tensorflow
def test_exports_land_in_the_tf_serving_layout_with_the_next_version(exports):
    base, full, ids_only = exports
    assert full == os.path.join(str(base), "tiny", "1")
    assert ids_only == os.path.join(str(base), "tiny", "2")
    assert os.path.isfile(os.path.join(full, "saved_model.pb"))
    assert sorted(os.listdir(os.path.join(str(base), "tiny"))) == ["1", "2"]  # no temporaries left
    assert export.next_version(os.path.join(str(base), "tiny")) == 3


@needs_tensorflow
def test_saved_model_translates_like_the_translator_without_keras(served, translator):
    result, request, _ = served
    # No model code was imported (`import tensorflow` itself imports keras, but nothing
    # of keras is called: the graph and its variables come from the SavedModel alone).
    assert result["modules"] == []
    for name in ("batch1", "batch7"):
        batch = request["batches"][name]
        expected, expected_scores = translator.translate(batch, return_scores=True)
        assert result[name]["translation"] == expected
        np.testing.assert_allclose(result[name]["score"], expected_scores, atol=1e-4)
    assert len(result["batch7"]["translation"]) == 7
    assert [result["batch7"]["translation"][i] for i in (4, 6)] == ["", ""]
    assert [result["batch7"]["score"][i] for i in (4, 6)] == [0.0, 0.0]


@needs_tensorflow
def test_token_id_signatures_match_the_translator(served, translator, sentences):
    result, _, _ = served
    expected, expected_scores = translator.translate(sentences[:3], return_scores=True)
    for name in ("translate_ids", "ids_only"):
        tokens = result[name]["output_ids"]
        assert translator.tokenizer.decode(tokens) == expected
        assert all(row.count(EOS_ID) == 1 for row in tokens)
        np.testing.assert_allclose(result[name]["score"], expected_scores, atol=1e-4)


@needs_tensorflow
def test_n_best_signatures_return_the_translators_n_best_lists(served, translator):
    """`[batch, k]` translations and scores (k = the beam size by default), best first."""
    result, request, _ = served
    batch = request["batches"]["batch7"]
    expected = translator.translate(batch, n_best=BEAM_SIZE)
    assert [[text for text in row] for row in result["n_best"]["translations"]] == [
        [h.text for h in hypotheses] + [""] * (BEAM_SIZE - len(hypotheses)) for hypotheses in expected
    ]
    scores = np.array(result["n_best"]["scores"])
    assert scores.shape == (7, BEAM_SIZE)
    for row, hypotheses in enumerate(expected):
        np.testing.assert_allclose(scores[row, : len(hypotheses)], [h.score for h in hypotheses], atol=1e-4)
        assert np.all(np.isneginf(scores[row, len(hypotheses) :]))  # an empty input: "" with 0, then -inf
    assert result["ids_only_signatures"] == ["serving_default", "translate_ids", "translate_ids_n_best"]
    # The token-id lists: their first column is `translate_ids`' answer, checked above.
    for name in ("ids_n_best", "ids_only_n_best"):
        tokens, scores = np.array(result[name]["output_ids"]), np.array(result[name]["scores"])
        assert tokens.shape[:2] == (3, BEAM_SIZE) and scores.shape == (3, BEAM_SIZE)
        assert tokens[:, 0].tolist() == result["translate_ids"]["output_ids"]
        np.testing.assert_allclose(scores[:, 0], result["translate_ids"]["score"], atol=1e-5)
        assert np.all(np.diff(scores, axis=1) <= 0)


def test_n_best_above_the_beam_size_is_refused_before_exporting(model_dir, tmp_path):
    if not ON_TENSORFLOW:
        pytest.skip("SavedModel export needs the TensorFlow backend")
    message = r"`n_best` must be at most the beam size.*Received: n_best=3, beam_size=2"
    with pytest.raises(ValueError, match=message):
        export.export_saved_model(model_dir, base_dir=str(tmp_path), beam_size=2, n_best=3)
    assert not os.listdir(tmp_path)


@needs_tensorflow
def test_graphs_hold_no_python_function_ops(exports):
    _, full, ids_only = exports
    full_ops = export.saved_model_op_types(full)
    ids_ops = export.saved_model_op_types(ids_only)
    assert not full_ops & export.PYTHON_FUNCTION_OPS
    assert not ids_ops & export.PYTHON_FUNCTION_OPS
    # The walk reaches into the function library, where the decoding loop lives.
    assert {"While", "TopKV2", "SentencepieceTokenizeOp", "SentencepieceDetokenizeOp"} <= full_ops
    assert "While" in ids_ops and not any(op.startswith("Sentencepiece") for op in ids_ops)


@needs_tensorflow
def test_graphs_hold_no_xla_only_ops(exports):
    _, full, _ = exports
    assert not [op for op in export.saved_model_op_types(full) if op.startswith("Xla")]


@needs_tensorflow
def test_saved_model_cli_lists_both_signatures(served):
    _, _, shown = served
    for expected in (
        "signature_def['serving_default']",
        "signature_def['translate_ids']",
        "signature_def['translate_n_best']",
        "signature_def['translate_ids_n_best']",
        # k is fixed at export time: the beam size by default.
        f"outputs['translations'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1, {BEAM_SIZE})",
        f"outputs['scores'] tensor_info:\n        dtype: DT_FLOAT\n        shape: (-1, {BEAM_SIZE})",
        # Inputs of any shape: their rank is checked in the graph, with a clear message.
        "inputs['text'] tensor_info:\n        dtype: DT_STRING\n        shape: unknown_rank",
        "outputs['translation'] tensor_info:\n        dtype: DT_STRING\n        shape: (-1)",
        "outputs['score'] tensor_info:\n        dtype: DT_FLOAT\n        shape: (-1)",
        "inputs['encoder_inputs'] tensor_info:\n        dtype: DT_INT32\n        shape: unknown_rank",
        "outputs['output_ids'] tensor_info:\n        dtype: DT_INT32\n        shape: (-1, -1)",
    ):
        assert expected in shown


@needs_tensorflow
def test_existing_version_is_refused_unless_overwrite(exports, model_dir):
    base, full, _ = exports
    before = sorted(os.listdir(full))
    with pytest.raises(FileExistsError, match=r"tiny/1 already exists; pass overwrite=True"):
        export.export_saved_model(model_dir, base_dir=str(base), name="tiny", version=1)
    assert sorted(os.listdir(full)) == before


def test_atomic_write_keeps_the_old_directory_when_writing_fails(tmp_path):
    target = tmp_path / "tiny" / "1"
    target.mkdir(parents=True)
    (target / "old.txt").write_text("old")

    def fail(directory):
        os.makedirs(directory)
        (open(os.path.join(directory, "half.txt"), "w")).close()
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        atomic.write_directory_atomically(str(target), fail, overwrite=True)
    assert os.listdir(tmp_path / "tiny") == ["1"] and os.listdir(target) == ["old.txt"]

    def write_new(directory):
        os.makedirs(directory)
        (open(os.path.join(directory, "new.txt"), "w")).close()

    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        atomic.write_directory_atomically(str(target), write_new)
    atomic.write_directory_atomically(str(target), write_new, overwrite=True)
    assert os.listdir(tmp_path / "tiny") == ["1"] and os.listdir(target) == ["new.txt"]


def test_early_stopping_reaches_the_exported_search(model_dir, tmp_path, monkeypatch):
    if not ON_TENSORFLOW:
        pytest.skip("SavedModel export needs the TensorFlow backend")

    class Traced(Exception):
        pass

    seen = {}

    def spy(*args, **kwargs):  # stops the export at its first trace of the search
        seen.update(kwargs)
        raise Traced

    monkeypatch.setattr(export.decoding, "beam_decode", spy)
    with pytest.raises(Traced):
        export.export_saved_model(model_dir, base_dir=str(tmp_path), beam_size=2, early_stopping=True)
    assert seen["early_stopping"] is True and seen["return_all_beams"] is True
    with pytest.raises(ValueError, match=r"`early_stopping` must be True or False. Received: early_stopping=1"):
        export.export_saved_model(model_dir, base_dir=str(tmp_path), early_stopping=1)


def test_bad_names_and_versions_are_refused(model_dir, tmp_path):
    if not ON_TENSORFLOW:
        pytest.skip("SavedModel export needs the TensorFlow backend")
    with pytest.raises(ValueError, match=r"`name` must be one directory name .* Received: name='a/b'"):
        export.export_saved_model(model_dir, base_dir=str(tmp_path), name="a/b")
    with pytest.raises(ValueError, match=r"`version` must be a positive integer. Received: version=0"):
        export.export_saved_model(model_dir, base_dir=str(tmp_path), version=0)


def test_other_backends_are_told_how_to_export(model_dir, tmp_path):
    if ON_TENSORFLOW:
        pytest.skip("the refusal is for the JAX and PyTorch backends")
    message = (
        r"needs the TensorFlow backend, but this process runs KERAS_BACKEND='(jax|torch)'"
        r".*KERAS_BACKEND=tensorflow python -m training.export"
    )
    with pytest.raises(RuntimeError, match=message):
        export.export_saved_model(model_dir, base_dir=str(tmp_path))
    assert not os.listdir(tmp_path)


def test_keras_model_export_traces_the_model_on_tensorflow_and_jax(tmp_path):
    """Keras' own `model.export` (a serving endpoint of the model, no decoding) works on
    JAX too, whose exporter traces lengths as symbols (jax2tf shape polymorphism): the
    position encoding's length check lets a symbolic length through."""
    if keras.backend.backend() == "torch":
        pytest.skip("Keras exports a TF SavedModel from TensorFlow and JAX only")
    import tensorflow as tf
    from conftest import tiny_config

    import keras_transformer as kt

    keras.utils.set_random_seed(0)
    model = kt.build_transformer(tiny_config(max_length=16))
    inputs = {
        "encoder_inputs": np.array([[4, 5, 6, 3, 0], [7, 3, 0, 0, 0]], "int32"),
        "decoder_inputs": np.array([[2, 8, 9], [2, 10, 0]], "int32"),
    }
    expected = keras.ops.convert_to_numpy(model(inputs))
    path = str(tmp_path / "keras_export")
    model.export(path, format="tf_saved_model", verbose=False)
    loaded = tf.saved_model.load(path)  # held: its functions need its variables alive
    served = loaded.serve({key: tf.constant(value) for key, value in inputs.items()})
    np.testing.assert_allclose(served.numpy(), expected, atol=1e-5)
