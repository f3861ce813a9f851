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
    assert len(calls) >= 2, calls  # translator.py and checkpoints.py at least


def test_package_model_directory_loads_in_safe_mode(tiny_dir):
    from keras_transformer.model.directory import load_model_and_tokenizer

    model = keras.saving.load_model(str(tiny_dir / MODEL_FILE), safe_mode=True)
    loaded, _ = load_model_and_tokenizer(tiny_dir)  # the package's own loader
    assert isinstance(model, kt.Transformer) and isinstance(loaded, kt.Transformer)
    assert model.config == loaded.config and len(model.weights) == len(loaded.weights) > 10
    for weight, other in zip(model.weights, loaded.weights):
        np.testing.assert_array_equal(to_numpy(weight), to_numpy(other))


def test_compiled_model_with_every_option_round_trips_in_safe_mode(tmp_path):
    """Untied embeddings, learned positions, pre-norm, and the compiled optimizer, loss, metrics."""
    config = tiny_config(share_embeddings=False, position_encoding="learned", norm_first=True)
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
