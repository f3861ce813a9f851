"""Tests of compile_transformer / make_optimizer, a real fit, and train() end to end."""

import csv
import json
import os

import keras
import numpy as np
import pytest
from conftest import once_on, tiny_config

import keras_transformer as kt
from keras_transformer.train.losses import LabelSmoothedCrossEntropy
from keras_transformer.train.metrics import MaskedAccuracy, Perplexity
from keras_transformer.train.schedules import TransformerSchedule
from keras_transformer.special_tokens import BOS_ID, EOS_ID
from keras_transformer.train.compile import compile_transformer, make_optimizer


def quick_jit_compile():
    """The fastest `jit_compile` for a few steps: XLA compiling costs more than it saves
    on TensorFlow, but without it JAX runs eagerly, op by op, which is slower still."""
    return "auto" if keras.backend.backend() == "jax" else False


def copy_task(num_examples=64, length=5, vocab_size=32, seed=0):
    """Inputs and labels of a toy task: the target is the source reversed."""
    rng = np.random.default_rng(seed)
    source = rng.integers(4, vocab_size, size=(num_examples, length)).astype("int32")
    target = source[:, ::-1]
    bos = np.full((num_examples, 1), BOS_ID, "int32")
    eos = np.full((num_examples, 1), EOS_ID, "int32")
    inputs = {
        "encoder_inputs": np.concatenate([source, eos], axis=1),
        "decoder_inputs": np.concatenate([bos, target], axis=1),
    }
    return inputs, np.concatenate([target, eos], axis=1)


def test_make_optimizer_uses_the_config():
    training = kt.TrainingConfig(
        warmup_steps=4, learning_rate_scale=2.0, adam_beta_1=0.8,
        adam_beta_2=0.97, adam_epsilon=1e-7, clipnorm=1.5,
    )
    optimizer = make_optimizer(16, training)
    assert isinstance(optimizer, keras.optimizers.Adam)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.8, 0.97, 1e-7)
    assert optimizer.clipnorm == 1.5
    schedule = optimizer._learning_rate
    assert isinstance(schedule, TransformerSchedule)
    assert (schedule.d_model, schedule.warmup_steps, schedule.scale) == (16, 4, 2.0)
    # Peak at the paper's step 4 (iteration 3): 2 * (16 * 4) ** -0.5 = 0.25.
    assert float(keras.ops.convert_to_numpy(schedule(3))) == pytest.approx(0.25)


def test_make_optimizer_defaults_are_the_papers():
    optimizer = make_optimizer(512)
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert optimizer.clipnorm is None
    assert optimizer.weight_decay is None


@pytest.mark.parametrize("weight_decay", [0.0, 0.25])
def test_weight_decay_shrinks_each_weight_by_learning_rate_times_decay(weight_decay):
    # A zero gradient makes Adam's own step zero (m = v = 0), so what moves the weight is
    # the decoupled decay alone: w * (1 - lr * weight_decay), lr the schedule's first value.
    optimizer = make_optimizer(16, kt.TrainingConfig(warmup_steps=4, weight_decay=weight_decay))
    weight = keras.Variable(np.array([2.0, -4.0], "float32"))
    optimizer.apply_gradients([(keras.ops.zeros((2,)), weight)])
    learning_rate = 16**-0.5 * 4**-1.5  # eq. 3 at step 1: 0.03125
    expected = np.array([2.0, -4.0]) * (1 - learning_rate * weight_decay)
    np.testing.assert_allclose(keras.ops.convert_to_numpy(weight), expected, rtol=1e-6)


@pytest.mark.parametrize(
    "weight_decay, message",
    [
        (-0.1, r"must be a number in \[0, 1\)\. Received: weight_decay=-0.1"),
        (1.0, r"must be a number in \[0, 1\)\. Received: weight_decay=1.0"),
        ("0.1", r"must be of type finite float\. Received: weight_decay='0.1' \(type str\)"),
        (None, r"must be of type finite float\. Received: weight_decay=None"),
    ],
)
def test_weight_decay_outside_zero_to_one_is_refused(weight_decay, message):
    with pytest.raises(ValueError, match="`weight_decay` " + message):
        kt.TrainingConfig(weight_decay=weight_decay)


def test_compile_transformer_sets_loss_metrics_and_optimizer():
    model = compile_transformer(kt.build_transformer(tiny_config()), kt.TrainingConfig(label_smoothing=0.2))
    assert isinstance(model.loss, LabelSmoothedCrossEntropy)
    assert model.loss.label_smoothing == 0.2
    assert isinstance(model.optimizer, keras.optimizers.Adam)
    metrics = model._compile_metrics._user_metrics
    assert [type(m) for m in metrics] == [MaskedAccuracy, Perplexity]


