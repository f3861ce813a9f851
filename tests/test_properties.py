"""Property-based tests (hypothesis): statements that hold for every input, not one.

Examples are derandomized (the same ones on every run, so the suite is reproducible)
and few, so each property costs a few seconds per backend.
"""

import warnings

import numpy as np
from conftest import tiny_config, to_numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tiny_reliability import greedy_translator, tiny_dir  # noqa: F401  (session fixtures)

import keras_transformer as kt
from keras_transformer.special_tokens import PAD_ID

# The autouse seed fixture is function-scoped; nothing here depends on it per example.
SETTINGS = dict(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
_MODEL = {}

sentences = st.lists(st.integers(PAD_ID + 1, 31), min_size=1, max_size=6)  # no padding inside


def _model():
    if "model" not in _MODEL:
        _MODEL["model"] = kt.build_transformer(tiny_config())
    return _MODEL["model"]


def _padded(rows, length):
    batch = np.full((len(rows), length), PAD_ID, "int32")
    for row, ids in enumerate(rows):
        batch[row, : len(ids)] = ids
    return batch


# Two shapes only, each compiled once by `predict_on_batch` (eager JAX would compile
# every op for every new shape): four sentences padded to 8, and each sentence alone
# padded to 12. A sentence of n tokens thus meets 8 - n and 12 - n pads and three
# random neighbours.
BATCH, BATCH_LENGTH, ALONE_LENGTH = 4, 8, 12


@settings(max_examples=15, **SETTINGS)
@given(pairs=st.lists(st.tuples(sentences, sentences), min_size=BATCH, max_size=BATCH))
def test_padding_and_batch_composition_never_change_a_sentences_logits(pairs):
    model = _model()
    together = to_numpy(model.predict_on_batch({"encoder_inputs": _padded([s for s, _ in pairs], BATCH_LENGTH),
                                                "decoder_inputs": _padded([t for _, t in pairs], BATCH_LENGTH)}))
    for row, (source, target) in enumerate(pairs):
        alone = to_numpy(model.predict_on_batch({"encoder_inputs": _padded([source], ALONE_LENGTH),
                                                 "decoder_inputs": _padded([target], ALONE_LENGTH)}))
        np.testing.assert_allclose(together[row, : len(target)], alone[0, : len(target)], atol=2e-5, rtol=1e-5)


@settings(max_examples=12, **SETTINGS)
@given(text=st.text(max_size=120))
def test_translate_never_raises_on_arbitrary_unicode(greedy_translator, text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # an input over 15 tokens is cut, with a warning
        translations = greedy_translator.translate([text, "cats see cars"])
    assert len(translations) == 2 and all(isinstance(t, str) for t in translations)
    if not greedy_translator.tokenizer.encode([text])[0]:  # nothing to translate
        assert translations[0] == ""
