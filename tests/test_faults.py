"""Faults: crashes mid-write, a SIGKILL mid-epoch, a NaN mid-training, a run refused late,
a damaged or mismatched model directory. Nothing good is lost, nothing wrong is used.

Each test makes one fault happen on purpose and checks what survives it: the previous
export or file, whole and loadable; the training run, resumed from its backup to the
same number of optimizer steps as a run that was never killed; the checkpoints written
before a NaN; the model directory a refused run was pointed at, byte for byte; a
tokenizer that is not the model's, or a cut file, refused with its name.
tests/test_fault_injection.py kills whole training runs at random points.
docs/errors_and_limits.md lists the same cases.
"""

import json
import os
import shutil
import signal
import sys
import textwrap

import keras
import numpy as np
import pytest
from conftest import once_on, tiny_config, to_numpy, tree_digest
from tiny_reliability import greedy_export, tiny_dir  # noqa: F401  (session fixtures)
from zygote import Zygote

import keras_transformer as kt
from keras_transformer import atomic
from keras_transformer.model import directory as model_directory
from keras_transformer.train.callbacks import KeepLastCheckpoints, default_callbacks
from keras_transformer.train.checkpoints import latest_checkpoints, save_final_model


class SimulatedCrash(OSError):
    """What the patched writers raise after writing part of their file."""


def write_part_then_crash(path):
    """Stands in for a save: writes the first bytes of a file to `path`, then dies."""
    with open(path, "wb") as file:
        file.write(b"\x89HDF\r\n\x1a\n" + b"\0" * 56)  # an HDF5 signature and no more
    raise SimulatedCrash(f"simulated crash while writing {path}")


def all_finite(model):
    return all(np.all(np.isfinite(to_numpy(weight))) for weight in model.weights)


# ---------------------------------------------------------------- crashes while writing
def test_export_crash_mid_write_keeps_the_previous_version(greedy_export, tiny_dir, monkeypatch):
    import tensorflow as tf

    from keras_transformer.inference import export

    base, version_1 = greedy_export
    model_base = os.path.dirname(version_1)
    before = tree_digest(version_1)
    served = tf.saved_model.load(version_1).signatures["serving_default"]
    text = tf.constant(["cats see cars", "dogs paint bread"])
    translations = served(text=text)["translation"].numpy().tolist()

    real_save = tf.saved_model.save

    def save_part_then_crash(module, directory, **kwargs):
        real_save(module, directory, **kwargs)
        with open(os.path.join(directory, "saved_model.pb"), "r+b") as file:
            file.truncate(100)  # the graph half-written
        raise SimulatedCrash("simulated crash while writing the SavedModel")

    monkeypatch.setattr(tf.saved_model, "save", save_part_then_crash)
    with pytest.raises(SimulatedCrash):
        export.export_saved_model(
            tiny_dir, base_dir=str(base), name="tiny", version=1, overwrite=True, beam_size=1, ids_only=True
        )
    monkeypatch.undo()

    assert os.listdir(model_base) == ["1"]  # no temporary left behind
    assert tree_digest(version_1) == before
    reloaded = tf.saved_model.load(version_1).signatures["serving_default"]
    assert reloaded(text=text)["translation"].numpy().tolist() == translations


def _crashing_method(self, path, *args, **kwargs):
    write_part_then_crash(path)


def _saved_model_crash(model, monkeypatch):
    monkeypatch.setattr(type(model), "save", _crashing_method)


def _saved_weights_crash(model, monkeypatch):
    monkeypatch.setattr(type(model), "save_weights", _crashing_method)


def _tokenizer_crash(tokenizer, monkeypatch):
    # write_bytes_atomically's `open` of its temporary file writes part, then dies.
    monkeypatch.setattr(atomic, "open", lambda path, mode: write_part_then_crash(path), raising=False)


