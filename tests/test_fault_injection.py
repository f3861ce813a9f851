"""Fault injection: training runs killed at random points never harm a model directory.

`run_training` writes a new run into a hidden staging directory and renames it into
place at the end (keras_transformer/train/run.py). Here a child process runs a tiny
`run_training` and SIGKILLs itself at a point drawn from a seeded generator: after the
tokenizer is written, after an optimizer step, half-way through writing a checkpoint or
the backup, half-way through writing the final `model.keras`, or just before or after
one of the run's renames (every file commit and both renames of the final swap). Each
kill is followed by the same command, run to its end. After every process the model
directory must be the earlier run byte for byte, or the new run whole (it loads, and
its tokenizer is the one its manifest records); at the end the run must be complete,
with as many optimizer steps as a run never killed. The figures
(kills, outcomes, bytes of the earlier run lost) are printed, and the bytes lost must
be 0. The cheaper tests first check each step in-process: a kill between any two steps
of the final rename, and a kill while Keras writes its backup.
"""

import concurrent.futures
import json
import os
import queue
import random
import shutil
import signal
import sys
import textwrap
import threading
import time

import keras
import numpy as np
import pytest
from conftest import tiny_config, tree_digest
from zygote import Zygote

import keras_transformer as kt
from keras_transformer.model import directory as model_directory
from keras_transformer.train import run, run_directory

ON_TORCH = keras.backend.backend() == "torch"

STEPS_PER_EPOCH, EPOCHS = 4, 3
KILL_KINDS = ("tokenizer", "step", "weights_write", "model_write", "rename")
# One killed run per seed, each seed a kind of kill (KILL_KINDS[seed]) at a position drawn
# from it; even seeds train into a new directory, odd ones replace a finished run. Each
# child process (PyTorch, eager, forked from a process that has imported everything:
# tests/zygote.py) costs ~2 s: 5 kills and 5 resumes, two at a time.
SEEDS = (0, 1, 2, 3, 4)
_LOADING = threading.Lock()  # Keras loads one model at a time: the chains run in two threads


def tree_bytes(directory):
    return {
        os.path.relpath(os.path.join(root, name), directory): os.path.getsize(os.path.join(root, name))
        for root, _, files in os.walk(directory)
        for name in files
    }


# ---------------------------------------------------------------- the final rename, step by step
class Killed(BaseException):
    """Raised by a patched system call: the process stops there (no `except Exception` runs)."""


def _old_and_staged(tmp_path):
    target, staging = tmp_path / "demo", tmp_path / ".demo.staging"
    target.mkdir(parents=True)
    (target / "model.keras").write_text("old model")
    (target / "checkpoints").mkdir()
    (target / "checkpoints" / "epoch_001.weights.h5").write_text("old checkpoint")
    (target / "notes.txt").write_text("the user's own file")
    staging.mkdir()
    (staging / "model.keras").write_text("new model")
    (staging / "backup").mkdir()  # BackupAndRestore's, removed before the rename
    (staging / ".model.keras.partial-0123456789ab.tmp.keras").write_text("a killed write")
    (staging / "manifest.json").write_text("{}")  # written last: the staged run is complete
    return str(target), str(staging)


def _kill_at_call(monkeypatch, names, at):
    """Makes the `at`-th call of any of the `os` functions `names` raise `Killed` instead."""
    calls = []
    for name in names:
        real = getattr(os, name)

        def patched(*args, _real=real, **kwargs):
            calls.append(args)
            if len(calls) == at:
                raise Killed
            return _real(*args, **kwargs)

        monkeypatch.setattr(os, name, patched)
    return calls


def _run_files(directory):
    """The digest of a model directory without the user's own file (moved over first)."""
    return {name: digest for name, digest in tree_digest(directory).items() if name != "notes.txt"}


def test_a_kill_between_any_two_steps_of_the_final_rename_is_repaired_by_the_next_run(tmp_path, monkeypatch):
    calls = ["rename", "remove", "unlink", "rmdir"]
    steps = _kill_at_call(monkeypatch, calls, at=0)
    target, staging = _old_and_staged(tmp_path / "count")
    run_directory.replace_with_staged_run(staging, target)
    monkeypatch.undo()
    new = tree_digest(target)
    assert sorted(new) == ["manifest.json", "model.keras", "notes.txt"]
    assert len(steps) >= 7  # the partial file, backup/, notes.txt, 2 renames, the old run's 2 files and 2 dirs
    for at in range(1, len(steps) + 1):
        case = tmp_path / str(at)
        target, staging = _old_and_staged(case)
        old = _run_files(target)
        _kill_at_call(monkeypatch, calls, at)
        with pytest.raises(Killed):
            run_directory.replace_with_staged_run(staging, target)
        monkeypatch.undo()
        # Killed: the earlier run whole, or the new one, or (between the two renames) none,
        # with the new run complete in the staging directory and the old one retired.
        now = _run_files(target)
        assert now in (old, _run_files(tmp_path / "count" / "demo"), {}), at
        if not now:
            assert os.path.isfile(os.path.join(staging, "manifest.json")) and _run_files(case / ".demo.retired") == old
        # The next run completes the replacement first; nothing of the user's is lost.
        run_directory.recover_interrupted_swap(target, print_fn=lambda line: None)
        assert tree_digest(target) == new, at
        assert sorted(os.listdir(case)) == ["demo"], at


