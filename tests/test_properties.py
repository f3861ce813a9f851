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


@settings(max_examples=15, **SETTINGS)
@given(
    pairs=st.lists(st.tuples(sentences, sentences), min_size=1, max_size=4),
    extra_source=st.integers(0, 3),
    extra_target=st.integers(0, 3),
)
def test_padding_and_batch_composition_never_change_a_sentences_logits(pairs, extra_source, extra_target):
    model = _model()
    encoder = _padded([s for s, _ in pairs], max(len(s) for s, _ in pairs) + extra_source)
    decoder = _padded([t for _, t in pairs], max(len(t) for _, t in pairs) + extra_target)
    together = to_numpy(model({"encoder_inputs": encoder, "decoder_inputs": decoder}))
    for row, (source, target) in enumerate(pairs):
        alone = to_numpy(model({"encoder_inputs": _padded([source], len(source)),
                                "decoder_inputs": _padded([target], len(target))}))
        np.testing.assert_allclose(together[row, : len(target)], alone[0], atol=2e-5, rtol=1e-5)


@settings(max_examples=12, **SETTINGS)
@given(text=st.text(max_size=120))
def test_translate_never_raises_on_arbitrary_unicode(greedy_translator, text):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # an input over 15 tokens is cut, with a warning
        translations = greedy_translator.translate([text, "cats see cars"])
    assert len(translations) == 2 and all(isinstance(t, str) for t in translations)
    if not greedy_translator.tokenizer.encode([text])[0]:  # nothing to translate
        assert translations[0] == ""
