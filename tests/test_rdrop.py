"""R-Drop: RDropCrossEntropy's value by hand, its refusals, and batches read twice.

The loss is checked against numbers computed by hand, and against
`LabelSmoothedCrossEntropy` where the two halves agree (evaluation); the premise it
rests on, that the two copies of an example get different dropout masks in training
and the same output without, is checked on the model itself, on every backend.
"""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf
from conftest import once_on, tiny_config, to_numpy

import keras_transformer as kt
from keras_transformer.data.duplication import duplicate_batches
from keras_transformer.special_tokens import BOS_ID
from keras_transformer.train.compile import make_loss
from keras_transformer.train.rdrop import RDropCrossEntropy, symmetric_kl


def test_symmetric_kl_equals_the_hand_computed_value():
    # (0.5 - 0.9) * (log 0.5 - log 0.9) + (0.5 - 0.1) * (log 0.5 - log 0.1) = 0.4 * log 9
    value = symmetric_kl(np.log([[0.5, 0.5]]), np.log([[0.9, 0.1]]))
    assert float(to_numpy(value)[0]) == pytest.approx(0.4 * math.log(9.0), rel=1e-6)
    assert float(to_numpy(symmetric_kl(np.log([[0.2, 0.8]]), np.log([[0.2, 0.8]])))[0]) == 0.0


def test_loss_equals_the_hand_computed_value():
    # One example read twice: p1 = (0.5, 0.5), p2 = (0.9, 0.1), label 1, no smoothing.
    # CE: -log 0.5 and -log 0.1; KL pair: 0.4 log 9; (sum CE + alpha * KL / 2) / 2 tokens.
    logits = np.log(np.array([[[0.5, 0.5]], [[0.9, 0.1]]], "float32"))
    labels = np.array([[1], [1]], "int32")
    expected = (math.log(2.0) + math.log(10.0) + 5.0 * 0.4 * math.log(9.0) / 2.0) / 2.0
    assert expected == pytest.approx(2.5964784, rel=1e-7)
    loss = RDropCrossEntropy(alpha=5.0, label_smoothing=0.0)(labels, logits)
    assert float(to_numpy(loss)) == pytest.approx(expected, rel=1e-6)


def test_equal_halves_give_the_label_smoothed_cross_entropy_and_padding_is_left_out():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 7)).astype("float32")
    labels = np.array([[4, 5, 0], [6, 0, 0]], "int32")
    twice = RDropCrossEntropy(alpha=5.0)(np.concatenate([labels] * 2), np.concatenate([logits] * 2))
    once = kt.LabelSmoothedCrossEntropy()(labels, logits)
    np.testing.assert_allclose(to_numpy(twice), to_numpy(once), rtol=1e-6)
    # Padding's logits count for nothing, in the KL term too: change them in one half only.
    changed = np.concatenate([logits] * 2)
    changed[2, 2:] = 100.0 * rng.normal(size=(1, 7))  # row 0's padding
    changed[3, 1:] = -100.0  # row 1's
    twice_changed = RDropCrossEntropy(alpha=5.0)(np.concatenate([labels] * 2), changed)
    np.testing.assert_allclose(to_numpy(twice_changed), to_numpy(once), rtol=1e-6)


@pytest.mark.parametrize(
    "labels, message",
    [
        (np.array([[4, 5], [4, 6]]), r"the labels' halves differ. Received: labels of shape \(2, 2\)$"),
        (np.array([[4, 5], [4, 5], [4, 5]]), r"labels of shape \(3, 2\) \(an odd batch size\)"),
    ],
    ids=["halves_differ", "odd_batch"],
)
def test_a_batch_that_is_not_two_equal_halves_is_refused_where_it_can_be_read(labels, message):
    logits = np.zeros(labels.shape + (8,), "float32")
    with pytest.raises(ValueError, match=message):
        RDropCrossEntropy()(labels, logits)


def test_a_batch_that_is_not_two_copies_stops_fit_or_raises():
    """Compiled steps (TensorFlow, JAX) cannot raise: the loss is NaN and TerminateOnNaN
    stops at the first batch. PyTorch runs the step eagerly, and the loss raises."""
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(tiny_config())
    model.compile(optimizer="sgd", loss=RDropCrossEntropy())
    inputs, labels = pairs()

    def fit():
        model.fit(inputs, labels, batch_size=4, epochs=1, shuffle=False, verbose=0,
                  callbacks=[keras.callbacks.TerminateOnNaN()])

    if keras.backend.backend() == "torch":
        with pytest.raises(ValueError, match="the labels' halves differ"):
            fit()
        return
    fit()
    assert int(to_numpy(model.optimizer.iterations)) == 1  # of 3 batches
    assert math.isnan(model.history.history["loss"][0])


