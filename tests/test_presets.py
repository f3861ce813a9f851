"""Presets in keras-hub's format: written as keras-hub writes them, read back exactly.

The model is the tiny translation model of tiny_translation.py (random weights, a real
tokenizer). keras-hub is installed with the test extra; the test that uses it checks
the directory with keras-hub's own validation (what `upload_preset` runs before it
uploads), its own saver, and its own loader. Nothing touches the network.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest
from conftest import to_numpy
from tiny_translation import make_tiny_model_dir, pick_sentences

import keras_transformer as kt
from keras_transformer import presets

FILES = ["assets/tokenizer/vocabulary.spm", "config.json", "metadata.json", "model.weights.h5", "tokenizer.json"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    directory = tmp_path_factory.mktemp("preset_model")
    model, tokenizer = make_tiny_model_dir(directory)
    return directory, model, tokenizer


@pytest.fixture(scope="module")
def preset_dir(tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("presets") / "tiny_en_de"
    assert kt.save_preset(tiny[0], path) == str(path)
    return path


def logits(model, tokenizer):
    ids = tokenizer.encode(["cats see houses", "dogs like bread"])
    width = max(len(row) for row in ids) + 1
    encoder = np.array([row + [3] + [0] * (width - len(row) - 1) for row in ids], "int32")
    decoder = np.concatenate([np.full((2, 1), 2, "int32"), encoder[:, :-1]], axis=1)
    return to_numpy(model({"encoder_inputs": encoder, "decoder_inputs": decoder}))


def files_under(directory):
    return sorted(
        os.path.relpath(os.path.join(root, name), directory).replace(os.sep, "/")
        for root, _, names in os.walk(directory) for name in names
    )


def test_save_then_load_gives_the_same_model_tokenizer_and_translations(tiny, preset_dir):
    directory, model, tokenizer = tiny
    assert files_under(preset_dir) == FILES
    loaded, loaded_tokenizer = kt.load_preset(preset_dir)
    assert isinstance(loaded, kt.Transformer) and loaded.config == model.config
    assert loaded_tokenizer.fingerprint == tokenizer.fingerprint
    for weight, other in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(to_numpy(weight), to_numpy(other))
    np.testing.assert_array_equal(logits(loaded, loaded_tokenizer), logits(model, tokenizer))
    sentences = pick_sentences(tokenizer, count=3)
    options = dict(beam_size=2, max_extra=4, jit_compile=False)
    assert kt.Translator(loaded, loaded_tokenizer, **options).translate(sentences) == kt.Translator(
        directory, **options).translate(sentences)


def test_the_files_are_what_keras_hub_writes_and_reads(tiny, preset_dir, tmp_path):
    keras_hub = pytest.importorskip("keras_hub")
    from keras_hub.src.utils import preset_utils

    directory, model, tokenizer = tiny
    # What upload_preset checks before it uploads (config.json parses, the weights exist).
    preset_utils._validate_backbone(str(preset_dir))
    # keras-hub's own saver, given the same model and tokenizer, writes the same JSON.
    theirs = tmp_path / "theirs"
    saver = preset_utils.get_preset_saver(str(theirs))
    saver.save_backbone(model)
    saver.save_tokenizer(tokenizer.to_keras_hub())
    assert files_under(theirs) == files_under(preset_dir)
    for name in ("config.json", "tokenizer.json"):
        with open(preset_dir / name) as mine, open(theirs / name) as hubs:
            assert json.load(mine) == json.load(hubs), name
    with open(theirs / "metadata.json") as file:
        expected_keys = set(json.load(file))
    with open(preset_dir / "metadata.json") as file:
        metadata = json.load(file)
    assert expected_keys <= set(metadata) and metadata["parameter_count"] == model.count_params()
    assert metadata["tokenizer_sha256"] == tokenizer.fingerprint
    assert (preset_dir / "assets/tokenizer/vocabulary.spm").read_bytes() == tokenizer.model_proto
    # keras-hub's loader reads ours: the same model, and its tokenizer the same ids.
    loader = preset_utils.get_preset_loader(str(preset_dir))
    backbone = loader.load_backbone(kt.Transformer, load_weights=True)
    np.testing.assert_array_equal(logits(backbone, tokenizer), logits(model, tokenizer))
    # (SentencePieceTokenizer.from_preset would look for a keras-hub tokenizer class made
    # for this backbone; the loader reads the files themselves.)
    hub_tokenizer = loader.load_tokenizer(keras_hub.tokenizers.SentencePieceTokenizer)
    ids = to_numpy(hub_tokenizer(["cats see houses"])).tolist()
    assert [list(map(int, row)) for row in ids] == tokenizer.encode(["cats see houses"])


# Writes the tiny model's preset under another backend, with its logits and translations.
WRITER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import keras_transformer as kt
    from test_presets import logits
    from tiny_translation import pick_sentences

    from keras_transformer.model.directory import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(sys.argv[1])
    kt.save_preset(model, sys.argv[2], tokenizer=tokenizer)
    np.save(sys.argv[3], logits(model, tokenizer))
    translator = kt.Translator(model, tokenizer, beam_size=2, max_extra=4, jit_compile=False)
    print("TRANSLATIONS " + json.dumps(translator.translate(pick_sentences(tokenizer, count=3))))
    """
)


