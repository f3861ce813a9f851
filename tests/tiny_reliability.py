"""Fixtures shared by the reliability tests: one tiny model directory, one greedy translator.

pytest makes a session fixture once per module that imports it, so these fixtures keep
their value in a module-level cache: test_bad_inputs, test_properties, test_faults,
test_concurrency and test_safe_loading all get the same objects, and each compiled
decoder shape is paid for once per session. The model is tiny_translation's (same
tokenizer, same seed), decoded greedily: the catalogue's outcomes do not depend on
the search, and greedy search compiles fastest.
"""

import keras
import pytest
from tiny_translation import BATCH_SIZE, make_tiny_model_dir

_CACHE = {}


def _once(key, make):
    if key not in _CACHE:
        _CACHE[key] = make()
    return _CACHE[key]


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A model directory (`model.keras`, `tokenizer.model`) of the tiny translation model."""

    def make():
        directory = tmp_path_factory.mktemp("reliability_model")
        make_tiny_model_dir(directory)
        return directory

    return _once("tiny_dir", make)


@pytest.fixture(scope="session")
def greedy_translator(tiny_dir):
    """A greedy `Translator` of `tiny_dir` (a plain tf.function graph on TensorFlow)."""
    from keras_transformer.inference.translator import Translator

    return _once(
        "greedy_translator",
        lambda: Translator(tiny_dir, beam_size=1, batch_size=BATCH_SIZE, jit_compile=False),
    )


@pytest.fixture(scope="session")
def greedy_export(tiny_dir, tmp_path_factory):
    """`(base_dir, export_dir)`: a greedy SavedModel export of `tiny_dir` (TensorFlow only)."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("SavedModel export needs the TensorFlow backend")
    from keras_transformer.inference import export

    def make():
        base = tmp_path_factory.mktemp("reliability_exports")
        path = export.export_saved_model(tiny_dir, base_dir=str(base), name="tiny", beam_size=1)
        return base, path

    return _once("greedy_export", make)
