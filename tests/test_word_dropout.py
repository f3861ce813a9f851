"""Word dropout: whole token embeddings dropped while training, nothing at inference.

The layer is checked token by token (each one kept and scaled by 1 / (1 - rate), or all
zeros); the model is checked by what a dropped word cannot carry: with (nearly) every
source embedding dropped, two different source sentences give the same training-mode
logits, while the decoder's words still count, and the other way round for the target.
A model with word dropout starts from the weights of one without it under the same
seed, so the remaining tests compare the two exactly.
"""

import keras
import numpy as np
import pytest
from conftest import tiny_config, to_numpy

import keras_transformer as kt
from keras_transformer.inference import decoding
from keras_transformer.layers import WordDropout

NEARLY_ALL = 0.9999  # a rate below 1 that drops all of a few tokens for any seed we use


def build(seed=0, **overrides):
    keras.utils.set_random_seed(seed)
    return kt.build_transformer(tiny_config(**overrides))


def batch(source, target):
    return {"encoder_inputs": np.array(source, "int32"), "decoder_inputs": np.array(target, "int32")}


def logits(model, inputs, training):
    return to_numpy(model(inputs, training=training))


def test_each_token_is_kept_whole_and_scaled_or_dropped_whole():
    layer = WordDropout(0.4, seed=3)
    x = np.random.default_rng(0).normal(size=(4, 50, 8)).astype("float32") + 5.0  # no zero entries
    y = to_numpy(layer(x, training=True))
    dropped = np.all(y == 0.0, axis=-1)
    np.testing.assert_allclose(y[~dropped], x[~dropped] / 0.6, rtol=1e-6)
    assert not np.any(y[dropped])
    # 200 tokens at rate 0.4: the share dropped is 0.4 +- 0.035 (one standard deviation).
    assert 0.25 < dropped.mean() < 0.55, dropped.mean()
    np.testing.assert_array_equal(to_numpy(layer(x, training=False)), x)
    np.testing.assert_array_equal(to_numpy(layer(x)), x)


def test_the_same_seed_drops_the_same_tokens_on_every_backend_and_each_call_draws_anew():
    """The drops come from `token_uniform` (keras.ops int32 arithmetic), not a backend's generator."""
    layer = WordDropout(0.5, seed=3)
    kept = [to_numpy(layer(np.ones((2, 6, 1), "float32"), training=True))[..., 0].tolist() for _ in range(2)]
    assert kept == [
        [[2, 0, 2, 0, 0, 0], [2, 2, 2, 0, 0, 0]],
        [[0, 0, 2, 0, 2, 2], [0, 0, 2, 2, 0, 0]],  # the seed generator advanced
    ]


def test_bad_rates_and_shapes_name_what_was_received():
    with pytest.raises(ValueError, match=r"`rate` must be a number in \[0, 1\). Received: rate=1.0"):
        WordDropout(1.0)
    for field in ("source_word_dropout", "target_word_dropout"):
        with pytest.raises(ValueError, match=rf"`{field}` must be a number in \[0, 1\). Received: {field}=-0.1"):
            tiny_config(**{field: -0.1})
    with pytest.raises(ValueError, match=r"\[batch, time, width\]. Received: shape=\(2, 3\)"):
        WordDropout(0.1)(np.ones((2, 3), "float32"), training=True)


def test_a_model_with_word_dropout_starts_from_the_same_weights_and_infers_the_same():
    plain = build()
    with_words = build(source_word_dropout=0.3, target_word_dropout=0.2)
    # Without it the model has the layers of earlier versions; with it, one per side.
    assert not [layer.name for layer in plain.layers if "word_dropout" in layer.name]
    assert [layer.name for layer in with_words.layers if "word_dropout" in layer.name] == [
        "encoder_word_dropout",
        "decoder_word_dropout",
    ]
    for a, b in zip(plain.get_weights(), with_words.get_weights()):
        np.testing.assert_array_equal(a, b)
    inputs = batch([[5, 6, 7, 8, 2]], [[1, 9, 10, 11]])
    np.testing.assert_array_equal(logits(plain, inputs, False), logits(with_words, inputs, False))
    assert not np.allclose(logits(with_words, inputs, True), logits(with_words, inputs, False))
    # Decoding reads the model at inference: the cached search is the plain model's.
    translate = lambda model: to_numpy(decoding.greedy_decode(model, inputs["encoder_inputs"], max_length=6)[0])
    np.testing.assert_array_equal(translate(plain), translate(with_words))


@pytest.mark.parametrize("side", ["source", "target"])
def test_a_dropped_word_carries_nothing_and_the_other_side_still_counts(side):
    model = build(**{f"{side}_word_dropout": NEARLY_ALL})
    source, other_source = [[5, 6, 7, 8, 2]], [[12, 13, 14, 15, 2]]
    target, other_target = [[1, 9, 10, 11]], [[1, 20, 21, 22]]
    reference = logits(model, batch(source, target), True)
    if side == "source":
        same, different = batch(other_source, target), batch(source, other_target)
    else:
        same, different = batch(source, other_target), batch(other_source, target)
    # Every embedding of that side dropped: only positions are left of its words.
    np.testing.assert_allclose(logits(model, same, True), reference, rtol=1e-5, atol=1e-5)
    assert np.max(np.abs(logits(model, different, True) - reference)) > 1e-2
    # At inference the words are all there.
    assert np.max(np.abs(logits(model, same, False) - logits(model, batch(source, target), False))) > 1e-2


def word_dropout_rates(model):
    # `_flatten_layers` (Keras' own walk) reaches the layers inside the stacks.
    return [layer.rate for layer in model._flatten_layers(include_self=False) if isinstance(layer, WordDropout)]


def fit(model):
    rng = np.random.default_rng(0)
    labels = rng.integers(4, 32, (8, 6)).astype("int32")
    decoder = np.concatenate([np.ones((8, 1), "int32"), labels[:, :-1]], axis=1)
    inputs = {"encoder_inputs": rng.integers(4, 32, (8, 6)).astype("int32"), "decoder_inputs": decoder}
    kt.compile_transformer(model, kt.TrainingConfig(warmup_steps=2, learning_rate_scale=5.0))
    history = model.fit(inputs, labels, batch_size=2, epochs=2, shuffle=False, verbose=0)
    return history.history["loss"]


def test_word_dropout_changes_training():
    plain, with_words = build(), build(source_word_dropout=0.3)
    # The same seed gives the same starting weights (the module docstring): only the dropout differs.
    for a, b in zip(plain.get_weights(), with_words.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert np.all(np.isfinite(fit(with_words)))
    fit(plain)
    assert max(np.max(np.abs(a - b)) for a, b in zip(plain.get_weights(), with_words.get_weights())) > 1e-4
    assert word_dropout_rates(with_words) == [0.3]  # the source side's only


def test_the_rates_survive_saving_and_the_run_config(tmp_path):
    model = build(source_word_dropout=0.1, target_word_dropout=0.2)
    path = str(tmp_path / "model.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)
    assert (loaded.config.source_word_dropout, loaded.config.target_word_dropout) == (0.1, 0.2)
    assert word_dropout_rates(loaded) == [0.1, 0.2]
    inputs = batch([[5, 6, 7, 2]], [[1, 9, 10]])
    np.testing.assert_array_equal(logits(loaded, inputs, False), logits(model, inputs, False))
    config = kt.RunConfig().with_overrides(["model.source_word_dropout=0.1"])
    assert config.model_config().source_word_dropout == 0.1
    with pytest.raises(ValueError, match=r"target_word_dropout"):
        kt.RunConfig().with_overrides(["model.target_word_dropout=1.5"]).model_config()