@pytest.mark.parametrize("where", ["global_policy", "config"])
def test_mixed_float16_wraps_the_optimizer_for_loss_scaling(where):
    if keras.backend.backend() == "jax":
        import jax

        if jax.default_backend() == "cpu":
            pytest.skip("mixed_float16 cannot run on JAX on CPU (XLA:CPU has no float16 matmul)")
    if where == "global_policy":
        keras.config.set_dtype_policy("mixed_float16")
        config = tiny_config()
    else:
        config = tiny_config(dtype_policy="mixed_float16")
    model = compile_transformer(kt.build_transformer(config))
    assert isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer)
    assert isinstance(model.optimizer.inner_optimizer._learning_rate, TransformerSchedule)


def test_float32_and_bfloat16_are_not_loss_scaled():
    for policy in ("float32", "mixed_bfloat16"):
        config = tiny_config(dtype_policy=policy)
        model = compile_transformer(kt.build_transformer(config))
        assert not isinstance(model.optimizer, keras.optimizers.LossScaleOptimizer), policy


def test_compile_transformer_refuses_bad_arguments():
    model = kt.build_transformer(tiny_config())
    with pytest.raises(ValueError, match="jit_compile.*Received: jit_compile='yes'"):
        compile_transformer(model, jit_compile="yes")
    with pytest.raises(ValueError, match="steps_per_execution.*Received: steps_per_execution=0"):
        compile_transformer(model, steps_per_execution=0)
    with pytest.raises(ValueError, match="must be a TrainingConfig or None. Received: dict"):
        compile_transformer(model, {"d_model": 16})
    # The model's config no longer carries the recipe: a clear error, not a silent default.
    with pytest.raises(ValueError, match="Expected a TrainingConfig; received the model's TransformerConfig"):
        compile_transformer(model, model.config)
    with pytest.raises(ValueError, match="must be a keras_transformer.Transformer"):
        compile_transformer(keras.Sequential([keras.layers.Dense(1)]))


def test_two_epoch_fit_lowers_the_loss():
    model = compile_transformer(
        kt.build_transformer(tiny_config()),
        kt.TrainingConfig(warmup_steps=4, learning_rate_scale=0.1),
        jit_compile=quick_jit_compile(),
    )
    inputs, labels = copy_task()
    steps_run = []  # Python calls of train_step: traces on TensorFlow and JAX, steps on PyTorch
    real_train_step = model.train_step
    model.train_step = lambda *args: steps_run.append(1) or real_train_step(*args)
    history = model.fit(inputs, labels, batch_size=8, epochs=2, verbose=0, shuffle=False)
    losses = history.history["loss"]
    assert losses[1] < losses[0] - 0.05, losses
    assert history.history["perplexity"][1] < history.history["perplexity"][0]
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 16
    # One trace for batches of one shape: on TensorFlow the optimizer's slots are made before
    # the first trace (Transformer.fit), or tf.function would trace the step twice.
    assert len(steps_run) == (16 if keras.backend.backend() == "torch" else 1)


# ------------------------------------------------------------- train() end to end
SOURCE_WORDS = "red blue green black white small big old new one two three".split()
TARGET_WORDS = "rot blau gruen schwarz weiss klein gross alt neu eins zwei drei".split()


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    """Parallel files of 1-2 word toy pairs (target reversed): 100 train, 8 validation."""
    rng = np.random.default_rng(0)
    directory = tmp_path_factory.mktemp("corpus")
    for split, count in (("train", 100), ("validation", 8)):
        words = [rng.integers(0, 12, size=1 + i % 2) for i in range(count)]
        (directory / f"{split}.en").write_text(
            "".join(" ".join(SOURCE_WORDS[w] for w in ws) + "\n" for ws in words)
        )
        (directory / f"{split}.de").write_text(
            "".join(" ".join(TARGET_WORDS[w] for w in ws[::-1]) + "\n" for ws in words)
        )
    return directory