@pytest.mark.parametrize("what", ["model_keras", "weights_h5", "tokenizer_model"])
def test_file_crash_mid_write_keeps_the_previous_file(tmp_path, tiny_dir, monkeypatch, what):
    """model.keras, checkpoints and tokenizer.model are written beside and renamed."""
    from keras_transformer.data.tokenizer import SubwordTokenizer

    model = kt.build_transformer(tiny_config())
    tokenizer = SubwordTokenizer.load(tiny_dir)
    path = str(tmp_path / {"model_keras": "model.keras", "weights_h5": "epoch_001.weights.h5",
                            "tokenizer_model": "tokenizer.model"}[what])
    write, crash = {
        "model_keras": (lambda: atomic.save_model_atomically(model, path), _saved_model_crash),
        "weights_h5": (lambda: atomic.save_weights_atomically(model, path), _saved_weights_crash),
        "tokenizer_model": (lambda: tokenizer.save(str(tmp_path)), _tokenizer_crash),
    }[what]
    write()
    with open(path, "rb") as file:
        before = file.read()

    crash(model if what != "tokenizer_model" else tokenizer, monkeypatch)
    with pytest.raises(SimulatedCrash):
        write()
    monkeypatch.undo()

    assert os.listdir(tmp_path) == [os.path.basename(path)]  # the temporary file is gone
    with open(path, "rb") as file:
        assert file.read() == before
    if what == "model_keras":
        keras.saving.load_model(path, safe_mode=True)
    elif what == "weights_h5":
        model.load_weights(path)
    else:
        assert SubwordTokenizer.load(path).model_proto == tokenizer.model_proto


def test_plain_keras_save_loses_the_previous_file_on_a_crash(tmp_path, monkeypatch):
    """Why the package renames: Keras truncates the old file before writing the new one."""
    model = kt.build_transformer(tiny_config())
    path = str(tmp_path / "epoch_001.weights.h5")
    model.save_weights(path)
    _saved_weights_crash(model, monkeypatch)
    with pytest.raises(SimulatedCrash):
        model.save_weights(path)
    monkeypatch.undo()
    with pytest.raises(Exception):
        model.load_weights(path)


def test_checkpoint_crash_mid_write_leaves_only_whole_checkpoints(tmp_path, monkeypatch):
    model = kt.build_transformer(tiny_config())
    keeper = KeepLastCheckpoints(str(tmp_path), keep=5)
    keeper.set_model(model)
    keeper.on_epoch_end(0, {"loss": 1.0})
    _saved_weights_crash(model, monkeypatch)
    with pytest.raises(SimulatedCrash):
        keeper.on_epoch_end(1, {"loss": 0.9})
    monkeypatch.undo()
    newest = latest_checkpoints(str(tmp_path))
    assert [os.path.basename(path) for path in newest] == ["epoch_001.weights.h5"]
    model.load_weights(newest[-1])


# ---------------------------------------------------------------- NaN mid-training
POISON_STEP = 6  # second batch of the second epoch: after epoch 1's checkpoint
STEPS_PER_EPOCH = 4
EPOCHS = 3


def tiny_fit_data():
    """16 examples of length 6: 4 steps per epoch at batch size 4."""
    rng = np.random.default_rng(0)
    inputs = {
        "encoder_inputs": rng.integers(4, 32, (16, 6)).astype("int32"),
        "decoder_inputs": rng.integers(4, 32, (16, 6)).astype("int32"),
    }
    return inputs, rng.integers(4, 32, (16, 6)).astype("int32")


class PoisonWeights(keras.callbacks.Callback):
    """Writes a NaN into the embedding after optimizer step `step`."""

    def __init__(self, step):
        super().__init__()
        self.step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(to_numpy(self.model.optimizer.iterations)) == self.step:
            weight = self.model.get_layer("token_embedding").embeddings
            values = np.array(to_numpy(weight))
            values[5, 0] = np.nan
            weight.assign(values)


@pytest.fixture(scope="module")
def nan_run(tmp_path_factory):
    """A 3-epoch fit with the default callbacks whose weights turn NaN after step 6."""
    keras.utils.set_random_seed(0)
    config = tiny_config()
    model = kt.build_transformer(config)
    # A plain graph on TensorFlow (XLA compiles slowly); jit on JAX (eager JAX is slower).
    kt.compile_transformer(model, kt.TrainingConfig(warmup_steps=4), jit_compile=keras.backend.backend() == "jax")
    model_dir = str(tmp_path_factory.mktemp("nan_run"))
    callbacks = [PoisonWeights(POISON_STEP)] + default_callbacks(model_dir, tensorboard=False)
    inputs, labels = tiny_fit_data()
    try:
        history = model.fit(inputs, labels, batch_size=4, epochs=EPOCHS, callbacks=callbacks, verbose=0, shuffle=False)
    except RuntimeError as error:  # TerminateOnNaN(raise_error=True) stops by raising
        history = error
    return model, model_dir, history


def test_nan_loss_stops_training_at_the_step_it_appears(nan_run):
    model, _, history = nan_run
    # Step 7 is the first with a NaN loss; TerminateOnNaN stops right after it.
    assert int(to_numpy(model.optimizer.iterations)) == POISON_STEP + 1 < EPOCHS * STEPS_PER_EPOCH
    if not isinstance(history, RuntimeError):
        assert len(history.history["loss"]) == 2 and np.isnan(history.history["loss"][1])