def pairs(rows=12, length=5):
    rng = np.random.default_rng(1)
    labels = rng.integers(4, 32, (rows, length)).astype("int32")
    labels[::3, -2:] = 0  # some padding
    decoder = np.concatenate([np.full((rows, 1), BOS_ID, "int32"), labels[:, :-1]], axis=1)
    inputs = {"encoder_inputs": rng.integers(4, 32, (rows, length)).astype("int32"), "decoder_inputs": decoder}
    return inputs, labels


def test_duplicate_batches_holds_each_example_twice_in_the_two_halves():
    inputs, labels = pairs()
    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(5)
    doubled = duplicate_batches(dataset)
    assert int(doubled.cardinality()) == int(dataset.cardinality()) == 3
    for (x, y), (x2, y2) in zip(dataset, doubled):
        rows = y.shape[0]
        assert y2.shape[0] == 2 * rows
        np.testing.assert_array_equal(y2[:rows], y)
        np.testing.assert_array_equal(y2[rows:], y)
        for key in x:
            np.testing.assert_array_equal(x2[key][:rows], x[key])
            np.testing.assert_array_equal(x2[key][rows:], x[key])
    with pytest.raises(ValueError, match=r"must be a tf.data.Dataset of batches. Received: tuple"):
        duplicate_batches((inputs, labels))


def test_the_two_copies_get_different_dropout_in_training_and_agree_without():
    """R-Drop's premise, on the model: each row draws its own dropout masks."""
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(tiny_config(dropout=0.1, attention_dropout=0.1, activation_dropout=0.1))
    inputs, _ = pairs(rows=3)
    twice = {key: np.concatenate([value] * 2) for key, value in inputs.items()}
    training = to_numpy(model(twice, training=True))
    assert np.abs(training[:3] - training[3:]).max() > 1e-3
    inference = to_numpy(model(twice, training=False))
    np.testing.assert_allclose(inference[:3], inference[3:], rtol=1e-5, atol=1e-6)


def test_evaluation_on_copies_reads_the_plain_cross_entropy():
    """Without dropout the copies agree, so validation loss is comparable with runs without R-Drop."""
    keras.utils.set_random_seed(0)
    model = kt.build_transformer(tiny_config(dropout=0.1, attention_dropout=0.1))
    inputs, labels = pairs()
    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(4)
    kt.compile_transformer(model, kt.TrainingConfig(), jit_compile=False)
    plain = model.evaluate(dataset, verbose=0, return_dict=True)
    kt.compile_transformer(model, kt.TrainingConfig(rdrop_alpha=5.0), jit_compile=False)
    assert isinstance(model.loss, RDropCrossEntropy) and model.loss.alpha == 5.0
    doubled = model.evaluate(duplicate_batches(dataset), verbose=0, return_dict=True)
    assert doubled["loss"] == pytest.approx(plain["loss"], rel=1e-5)


def test_training_with_rdrop_lowers_the_gap_between_the_copies():
    """The KL term is trained: after the same updates, the two dropout passes of a model
    trained with alpha 5 disagree less than those of one trained without."""
    inputs, labels = pairs(rows=24)
    dataset = duplicate_batches(tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(6))
    gaps = {}
    for alpha in (0.0, 5.0):
        keras.utils.set_random_seed(0)
        model = kt.build_transformer(tiny_config(dropout=0.3))
        training = kt.TrainingConfig(warmup_steps=4, learning_rate_scale=3.0)
        # Without R-Drop the copies are two ordinary examples each: the same updates' data.
        loss = RDropCrossEntropy(alpha=alpha) if alpha else kt.LabelSmoothedCrossEntropy()
        kt.compile_transformer(model, training, jit_compile=False)
        model.compile(optimizer=model.optimizer, loss=loss, jit_compile=False)
        model.fit(dataset, epochs=8, verbose=0)
        twice = {key: np.concatenate([value] * 2) for key, value in inputs.items()}
        kl = [to_numpy(symmetric_kl(*np.split(to_numpy(model(twice, training=True)), 2))) for _ in range(3)]
        gaps[alpha] = float(np.mean(np.mean(kl, axis=0)[labels != 0]))
    assert gaps[5.0] < 0.7 * gaps[0.0], gaps


