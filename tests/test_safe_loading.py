"""Loading: `.keras` files are always read with `safe_mode=True`, and ours load that way.

Keras' `safe_mode` refuses to deserialize Python code (a `Lambda` layer's function
is stored as bytecode), which would otherwise run on load: a model file from elsewhere
could execute anything. The package never turns it off, and needs not: every layer,
the schedule, the loss and the metrics are registered classes.
"""

import ast
import os

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy
from tiny_reliability import tiny_dir  # noqa: F401  (session fixture)

import keras_transformer as kt
from keras_transformer.model.directory import MODEL_FILE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("keras_transformer", "training")  # the package and its command-line tools


def _python_files():
    for top in SOURCES:
        for directory, _, names in os.walk(os.path.join(ROOT, top)):
            for name in names:
                if name.endswith(".py"):
                    yield os.path.join(directory, name)


def _called_name(call):
    function = call.func
    return function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)


def test_every_load_model_call_in_the_package_passes_safe_mode_true():
    calls, unsafe = [], []
    for path in _python_files():
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), path)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr == "enable_unsafe_deserialization":
                unsafe.append(f"{path}:{node.lineno}: enable_unsafe_deserialization")
            if not isinstance(node, ast.Call):
                continue
            where = f"{os.path.relpath(path, ROOT)}:{node.lineno}"
            keywords = {keyword.arg: keyword.value for keyword in node.keywords}
            if "safe_mode" in keywords and not (
                isinstance(keywords["safe_mode"], ast.Constant) and keywords["safe_mode"].value is True
            ):
                unsafe.append(f"{where}: safe_mode={ast.unparse(keywords['safe_mode'])}")
            if _called_name(node) == "load_model":
                calls.append(where)
                if "safe_mode" not in keywords:  # Keras' default is True, but say so
                    unsafe.append(f"{where}: load_model without safe_mode=True")
    assert not unsafe
    # One loader, `model.directory.load_model_file`, which checks the file whole first.
    assert calls and all(call.startswith("keras_transformer/model/directory.py") for call in calls), calls


def test_package_model_directory_loads_in_safe_mode(tiny_dir):
    from keras_transformer.model.directory import load_model_and_tokenizer

    model = keras.saving.load_model(str(tiny_dir / MODEL_FILE), safe_mode=True)
    loaded, _ = load_model_and_tokenizer(tiny_dir)  # the package's own loader
    assert isinstance(model, kt.Transformer) and isinstance(loaded, kt.Transformer)
    assert model.config == loaded.config and len(model.weights) == len(loaded.weights) > 10
    for weight, other in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(to_numpy(weight), to_numpy(other))


def test_compiled_model_with_every_option_round_trips_in_safe_mode(tmp_path):
    """Untied embeddings, learned positions, pre-norm, a gated FFN, and the compiled optimizer, loss, metrics."""
    config = tiny_config(share_embeddings=False, position_encoding="learned", norm_first=True, gated_ffn=True)
    model = kt.build_transformer(config)
    kt.compile_transformer(model, kt.TrainingConfig(warmup_steps=4), jit_compile=False)
    model.optimizer.build(model.trainable_variables)  # as after training: Adam's moments exist
    model.optimizer.iterations.assign(3)
    path = str(tmp_path / MODEL_FILE)
    model.save(path)
    restored = keras.saving.load_model(path, safe_mode=True)
    assert restored.config == config
    for weight, other in zip(model.weights, restored.weights):
        np.testing.assert_array_equal(to_numpy(weight), to_numpy(other))
    assert restored.optimizer.get_config()["learning_rate"]["class_name"].endswith("TransformerSchedule")
    assert float(to_numpy(restored.optimizer.learning_rate)) == float(to_numpy(model.optimizer.learning_rate))
    assert int(to_numpy(restored.optimizer.iterations)) == 3
    assert type(restored.loss).__name__ == "LabelSmoothedCrossEntropy"


def test_model_file_carrying_python_code_is_refused(tmp_path):
    from keras_transformer.inference.translator import Translator

    inputs = keras.Input((3,))
    keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2)(inputs)).save(str(tmp_path / MODEL_FILE))
    with pytest.raises(ValueError, match=r"deserialization of a `Lambda` layer .* disallowed by default"):
        Translator(tmp_path)


# ------------------------------------------------------ files written by version 0.1
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
OLD_MODEL = os.path.join(FIXTURES, "model_v0_1.keras")  # written by keras-transformer 0.1


def test_importing_the_package_registers_every_class_a_saved_model_needs():
    # A fresh process that only imports the package, then loads a compiled model file
    # (its loss, metrics and learning-rate schedule are ours too): nothing else imported.
    import subprocess
    import sys

    script = (
        "import keras, keras_transformer\n"
        f"model = keras.saving.load_model({OLD_MODEL!r}, safe_mode=True)\n"
        "print(type(model).__name__, type(model.loss).__name__,\n"
        "      type(model.optimizer._learning_rate).__name__,\n"
        "      sorted(type(m).__name__ for m in model._compile_metrics._user_metrics))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split()[:3] == ["Transformer", "LabelSmoothedCrossEntropy", "TransformerSchedule"]
    assert "MaskedAccuracy" in result.stdout and "Perplexity" in result.stdout


def test_a_0_1_model_directory_gives_its_architecture_back(tmp_path):
    from keras_transformer.model.directory import read_model_config

    (tmp_path / MODEL_FILE).write_bytes(open(OLD_MODEL, "rb").read())
    config = read_model_config(tmp_path)
    # The 0.1 file's config also held training and decoding settings; they are dropped.
    assert config == kt.TransformerConfig.from_preset(
        "tiny", vocab_size=32, d_model=16, d_ff=32, num_heads=2,
        num_encoder_layers=1, num_decoder_layers=1, max_length=16,
    )
    model = keras.saving.load_model(str(tmp_path / MODEL_FILE), compile=False, safe_mode=True)
    assert model.config == config
    with pytest.raises(FileNotFoundError, match="No model.keras in the model directory"):
        read_model_config(tmp_path / "missing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / MODEL_FILE).write_text("not a zip")
    with pytest.raises(ValueError, match="is not a .keras file of a keras_transformer model"):
        read_model_config(tmp_path / "other")