def test_after_a_nan_stop_the_newest_checkpoint_is_the_last_good_one(nan_run):
    model, model_dir, _ = nan_run
    newest = latest_checkpoints(os.path.join(model_dir, model_directory.CHECKPOINT_DIR))
    assert [os.path.basename(path) for path in newest] == ["epoch_001.weights.h5"]
    fresh = kt.build_transformer(model.config)
    fresh.load_weights(newest[-1])
    assert all_finite(fresh)


def test_after_a_nan_stop_without_checkpoints_no_model_file_is_written(nan_run, tmp_path):
    model, _, _ = nan_run
    path = tmp_path / "model.keras"
    path.write_bytes(b"an earlier model")
    saved, restored_from = save_final_model(model, str(path), str(tmp_path / "no_checkpoints"))
    assert (saved, restored_from) == (False, None)
    assert path.read_bytes() == b"an earlier model"  # the earlier file is kept as it was


def test_after_a_nan_stop_the_final_model_holds_the_last_good_checkpoint(nan_run, tmp_path):
    nan_model, model_dir, _ = nan_run
    # A copy of what run_training has in hand after the NaN stop: restoring into it
    # leaves the shared fixture's NaN weights for the other tests.
    model = kt.build_transformer(nan_model.config)
    model.set_weights(nan_model.get_weights())
    assert not all_finite(model)
    checkpoint_dir = os.path.join(model_dir, model_directory.CHECKPOINT_DIR)
    path = str(tmp_path / "model.keras")
    saved, restored_from = save_final_model(model, path, checkpoint_dir)
    assert saved and os.path.basename(restored_from) == "epoch_001.weights.h5"
    final = keras.saving.load_model(path, safe_mode=True)
    expected = kt.build_transformer(model.config)
    expected.load_weights(restored_from)
    assert all_finite(final)
    for got, want in zip(final.weights, expected.weights):
        np.testing.assert_array_equal(to_numpy(got), to_numpy(want))


# ---------------------------------------------------------------- SIGKILL mid-epoch
# The child trains the tiny Transformer with the package's default callbacks. With
# "pause", it writes a marker after optimizer step 6 (mid-epoch 2) and waits there for
# the parent's SIGKILL. Run again on the same directory, it resumes from the backup.
TRAIN_SCRIPT = textwrap.dedent(
    """
    import json, os, sys, time
    import numpy as np
    import keras
    import keras_transformer as kt
    from keras_transformer.train.callbacks import default_callbacks

    STEPS_PER_EPOCH, EPOCHS, PAUSE_STEP = 4, 3, 6

    class Record(keras.callbacks.Callback):
        def __init__(self, marker=None):
            super().__init__()
            self.marker, self.epochs, self.steps = marker, [], 0
        def on_epoch_begin(self, epoch, logs=None):
            self.epochs.append(epoch)
        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            step = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
            if self.marker and step == PAUSE_STEP:
                with open(self.marker, "w") as file:
                    file.write(str(step))
                time.sleep(600)  # the parent kills us here

    def fit(model_dir, marker=None):
        keras.utils.set_random_seed(0)
        config = kt.TransformerConfig.from_preset(
            "tiny", vocab_size=32, d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1,
            num_decoder_layers=1, dropout=0.0, max_length=8)
        model = kt.build_transformer(config)
        kt.compile_transformer(model, kt.TrainingConfig(warmup_steps=4), jit_compile=False)
        rng = np.random.default_rng(0)
        inputs = {"encoder_inputs": rng.integers(4, 32, (16, 6)).astype("int32"),
                  "decoder_inputs": rng.integers(4, 32, (16, 6)).astype("int32")}
        labels = rng.integers(4, 32, (16, 6)).astype("int32")
        record = Record(marker)
        callbacks = default_callbacks(model_dir, tensorboard=False) + [record]
        model.fit(inputs, labels, batch_size=STEPS_PER_EPOCH, epochs=EPOCHS, callbacks=callbacks,
                  verbose=0, shuffle=False)
        return model, record

    if __name__ == "__main__":
        model_dir = sys.argv[1]
        model, record = fit(model_dir, marker=sys.argv[2] if len(sys.argv) > 2 else None)
        model.save(os.path.join(model_dir, "model.keras"))
        with open(os.path.join(model_dir, "child.json"), "w") as file:
            json.dump({"epochs": record.epochs, "steps": record.steps}, file)
    """
)


@once_on("torch", "the backup and resume are files and callbacks, the same on every backend; the "
                  "killed child and the run beside it train eagerly there, with no step to trace")