def test_train_writes_every_artifact(corpus_dir, tmp_path, capsys, monkeypatch):
    from keras_transformer.model.directory import (
        CHECKPOINT_DIR, CONFIG_FILE, CSV_LOG_FILE, CURVES_FILE, MANIFEST_FILE, MODEL_FILE, TOKENIZER_FILE,
    )
    from keras_transformer.train import run
    from keras_transformer.train.run import run_training
    from keras_transformer.train.run_config import RunConfig
    from keras_transformer.data.tokenizer import SubwordTokenizer

    # The summary prints the run's jit_compile note (its text: test_jit_compile_false_on_jax_is_noted).
    monkeypatch.setattr(run, "jit_compile_note", lambda jit_compile: f"note for jit_compile={jit_compile}")

    run_config = RunConfig(
        name="tiny",
        output_dir=str(tmp_path),
        corpus="files",
        data_dir=str(corpus_dir),
        train_split="train",
        validation_split="validation",
        test_split="",
        vocab_size=64,
        epochs=1,
        bleu_samples=4,
        sample_translations=0,
        jit_compile=quick_jit_compile(),
        verbose=0,
        model=dict(
            d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
            # max_length 8: one bucket, so one compiled train step (JAX compiles are slow).
            max_length=8, dropout=0.0,
        ),
        tokens_per_batch=256,
    )
    model_dir = run_training(run_config).model_dir
    assert model_dir == os.path.join(str(tmp_path), "tiny")
    out = capsys.readouterr().out
    assert "parameters" in out and "steps per epoch" in out and "tokens per batch" in out
    assert f"note for jit_compile={quick_jit_compile()}" in out

    model = keras.saving.load_model(os.path.join(model_dir, MODEL_FILE), safe_mode=True)
    assert isinstance(model, kt.Transformer)
    tokenizer = SubwordTokenizer.load(os.path.join(model_dir, TOKENIZER_FILE))
    assert tokenizer.vocab_size == model.config.vocab_size == 64
    assert RunConfig.from_toml(os.path.join(model_dir, CONFIG_FILE)).model_config() == model.config
    with open(os.path.join(model_dir, CSV_LOG_FILE)) as file:
        rows = list(csv.DictReader(file))
    assert len(rows) == 1
    for column in ("loss", "val_loss", "masked_accuracy", "perplexity", "learning_rate", "val_bleu"):
        assert column in rows[0]
    assert 0.0 <= float(rows[0]["val_bleu"]) <= 100.0
    assert os.path.getsize(os.path.join(model_dir, CURVES_FILE)) > 5000
    assert os.listdir(os.path.join(model_dir, CHECKPOINT_DIR)) == ["epoch_001.weights.h5"]
    assert not os.path.exists(os.path.join(model_dir, "backup"))  # deleted once the run is saved
    with open(os.path.join(model_dir, MANIFEST_FILE)) as file:
        assert json.load(file)["tokenizer_sha256"] == tokenizer.fingerprint
    assert os.listdir(tmp_path) == ["tiny"]  # staged beside it, renamed into place, nothing left


def test_plot_training_curves_reads_a_csv_log_with_missing_values(tmp_path):
    from keras_transformer.train.curves import plot_training_curves, read_csv_log

    csv_path = tmp_path / "log.csv"
    csv_path.write_text(
        "epoch,learning_rate,loss,val_bleu,val_loss\n"
        "0,0.001,3.0,12.5,3.2\n"
        "1,0.0007,2.0,NA,2.4\n"
        "2,0.0005,1.5,30.0,2.0\n"
    )
    columns = read_csv_log(csv_path)
    assert columns["loss"] == [3.0, 2.0, 1.5]
    assert np.isnan(columns["val_bleu"][1]) and columns["val_bleu"][2] == 30.0
    png = plot_training_curves(csv_path, tmp_path / "plots" / "curves.png")
    with open(png, "rb") as file:
        assert file.read(8) == b"\x89PNG\r\n\x1a\n"
    assert os.path.getsize(png) > 5000
    (tmp_path / "other.csv").write_text("epoch,foo\n0,1\n")
    with pytest.raises(ValueError, match=r"none of the columns plotted.*Received columns: \['epoch', 'foo'\]"):
        plot_training_curves(tmp_path / "other.csv", tmp_path / "x.png")