def test_a_kill_before_the_manifest_leaves_the_staged_run_to_resume(tmp_path):
    target, staging = _old_and_staged(tmp_path)
    os.remove(os.path.join(staging, "manifest.json"))  # killed before finish_run wrote it
    assert not run_directory.recover_interrupted_swap(target, print_fn=lambda line: None)
    assert open(os.path.join(target, "model.keras")).read() == "old model"
    assert os.path.isdir(staging)


# ---------------------------------------------------------------- a kill while Keras writes its backup
def _backup(directory, model, epochs):
    """What BackupAndRestore(double_checkpoint=True) leaves after `epochs` epochs."""
    callback = keras.callbacks.BackupAndRestore(str(directory), double_checkpoint=True)
    callback.set_model(model)
    for epoch in range(epochs):
        callback.on_epoch_end(epoch)
    return directory / "latest.weights.h5", directory / "training_metadata.json"


@pytest.mark.parametrize("cut", ["none", "latest_weights", "latest_metadata", "first_weights"])
def test_a_backup_cut_by_a_kill_is_repaired_or_dropped_before_fit(tmp_path, cut):
    model = kt.build_transformer(tiny_config())
    backup_dir = tmp_path / "backup"
    weights, metadata = _backup(backup_dir, model, epochs=1 if cut == "first_weights" else 2)
    if cut in ("latest_weights", "first_weights"):
        data = weights.read_bytes()
        weights.write_bytes(data[: len(data) // 2])  # Keras writes this file in place
    elif cut == "latest_metadata":
        metadata.write_text('{"epoch": ')
    said = run_directory.repair_backup(str(backup_dir))
    if cut == "none":
        assert said == "" and json.loads(metadata.read_text())["epoch"] == 2
    elif cut == "first_weights":
        assert "training starts again from epoch 1" in said and not backup_dir.exists()
    else:
        assert "resuming from the one before it" in said
        assert json.loads(metadata.read_text())["epoch"] == 1
        restored = kt.build_transformer(tiny_config())
        restored.load_weights(str(weights))
        for got, want in zip(restored.weights, model.weights):
            np.testing.assert_array_equal(keras.ops.convert_to_numpy(got), keras.ops.convert_to_numpy(want))


# ---------------------------------------------------------------- whole runs, killed
CHILD = textwrap.dedent(
    """
    import json, os, signal, sys
    spec = json.loads(sys.argv[1])
    import keras
    from keras_transformer.data.tokenizer import SubwordTokenizer
    from keras_transformer.model.transformer import Transformer
    from keras_transformer.train import run
    from keras_transformer.train.run_config import RunConfig

    def die():
        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)

    kind, at, calls = spec.get("kill"), spec.get("at", 0), []

    def hit():
        calls.append(1)
        return len(calls) == at

    if kind == "tokenizer":  # right after tokenizer.model is in the staging directory
        real_save = SubwordTokenizer.save
        def save(self, directory):
            real_save(self, directory)
            die()
        SubwordTokenizer.save = save
    elif kind == "step":  # after optimizer step `at`, mid-epoch or at an epoch's end
        class KillAtStep(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == at:
                    die()
        real_callbacks = run._run_callbacks
        run._run_callbacks = lambda *args: real_callbacks(*args) + [KillAtStep()]
    elif kind in ("weights_write", "model_write"):  # half-way through writing the file
        method = "save_weights" if kind == "weights_write" else "save"
        real_method = getattr(Transformer, method)
        def cut(self, filepath, *args, **kwargs):
            if not hit():
                return real_method(self, filepath, *args, **kwargs)
            directory, name = os.path.split(str(filepath))
            whole = os.path.join(directory, "whole-" + name)
            real_method(self, whole, *args, **kwargs)
            data = open(whole, "rb").read()
            os.remove(whole)
            with open(filepath, "wb") as file:
                file.write(data[: len(data) // 2])
            die()
        setattr(Transformer, method, cut)
    elif kind == "rename":  # just before or just after the `at`-th rename of the process
        def commit(real):
            def renamed(*args, **kwargs):
                now = hit()
                if now and not spec["after"]:
                    die()
                result = real(*args, **kwargs)
                if now:
                    die()
                return result
            return renamed
        os.rename, os.replace = commit(os.rename), commit(os.replace)

    try:
        result = run.run_training(RunConfig(**spec["config"]), print_fn=lambda line: print(line, flush=True))
    except FileExistsError as error:  # killed after the manifest: the run is finished
        print(f"refused: {error}", flush=True)
        sys.exit(3)
    print("RESULT " + json.dumps({"steps": result.steps, "model_dir": result.model_dir}), flush=True)
    """
)

SOURCE_WORDS = "red blue green black white small big old new one two three".split()
TARGET_WORDS = "rot blau gruen schwarz weiss klein gross alt neu eins zwei drei".split()


def _write_corpus(directory):
    """100 training pairs of one or two words: 4 batches of 25 at 200 tokens per batch."""
    rng = np.random.default_rng(0)
    words = [rng.integers(0, 12, size=1 + i % 2) for i in range(100)]
    directory.mkdir()
    (directory / "train.en").write_text("".join(" ".join(SOURCE_WORDS[w] for w in ws) + "\n" for ws in words))
    (directory / "train.de").write_text("".join(" ".join(TARGET_WORDS[w] for w in ws[::-1]) + "\n" for ws in words))
    return directory


def _run_settings(output_dir, corpus_dir, seed, overwrite):
    return dict(
        name="run", output_dir=str(output_dir), corpus="files", data_dir=str(corpus_dir),
        validation_split="", test_split="", vocab_size=48, epochs=EPOCHS, seed=seed,
        overwrite=overwrite, keep_checkpoints=2, bleu_every_epochs=0, sample_translations=0,
        jit_compile=False, verbose=0, tokens_per_batch=200,
        model=dict(d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1,
                   max_length=8, dropout=0.0),
    )


def _kill_point(seed, renames):
    """Where the run of `seed` is killed: `{"kill": kind, "at": n, "after": bool}`."""
    rng = random.Random(seed)
    kind = KILL_KINDS[seed % len(KILL_KINDS)]
    at = {
        "tokenizer": 1,
        "step": rng.randint(1, STEPS_PER_EPOCH * EPOCHS),
        "weights_write": rng.randint(1, 2 * EPOCHS),  # a checkpoint or the backup, each epoch
        "model_write": 1,
        "rename": rng.randint(1, renames),
    }[kind]
    return {"kill": kind, "at": at, "after": rng.random() < 0.5}


def _is_new_run_whole(model_dir, seed):
    """Whether `model_dir` holds a finished run of `seed` that loads, with its own tokenizer."""
    if not os.path.isfile(os.path.join(model_dir, model_directory.MANIFEST_FILE)):
        return False
    model, _ = model_directory.load_model_and_tokenizer(model_dir)  # raises if mismatched or cut
    stored = kt.RunConfig.from_toml(os.path.join(model_dir, model_directory.CONFIG_FILE))
    assert model.config == stored.model_config()
    return stored.seed == seed


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A run never killed, trained in this process: the earlier run, and the figures to expect."""
    base = tmp_path_factory.mktemp("fault_injection")
    corpus = _write_corpus(base / "corpus")
    counted = []
    real_rename, real_replace = os.rename, os.replace

    def counting(real):
        def renamed(*args, **kwargs):
            counted.append(args)
            return real(*args, **kwargs)
        return renamed

    os.rename, os.replace = counting(real_rename), counting(real_replace)
    try:
        result = run.run_training(
            kt.RunConfig(**_run_settings(base / "old", corpus, seed=0, overwrite=False)), print_fn=lambda line: None
        )
    finally:
        os.rename, os.replace = real_rename, real_replace
    assert result.steps == STEPS_PER_EPOCH * EPOCHS and result.steps_per_epoch == STEPS_PER_EPOCH
    return base, corpus, result.model_dir, len(counted)


def _kill_chain(seed, base, corpus, old_run, renames, zygote):
    """One seed: a run killed once, then the same run again, to its end. Returns its figures."""
    replacing = seed % 2 == 1
    output_dir = base / f"seed_{seed}"
    output_dir.mkdir()
    model_dir = str(output_dir / "run")
    if replacing:
        shutil.copytree(old_run, model_dir)
    old, old_bytes = tree_digest(model_dir), tree_bytes(model_dir)
    settings = _run_settings(output_dir, corpus, seed=1, overwrite=replacing)
    figures = {"kills": 0, "not_reached": 0, "kept_old": 0, "new_whole": 0, "mid_swap": 0, "broken": 0, "bytes_lost": 0, "log": []}
    for number, kill in enumerate((_kill_point(seed, renames + (1 if replacing else 0)), {})):
        started = time.monotonic()
        returncode, output = zygote.run(
            CHILD, ["child", json.dumps({**kill, "config": settings})], base / f"seed_{seed}_{number}.log"
        )
        seconds = time.monotonic() - started
        if returncode == -signal.SIGKILL:
            figures["kills"] += 1
        elif kill:
            figures["not_reached"] += 1  # the run ended before that point
        finished = returncode == 0 or (returncode == 3 and "already holds a finished run" in output)
        assert returncode == -signal.SIGKILL or finished, output[-5000:]
        with _LOADING:
            state = _directory_state(model_dir, old)
        if state == "lost":  # neither the earlier run nor the new one: counted, then failed below
            now = tree_digest(model_dir)
            figures["broken"] += 1
            figures["bytes_lost"] += sum(size for name, size in old_bytes.items() if now.get(name) != old[name])
        else:
            figures[_OUTCOMES[state]] += 1
        figures["log"].append(
            f"seed {seed}, {kill or 'no kill'}: exit {returncode} after {seconds:.0f} s; the directory: {state}"
        )
    assert finished and state == "new run", figures["log"]
    with _LOADING:
        model_directory.load_model_and_tokenizer(model_dir)
        compiled = keras.saving.load_model(os.path.join(model_dir, model_directory.MODEL_FILE), safe_mode=True)
        figures["final_steps"] = int(keras.ops.convert_to_numpy(compiled.optimizer.iterations))
    figures["leftovers"] = sorted(set(os.listdir(output_dir)) - {"run"})
    return figures


_OUTCOMES = {"earlier run": "kept_old", "absent": "kept_old", "new run": "new_whole", "between the two renames": "mid_swap"}


def _directory_state(model_dir, old):
    """What a killed run left at `model_dir`, given the earlier run's digest `old` ({} if none)."""
    now = tree_digest(model_dir)
    if now == old:
        return "earlier run" if old else "absent"
    if _is_new_run_whole(model_dir, seed=1):
        return "new run"
    staging, retired = run_directory.staging_directory(model_dir), os.path.join(os.path.dirname(model_dir), ".run.retired")
    if not now and tree_digest(retired) == old and os.path.isfile(os.path.join(staging, "manifest.json")):
        return "between the two renames"  # the next run renames the complete new one in
    return "lost"


@pytest.mark.skipif(
    not ON_TORCH,
    reason="the files a run writes are the same on every backend: killed runs are tested once, in the "
    "PyTorch session, whose child processes train eagerly with no step to trace (each imports TensorFlow "
    "for its tokenizer and tf.data whatever the backend)",
)
def test_runs_killed_at_random_points_leave_a_whole_directory_and_resume_to_the_end(finished_run, capsys):
    base, corpus, old_run, renames = finished_run
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "KERAS_BACKEND": "torch",
        "TF_CPP_MIN_LOG_LEVEL": "3", "TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1", "OMP_NUM_THREADS": "1",
    }
    zygotes = queue.Queue()  # two children at a time: two cores
    for _ in range(2):
        zygotes.put(Zygote(env))

    def chain(seed):
        zygote = zygotes.get()
        try:
            return _kill_chain(seed, base, corpus, old_run, renames, zygote)
        finally:
            zygotes.put(zygote)

    try:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(chain, SEEDS))
    finally:
        while not zygotes.empty():
            zygotes.get().close()
    keys = ("kills", "not_reached", "kept_old", "new_whole", "mid_swap", "broken", "bytes_lost")
    totals = {key: sum(r[key] for r in results) for key in keys}
    with capsys.disabled():
        print(f"\nfault injection over seeds {SEEDS} ({renames} renames in a run never killed):")
        for line in (line for r in results for line in r["log"]):
            print("  " + line)
        print(f"  totals: {totals}")
    assert totals["bytes_lost"] == 0 and totals["broken"] == 0
    assert totals["kills"] >= len(SEEDS) - 1  # a drawn point may lie past the end of the run
    for r in results:
        assert r["final_steps"] == STEPS_PER_EPOCH * EPOCHS, r["log"]  # no step lost or done twice
        assert r["leftovers"] == [], r["log"]  # no staging, retired run or lock left