def test_sigkill_mid_epoch_resumes_from_the_backup_with_the_same_total_steps(tmp_path):
    model_dir, marker = tmp_path / "run", tmp_path / "paused"
    # One thread each: the killed run and the reference train at once, on two cores. Each
    # is a process of its own, forked from a zygote that has only imported the package:
    # this session's earlier tests leave state (seed generators, policies) that a rerun
    # would not have.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "KERAS_BACKEND": keras.backend.backend(),
           "OMP_NUM_THREADS": "1"}
    script, reference_dir = "train_child.py", tmp_path / "uninterrupted"
    with Zygote(env) as zygote:
        child = zygote.start(TRAIN_SCRIPT, [script, model_dir, marker], tmp_path / "killed.log")
        # Meanwhile, the run that is never killed.
        reference = zygote.start(TRAIN_SCRIPT, [script, reference_dir], tmp_path / "reference.log")
        assert zygote.wait_for(marker, child, timeout=300), (tmp_path / "killed.log").read_text()[-3000:]
        os.kill(child, signal.SIGKILL)
        child_status = zygote.wait(child)
        assert zygote.wait(reference) == 0, (tmp_path / "reference.log").read_text()[-3000:]
        assert child_status == -signal.SIGKILL
        # Killed mid-epoch 2: the backup holds epoch 1, the one finished epoch.
        with open(model_dir / model_directory.BACKUP_DIR / "training_metadata.json") as file:
            assert json.load(file)["epoch"] == 1
        assert sorted(os.listdir(model_dir / model_directory.CHECKPOINT_DIR)) == ["epoch_001.weights.h5"]

        resumed, output = zygote.run(TRAIN_SCRIPT, [script, model_dir], tmp_path / "resumed.log")
        assert resumed == 0, output[-3000:]
    with open(model_dir / "child.json") as file:
        assert json.load(file) == {"epochs": [1, 2], "steps": 8}  # epochs 2 and 3 again, from their start
    with open(reference_dir / "child.json") as file:
        assert json.load(file) == {"epochs": [0, 1, 2], "steps": 12}
    model = keras.saving.load_model(str(model_dir / "model.keras"), safe_mode=True)
    uninterrupted = keras.saving.load_model(str(reference_dir / "model.keras"), safe_mode=True)
    total_steps = int(to_numpy(model.optimizer.iterations))
    assert total_steps == int(to_numpy(uninterrupted.optimizer.iterations)) == 12
    # Nothing was lost or done twice: the resumed weights are the uninterrupted run's, to
    # float32 rounding (two processes may sum in another order: 1.6e-6 seen under PyTorch);
    # one update more moves some weight by ~6e-2 at this learning rate.
    for resumed_weight, weight in zip(model.weights, uninterrupted.weights):
        np.testing.assert_allclose(to_numpy(resumed_weight), to_numpy(weight), atol=1e-5)
    assert not os.path.exists(model_dir / model_directory.BACKUP_DIR)  # a finished run clears it


# ---------------------------------------------------------------- a run refused late
def _corpus_files(directory, pairs):
    directory.mkdir()
    (directory / "train.en").write_text("".join(source + "\n" for source, _ in pairs))
    (directory / "train.de").write_text("".join(target + "\n" for _, target in pairs))
    return directory


def test_a_run_refused_by_its_corpus_leaves_the_model_directory_as_it_was(tmp_path, tiny_dir):
    """The user's case: a refusal after the tokenizer was made once deleted checkpoints/."""
    from keras_transformer.model.directory import load_model_and_tokenizer
    from keras_transformer.train.run import run_training
    from keras_transformer.train.run_config import RunConfig

    # A finished run (with the user's notes beside it), to be replaced with overwrite.
    model_dir = tmp_path / "runs" / "tiny"
    shutil.copytree(tiny_dir, model_dir)
    (model_dir / "checkpoints").mkdir()
    shutil.copy(model_dir / "model.keras", model_dir / "checkpoints" / "epoch_001.weights.h5")
    (model_dir / "notes.txt").write_text("mine")
    before = tree_digest(model_dir)
    # Every pair is longer than max_length=8: make_dataset refuses it, after the tokenizer.
    long_pairs = [(f"{s} {s}", f"{s} {s}") for s in ("cats see houses and gardens", "dogs like cars and trees")] * 20
    config = RunConfig(
        name="tiny", output_dir=str(tmp_path / "runs"), corpus="files",
        data_dir=str(_corpus_files(tmp_path / "corpus", long_pairs)), validation_split="", test_split="",
        vocab_size=40, epochs=1, overwrite=True, verbose=0, tokens_per_batch=64,
        model=dict(d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, max_length=8),
    )
    with pytest.raises(ValueError, match="No pair fits max_length=8"):
        run_training(config, print_fn=lambda line: None)
    assert tree_digest(model_dir) == before  # checkpoints, tokenizer, model: as they were
    assert sorted(os.listdir(tmp_path / "runs")) == ["tiny"]  # no staging, no lock left
    load_model_and_tokenizer(str(model_dir))


