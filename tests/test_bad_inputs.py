"""The catalogue of bad inputs: one case per row, each with its expected outcome.

The README's "Errors and limits" table lists the same rows.
"""

import numpy as np
import pytest
from conftest import tiny_config, to_numpy

import keras_transformer as kt

GOOD = np.array([[4, 5, 6, 3]], "int32")


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
        kt.model.check_token_ids(np.array([[1, 99]]), vocab_size=32, name="encoder_inputs")
    kt.model.check_token_ids(np.array([[0, 31]]), vocab_size=32)  # the edges are valid