def test_log_axes_label_minor_ticks_only_within_a_decade():
    """Over several decades the minor labels (2-9 x 10^k) would overprint each other."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    from keras_transformer.train.curves import _log_scale

    figure = Figure()
    wide, narrow = figure.add_subplot(1, 2, 1), figure.add_subplot(1, 2, 2)
    _log_scale(wide, [([1e-3, 1e-5, float("nan"), 2e-8], "lr")])
    _log_scale(narrow, [([9.0, 5.5, 3.2], "train"), ([8.0, 6.0], "validation")])
    assert wide.get_yscale() == narrow.get_yscale() == "log"
    assert isinstance(wide.yaxis.get_minor_formatter(), NullFormatter)
    assert narrow.yaxis.get_minor_formatter()(4.0) == "4"
    assert wide.yaxis.get_major_formatter()(1e-5) == narrow.yaxis.get_major_formatter()(1e-5) == "1e-05"


# ------------------------------------------------- an existing model directory
def _finished_run(directory, config_text="earlier run"):
    directory.mkdir(parents=True)
    for name in ("model.keras", "tokenizer.model", "metrics.json", "training_log.csv"):
        (directory / name).write_text("earlier run")
    (directory / "config.toml").write_text(config_text)
    (directory / "checkpoints").mkdir()
    (directory / "1").mkdir()  # a TF Serving export of the earlier model
    (directory / "notes.txt").write_text("the user's own file")


def _staged_run(directory, config, *, backup=True, manifest=False):
    """What a run of `config` leaves in its staging directory when it is killed."""
    directory.mkdir(parents=True)
    (directory / "config.toml").write_text(config.to_toml(config.model_config()))
    kt.train_tokenizer(SOURCE_WORDS + TARGET_WORDS, vocab_size=24).save(str(directory))
    (directory / "model.keras").write_text("the new run")
    if backup:
        (directory / "backup").mkdir()
    if manifest:
        (directory / "manifest.json").write_text("{}")


def test_a_finished_run_is_refused_and_replaced_whole_only_on_request(tmp_path):
    from keras_transformer.train.run_directory import plan_model_directory, replace_with_staged_run
    from keras_transformer.train.run_config import RunConfig

    _finished_run(tmp_path / "demo")
    config = RunConfig(name="demo", output_dir=str(tmp_path))
    with pytest.raises(FileExistsError, match=r"already holds a finished run \(1, checkpoints, config.toml"):
        plan_model_directory(config)
    assert (tmp_path / "demo" / "model.keras").read_text() == "earlier run"  # untouched

    plan = plan_model_directory(config.replace(overwrite=True))
    assert (plan.target, plan.staging, plan.resuming) == (
        str(tmp_path / "demo"), str(tmp_path / ".demo.staging"), False)
    assert plan.replaces == ("1", "checkpoints", "config.toml", "metrics.json", "model.keras",
                             "tokenizer.model", "training_log.csv")
    assert plan.keeps == ("notes.txt",)
    assert (tmp_path / "demo" / "model.keras").read_text() == "earlier run"  # planning reads only

    _staged_run(tmp_path / ".demo.staging", config, manifest=True)
    replace_with_staged_run(plan.staging, plan.target)
    assert sorted(os.listdir(tmp_path)) == ["demo"]  # no staging, no retired run left
    assert sorted(os.listdir(tmp_path / "demo")) == [
        "config.toml", "manifest.json", "model.keras", "notes.txt", "tokenizer.model"]
    assert (tmp_path / "demo" / "model.keras").read_text() == "the new run"
    assert (tmp_path / "demo" / "notes.txt").read_text() == "the user's own file"


def test_an_interrupted_run_resumes_only_with_the_same_settings(tmp_path):
    from keras_transformer.train.run_directory import plan_model_directory
    from keras_transformer.train.run_config import RunConfig

    config = RunConfig(name="demo", output_dir=str(tmp_path), epochs=3)
    _staged_run(tmp_path / ".demo.staging", config)
    # What a resumed run may change: epochs, time budget, logging, strategy.
    same = config.replace(epochs=5, max_train_seconds=60.0, verbose=0, strategy="", overwrite=False)
    plan = plan_model_directory(same)
    assert plan.resuming and plan.staging == str(tmp_path / ".demo.staging") and not plan.discards

    other = config.with_overrides(["model.d_model=32", "training.warmup_steps=10", "seed=1"])
    message = (r"holds an interrupted run of other settings \(model.d_model: 64 there, 32 now; "
               r"seed: 0 there, 1 now; training.warmup_steps: 4000 there, 10 now\)")
    with pytest.raises(ValueError, match=message):
        plan_model_directory(other)
    plan = plan_model_directory(other.replace(overwrite=True))
    assert not plan.resuming and "discarded, as overwrite is true" in plan.discards
    assert os.path.isdir(tmp_path / ".demo.staging" / "backup")  # discarded only once it writes


def test_an_interrupted_run_without_a_backup_starts_again(tmp_path):
    from keras_transformer.train.run_directory import plan_model_directory
    from keras_transformer.train.run_config import RunConfig

    config = RunConfig(name="demo", output_dir=str(tmp_path))
    _staged_run(tmp_path / ".demo.staging", config.replace(seed=7), backup=False)  # killed in epoch 1
    plan = plan_model_directory(config)
    assert not plan.resuming and "finished no epoch: started again" in plan.discards


def test_a_run_interrupted_in_place_by_an_earlier_version_resumes_there(tmp_path):
    from keras_transformer.train.run_directory import plan_model_directory
    from keras_transformer.train.run_config import RunConfig

    config = RunConfig(name="demo", output_dir=str(tmp_path))
    _finished_run(tmp_path / "demo", config.to_toml(config.model_config()))
    (tmp_path / "demo" / "backup").mkdir()
    plan = plan_model_directory(config)
    assert plan.resuming and plan.in_place and plan.staging == str(tmp_path / "demo")
    assert (tmp_path / "demo" / "model.keras").read_text() == "earlier run"
    with pytest.raises(ValueError, match=r"interrupted run of other settings \(vocab_size: 8000 there, 64 now\)"):
        plan_model_directory(config.replace(vocab_size=64))


@pytest.mark.parametrize("name", ["", ".", "..", ".hidden", "a/b", "/abs", "a\\b", "a\0b"])
def test_a_name_that_is_not_a_plain_directory_name_is_refused(name, monkeypatch):
    from keras_transformer.train.run_config import RunConfig

    monkeypatch.setattr(os, "altsep", "\\")  # as on Windows: a\b would leave output_dir
    with pytest.raises(ValueError, match="`name` must be a plain directory name"):
        RunConfig(name=name)
    with pytest.raises(ValueError, match="`name` must be a plain directory name"):
        RunConfig().with_overrides([f"name={name}"])


def test_a_token_budget_below_the_largest_bucket_is_refused_with_the_config():
    from keras_transformer.train.run_config import RunConfig

    message = (r"`tokens_per_batch` must be an integer >= the largest bucket boundary \(64\), "
               r"so the longest example fits in a batch. Received: tokens_per_batch=32")
    with pytest.raises(ValueError, match=message):
        RunConfig(model={"max_length": 64}, tokens_per_batch=32)
    with pytest.raises(ValueError, match=message):
        RunConfig(model={"max_length": 64}).with_overrides(["tokens_per_batch=32"])
    assert RunConfig(model={"max_length": 64}, tokens_per_batch=64, bucket_width=24).bucket_boundaries() == [24, 48, 64]


@once_on("torch", "Keras' epoch iterator warns, from the arguments our fit passes: the same on every backend")
def test_fit_on_a_dataset_does_not_warn_about_shuffle():
    import warnings

    import tensorflow as tf

    model = compile_transformer(kt.build_transformer(tiny_config()), jit_compile=quick_jit_compile())
    inputs, labels = copy_task()
    dataset = tf.data.Dataset.from_tensor_slices((inputs, labels)).batch(8)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(dataset, epochs=1, verbose=0)
    assert not [w for w in caught if "shuffle" in str(w.message)]
    # An explicit shuffle=True is the user's to make: Keras' own warning then stands.
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model.fit(dataset, epochs=1, verbose=0, shuffle=True)
    assert [w for w in caught if "shuffle=True" in str(w.message)]


def test_jit_compile_false_on_jax_is_noted():
    from keras_transformer.train.run import jit_compile_note

    # A config's `jit_compile = false` means plain graphs on TensorFlow; JAX has only XLA.
    note = jit_compile_note(False, backend="jax")
    assert note.startswith("jit_compile=false: JAX runs every training step eagerly")
    assert "--set jit_compile=auto" in note
    for jit_compile, backend in ((False, "tensorflow"), (False, "torch"), ("auto", "jax"), (True, "jax")):
        assert jit_compile_note(jit_compile, backend=backend) is None
    assert jit_compile_note(False) == (note if keras.backend.backend() == "jax" else None)  # this session's


def test_jit_compile_true_is_accepted_on_every_backend():
    # On PyTorch it trains through the captured step (tests/test_torch_step.py), as "auto" does.
    model = kt.build_transformer(kt.TransformerConfig.from_preset("tiny", vocab_size=50))
    kt.compile_transformer(model, jit_compile=True)
    assert model.compiled
    captured = model.captured_train_step
    assert (captured is not None) == (keras.backend.backend() == "torch")