def test_a_token_budget_below_the_largest_bucket_is_refused_before_anything_is_read(tmp_path):
    from keras_transformer.train.run_config import RunConfig

    with pytest.raises(ValueError, match=r"`tokens_per_batch` must be an integer >= the largest bucket boundary \(64"):
        RunConfig(output_dir=str(tmp_path), model={"max_length": 64}, tokens_per_batch=63)
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- the parts of a model directory
def _model_dir_copy(tiny_dir, directory, *, manifest=True):
    """A copy of the tiny model directory, with the manifest a training run writes."""
    from keras_transformer.data.tokenizer import SubwordTokenizer
    from keras_transformer.model.directory import write_manifest

    shutil.copytree(tiny_dir, directory)
    if manifest:
        write_manifest(directory, SubwordTokenizer.load(directory))
    return directory


def _tokenizer_of_another_corpus(size):
    """A tokenizer of `size` pieces trained on other text (each sentence spelled backwards)."""
    from tiny_translation import tiny_sentences

    return kt.train_tokenizer([s[::-1] for s in tiny_sentences()], vocab_size=size, model_type="bpe")


def test_a_tokenizer_of_the_same_size_from_another_corpus_is_refused(tmp_path, tiny_dir):
    from keras_transformer.model.directory import load_model_and_tokenizer

    directory = _model_dir_copy(tiny_dir, tmp_path / "model")
    model, own = load_model_and_tokenizer(directory)
    other = _tokenizer_of_another_corpus(own.vocab_size)
    assert other.vocab_size == own.vocab_size == model.config.vocab_size
    assert other.fingerprint != own.fingerprint
    message = r"is not the tokenizer .* was trained with: its sha256 is [0-9a-f]{16}\.\.\., manifest.json records"
    with pytest.raises(ValueError, match=message):  # given with the directory
        load_model_and_tokenizer(directory, tokenizer=other)
    other.save(str(directory))  # the wrong tokenizer.model in the directory itself
    with pytest.raises(ValueError, match="tokenizer.model " + message):
        load_model_and_tokenizer(directory)
    with pytest.raises(ValueError, match=message):
        kt.Translator(directory)


def test_a_directory_without_a_manifest_still_loads_checked_by_size(tmp_path, tiny_dir):
    """0.1 directories have no manifest.json: they load, and only the sizes are compared."""
    from keras_transformer.model.directory import load_model_and_tokenizer

    directory = _model_dir_copy(tiny_dir, tmp_path / "model", manifest=False)
    model, tokenizer = load_model_and_tokenizer(directory)
    assert tokenizer.vocab_size == model.config.vocab_size
    _tokenizer_of_another_corpus(tokenizer.vocab_size).save(str(directory))
    load_model_and_tokenizer(directory)  # the documented limit: same size, not detected


def _cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _flip_middle(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 64] = bytes(255 - b for b in data[middle : middle + 64])
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage", ["truncated_model", "damaged_model", "empty_model", "truncated_tokenizer", "corrupt_manifest"]
)
def test_a_damaged_model_directory_is_refused_naming_the_file(tmp_path, tiny_dir, damage):
    from keras_transformer.model.directory import load_model_and_tokenizer

    directory = _model_dir_copy(tiny_dir, tmp_path / "model")
    if damage == "truncated_model":
        _cut(directory / "model.keras")
        message = r"model.keras is corrupt or truncated: it is not a .keras \(zip\) archive"
    elif damage == "damaged_model":
        _flip_middle(directory / "model.keras")
        message = r"model.keras is corrupt: "
    elif damage == "empty_model":
        (directory / "model.keras").write_bytes(b"")
        message = r"model.keras is corrupt or truncated: it is not a .keras \(zip\) archive \(0 bytes\)"
    elif damage == "truncated_tokenizer":
        _cut(directory / "tokenizer.model", keep=0.9)
        message = r"tokenizer.model is not the tokenizer .* It is corrupt \(truncated or damaged\)"
    else:
        (directory / "manifest.json").write_text('{"format": 1, "tokenizer_sha256": ')
        message = r"manifest.json is corrupt: JSONDecodeError"
    with pytest.raises(ValueError, match=message):
        load_model_and_tokenizer(directory)