def test_a_preset_written_under_another_backend_loads_and_translates_identically(tiny, tmp_path):
    directory, model, tokenizer = tiny
    other = "torch" if keras.backend.backend() == "tensorflow" else "tensorflow"
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    tests = os.path.dirname(os.path.abspath(__file__))
    env = {**os.environ, "KERAS_BACKEND": other, "PYTHONPATH": os.pathsep.join([tests, *sys.path])}
    result = subprocess.run(
        [sys.executable, str(script), str(directory), str(tmp_path / "preset"), str(tmp_path / "logits.npy")],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    written_translations = json.loads(result.stdout.split("TRANSLATIONS ", 1)[1])
    loaded, loaded_tokenizer = kt.load_preset(tmp_path / "preset")
    for weight, other_weight in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(to_numpy(weight), to_numpy(other_weight))
    np.testing.assert_allclose(logits(loaded, loaded_tokenizer), np.load(tmp_path / "logits.npy"), atol=1e-5)
    translator = kt.Translator(loaded, loaded_tokenizer, beam_size=2, max_extra=4, jit_compile=False)
    assert translator.translate(pick_sentences(tokenizer, count=3)) == written_translations


@pytest.mark.parametrize("missing", list(presets.REQUIRED_FILES))
def test_a_preset_missing_a_file_is_refused_naming_it_and_the_directory(preset_dir, tmp_path, missing):
    broken = tmp_path / "broken"
    shutil.copytree(preset_dir, broken)
    os.remove(broken / missing)
    message = f"The preset directory '{broken}' has no {missing}"
    with pytest.raises(FileNotFoundError, match=message.replace("(", r"\(").replace(".", r"\.")):
        kt.load_preset(broken)


def test_bad_presets_and_handles_are_refused(tiny, preset_dir, tmp_path):
    directory, model, tokenizer = tiny
    with pytest.raises(FileNotFoundError, match="No preset directory at"):
        kt.load_preset(tmp_path / "nowhere")
    with pytest.raises(FileExistsError, match="already exists; pass overwrite=True"):
        kt.save_preset(directory, preset_dir)
    # Another model's config.json (a keras-hub backbone's, say).
    other = tmp_path / "other"
    shutil.copytree(preset_dir, other)
    (other / "config.json").write_text(json.dumps({"registered_name": "keras_hub>BertBackbone", "config": {}}))
    with pytest.raises(ValueError, match=r"describes 'keras_hub>BertBackbone', not a keras_transformer Transformer"):
        kt.load_preset(other)
    # A vocabulary swapped for another one: the metadata's fingerprint says so.
    swapped = tmp_path / "swapped"
    shutil.copytree(preset_dir, swapped)
    another = kt.train_tokenizer(["a b c d e f g h"] * 30, vocab_size=14)
    (swapped / "assets/tokenizer/vocabulary.spm").write_bytes(another.model_proto)
    with pytest.raises(ValueError, match="is not the tokenizer it was saved with"):
        kt.load_preset(swapped)
    with pytest.raises(ValueError, match="A model object needs its tokenizer"):
        kt.save_preset(model, tmp_path / "no_tokenizer")


def test_a_remote_handle_without_keras_hub_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "keras_hub", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "keras_hub.src.utils", None)
    monkeypatch.setitem(sys.modules, "keras_hub.src.utils.preset_utils", None)
    with pytest.raises(ImportError, match=r"needs keras-hub, an optional extra: pip install 'keras-transformer\[hub\]'"):
        kt.load_preset("kaggle://someone/model/keras/variant")