def test_make_loss_and_serialization():
    assert type(make_loss(kt.TrainingConfig())).__name__ == "LabelSmoothedCrossEntropy"
    loss = make_loss(kt.TrainingConfig(rdrop_alpha=2.5, label_smoothing=0.2))
    assert (loss.alpha, loss.label_smoothing) == (2.5, 0.2)
    again = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(again, RDropCrossEntropy) and again.get_config() == loss.get_config()


def test_a_run_on_several_replicas_is_refused_before_it_writes():
    from keras_transformer.train.run import check_rdrop_replicas

    check_rdrop_replicas(kt.TrainingConfig(rdrop_alpha=5.0), 1)
    check_rdrop_replicas(kt.TrainingConfig(), 8)
    with pytest.raises(ValueError, match=r"Received: rdrop_alpha=5.0, replicas=2"):
        check_rdrop_replicas(kt.TrainingConfig(rdrop_alpha=5.0), 2)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: kt.TrainingConfig(rdrop_alpha=-1.0), r"rdrop_alpha"),
        (lambda: RDropCrossEntropy(alpha=0.0), r"`alpha` must be a finite number > 0. Received: alpha=0.0"),
    ],
    ids=["config", "loss"],
)
def test_bad_alphas_name_what_was_received(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@once_on("torch", "the run's duplication is tf.data and Python, the same on every backend "
         "(the loss inside compiled steps is tested above on every backend)")
def test_a_run_with_rdrop_reads_each_batch_twice_and_trains(tmp_path):
    from keras_transformer.data.tokenizer import train_tokenizer
    from keras_transformer.train.run import make_datasets, run_training
    from keras_transformer.train.run_config import RunConfig

    english, german = "red blue green black white small big old".split(), "rot blau gruen schwarz weiss klein gross alt".split()
    rng = np.random.default_rng(0)
    chosen = [rng.integers(0, 8, size=1 + i % 3) for i in range(60)]
    train = [(" ".join(english[w] for w in words), " ".join(german[w] for w in words)) for words in chosen]
    splits = {"train": train, "validation": train[:6]}
    tokenizer = train_tokenizer([side for pair in train for side in pair], 32)
    values = dict(vocab_size=32, tokens_per_batch=64, bucket_width=16, model={"max_length": 16})
    plain, rdrop = RunConfig(**values), RunConfig(training={"rdrop_alpha": 5.0}, **values)
    batches = {}
    for name, config in (("plain", plain), ("rdrop", rdrop)):
        datasets = make_datasets(config, config.model_config(32), splits, tokenizer)
        batches[name] = [(x, y) for x, y in datasets.train], [y for _, y in datasets.validation]
    assert len(batches["rdrop"][0]) == len(batches["plain"][0])
    for (x, y), (x2, y2) in zip(*(sorted(batches[name][0], key=lambda b: tuple(to_numpy(b[1]).ravel()))
                                  for name in ("plain", "rdrop"))):
        np.testing.assert_array_equal(y2, np.concatenate([y, y]))  # the same batches, each twice
    assert [y.shape[0] for y in batches["rdrop"][1]] == [2 * y.shape[0] for y in batches["plain"][1]]

    for split, rows in (("train", train), ("val", train[:6])):
        (tmp_path / f"{split}.en").write_text("".join(source + "\n" for source, _ in rows))
        (tmp_path / f"{split}.de").write_text("".join(target + "\n" for _, target in rows))
    config = rdrop.replace(
        name="rdrop", output_dir=str(tmp_path / "out"), corpus="files", data_dir=str(tmp_path),
        validation_split="val", test_split="", epochs=2, verbose=0, bleu_every_epochs=0,
        sample_translations=0, keep_checkpoints=1, jit_compile=False,
        model=dict(max_length=16, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1,
                   num_decoder_layers=1, dropout=0.1),
    )
    result = run_training(config)
    assert isinstance(result.model.loss, RDropCrossEntropy)
    assert result.steps == 2 * result.steps_per_epoch == 2 * len(batches["plain"][0])
    assert np.isfinite(result.history.history["val_loss"]).all()
