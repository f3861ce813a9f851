"""Ctrl-C in a `kt-*` command: one line on stderr, exit status 130, no traceback.

Every command's `main` is tried in-process with the interrupt at its first line. Then
`python -m training.train` runs a tiny run in a process of its own (forked from a
zygote, tests/zygote.py), gets SIGINT mid-epoch 2 and is run again: the second run
resumes the first and ends with the steps of a run never interrupted.
"""

import importlib
import os
import signal
import sys
import textwrap

import keras
import pytest
from conftest import once_on, to_numpy
from test_fault_injection import _write_corpus
from zygote import Zygote

from keras_transformer.cli import common, interrupt
from keras_transformer.model import directory as model_directory

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESUMABLE_COMMANDS = ("train",)  # the others start over when run again


@once_on("torch", "the decorator is plain Python, the same on every backend")
@pytest.mark.parametrize("name", common.COMMANDS)
def test_each_command_ends_an_interrupt_with_one_line_and_status_130(name, monkeypatch, capsys):
    def interrupted():
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "setup_environment", interrupted)  # each main's first line
    main = importlib.import_module(f"keras_transformer.cli.{name}").main
    assert main([]) == 130
    expected = interrupt.RESUMABLE if name in RESUMABLE_COMMANDS else interrupt.INTERRUPTED
    assert capsys.readouterr().err == expected + "\n"


@once_on("torch", "signals and exit statuses are the operating system's, the same on every backend")
def test_a_command_run_in_a_child_process_reports_the_childs_interrupt_alone():
    # The terminal's Ctrl-C reaches both processes: here the child sends it to both.
    child = "import os, signal, sys, time\n" "try:\n" "    os.kill(os.getppid(), signal.SIGINT)\n" \
        "    os.kill(os.getpid(), signal.SIGINT)\n" "    time.sleep(30)\n" \
        "except KeyboardInterrupt:\n" "    sys.exit(130)\n"
    handler = signal.getsignal(signal.SIGINT)
    assert interrupt.call_in_foreground([sys.executable, "-c", child]) == 130  # no KeyboardInterrupt here
    assert signal.getsignal(signal.SIGINT) is handler


# `python -m training.train`, as a shell starts it (Ctrl-C raises KeyboardInterrupt).
TRAIN = textwrap.dedent(
    """
    import runpy, signal
    signal.signal(signal.SIGINT, signal.default_int_handler)
    runpy.run_module("training.train", run_name="__main__", alter_sys=True)
    """
)
# The same command, with a callback that writes a marker after optimizer step PAUSE_STEP
# and waits there for the parent's SIGINT.
PAUSED = textwrap.dedent(
    """
    import sys, time
    import keras
    from keras_transformer.train import run

    class Pause(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == {step}:
                open({marker!r}, "w").close()
                time.sleep(120)

    callbacks = run._run_callbacks
    run._run_callbacks = lambda *args: callbacks(*args) + [Pause()]
    """
)

STEPS_PER_EPOCH, EPOCHS = 4, 3  # test_fault_injection's corpus: 100 pairs, 4 batches of 200 tokens
PAUSE_STEP = STEPS_PER_EPOCH + 2  # mid-epoch 2: the backup holds epoch 1


def _tiny_run_config(directory, corpus):
    path = directory / "tiny.toml"
    path.write_text(
        textwrap.dedent(
            f"""
            name = "run"
            output_dir = "{directory / "runs"}"
            corpus = "files"
            data_dir = "{corpus}"
            validation_split = ""
            test_split = ""
            vocab_size = 48
            epochs = {EPOCHS}
            tokens_per_batch = 200
            keep_checkpoints = 2
            bleu_every_epochs = 0
            sample_translations = 0
            jit_compile = false
            verbose = 2
            [model]
            d_model = 16
            d_ff = 32
            num_heads = 2
            num_encoder_layers = 1
            num_decoder_layers = 1
            max_length = 8
            dropout = 0.0
            """
        )
    )
    return path


@once_on("torch", "the run's files and the interrupt's handling are the same on every backend; the "
                  "child trains eagerly there, with no step to trace")
def test_an_interrupted_training_run_says_how_to_resume_and_the_same_command_resumes_it(tmp_path):
    config = _tiny_run_config(tmp_path, _write_corpus(tmp_path / "corpus"))
    argv = ["training/train.py", "--config", config]
    marker, runs = tmp_path / "paused", tmp_path / "runs"
    model_dir = runs / "run"
    env = {
        **os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, *sys.path]), "KERAS_BACKEND": keras.backend.backend(),
        "TF_CPP_MIN_LOG_LEVEL": "3", "OMP_NUM_THREADS": "1",
    }
    with Zygote(env) as zygote:
        paused = PAUSED.format(step=PAUSE_STEP, marker=str(marker)) + TRAIN
        child = zygote.start(paused, argv, tmp_path / "interrupted.out", err=tmp_path / "interrupted.err")
        assert zygote.wait_for(marker, child, timeout=240), (tmp_path / "interrupted.err").read_text()[-3000:]
        os.kill(child, signal.SIGINT)
        status = zygote.wait(child)
        stderr = (tmp_path / "interrupted.err").read_text()
        assert status == 130, stderr[-3000:]
        assert stderr.endswith("\n" + interrupt.RESUMABLE + "\n") or stderr == interrupt.RESUMABLE + "\n", stderr
        assert "Traceback" not in stderr and stderr.count(interrupt.RESUMABLE) == 1
        # The run's cleanup ran (its lock is gone) and left it to resume: staged, epoch 1 backed up.
        assert not (runs / ".run.lock").exists() and not model_dir.exists()
        assert os.listdir(runs / ".run.staging" / model_directory.BACKUP_DIR)

        status, output = zygote.run(TRAIN, argv, tmp_path / "resumed.log")
    assert status == 0, output[-3000:]
    assert "(resuming an interrupted run" in output
    model = keras.saving.load_model(str(model_dir / model_directory.MODEL_FILE), safe_mode=True)
    assert int(to_numpy(model.optimizer.iterations)) == STEPS_PER_EPOCH * EPOCHS  # none lost, none twice
    assert not (runs / ".run.staging").exists()


# An interrupt that a garbage-collector callback swallowed (JAX's, loaded with TensorFlow):
# Python drops an exception raised inside one, so SIGINT must be recorded to be raised again.


@once_on("torch", "signal handling is plain Python, the same on every backend")
def test_an_interrupt_swallowed_where_no_loop_checks_still_ends_the_command_with_130(capsys):
    from keras_transformer import interrupts

    previous = signal.getsignal(signal.SIGINT)
    seen = []

    @interrupt.exits_on_interrupt()
    def main():
        seen.append(signal.getsignal(signal.SIGINT))
        try:
            os.kill(os.getpid(), signal.SIGINT)  # the installed handler runs at the next bytecode
            for _ in range(1000):
                pass
        except KeyboardInterrupt:
            pass  # swallowed, as a gc callback does
        return 0

    assert main() == 130
    assert capsys.readouterr().err == interrupt.INTERRUPTED + "\n"
    assert seen == [interrupts.handle_sigint] and signal.getsignal(signal.SIGINT) is previous


@once_on("torch", "signal handling is plain Python, the same on every backend")
def test_after_an_interrupt_any_error_ends_the_command_as_interrupted_and_loops_raise_it_again(capsys):
    from keras_transformer import interrupts

    @interrupt.exits_on_interrupt()
    def main():
        try:
            interrupts.handle_sigint()
        except KeyboardInterrupt:
            pass
        with pytest.raises(KeyboardInterrupt):
            interrupts.raise_if_interrupted()  # every later check raises
        with pytest.raises(KeyboardInterrupt):
            list(interrupts.checked(range(10)))
        raise RuntimeError("sentencepiece wraps its iterator's KeyboardInterrupt")

    assert main() == 130
    assert capsys.readouterr().err == interrupt.INTERRUPTED + "\n"

    @interrupt.exits_on_interrupt()
    def failing():
        raise RuntimeError("a real error")  # no interrupt recorded: it propagates as before

    with pytest.raises(RuntimeError, match="a real error"):
        failing()


@once_on("torch", "signal handling is plain Python, the same on every backend")
def test_an_ignored_sigint_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # nohup, a script's background job
    try:
        seen = []
        interrupt.exits_on_interrupt()(lambda: seen.append(signal.getsignal(signal.SIGINT)))()
        assert seen == [signal.SIG_IGN] and signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)


class WordIds:
    """A tokenizer's stand-in for binarizing: ids from word lengths (no TensorFlow in the child)."""

    fingerprint = "word-lengths"
    vocab_size = 64

    def encode(self, sentences):
        return [[4 + len(word) for word in sentence.split()] for sentence in sentences]


# A command binarizing a corpus, with JAX's gc callback registered, and one more gc callback
# that waits inside the collector for the parent's SIGINT once binarizing has begun: the
# signal lands where a KeyboardInterrupt is swallowed, every time.
BINARIZE = textwrap.dedent(
    """
    import gc, signal, sys, time
    import jax
    assert any(getattr(callback, "__name__", "") == "_xla_gc_callback" for callback in gc.callbacks), gc.callbacks
    from keras_transformer.cli import interrupt
    from keras_transformer.data import binarized
    from keras_transformer.data.text_corpus import TextCorpus, binarized_corpus
    signal.signal(signal.SIGINT, signal.default_int_handler)  # as a shell starts python
    binarized._CHUNK_PAIRS = 500
    source, target, cache, marker, encoded = sys.argv[1:]
    state = {"binarizing": False, "waited": False}

    def wait_in_the_collector(phase, info):
        if phase == "start" and state["binarizing"] and not state["waited"]:
            state["waited"] = True
            open(marker, "w").close()
            time.sleep(120)  # the parent's SIGINT ends it, inside the gc callback

    gc.callbacks.append(wait_in_the_collector)

    class Arming(WordIds):
        def encode(self, sentences):
            state["binarizing"] = True
            with open(encoded, "a") as file:  # how far binarizing went
                file.write(f"{len(sentences)}\\n")
            return super().encode(sentences)

    @interrupt.exits_on_interrupt()
    def main():
        binarized_corpus(TextCorpus("files", paths=(source, target), split="train"), Arming(), cache, progress=False)
        print("binarized to the end", flush=True)
        return 0

    sys.exit(main())
    """
)


@once_on("torch", "the child runs under JAX whatever the session's backend: its gc callback is the point")
def test_ctrl_c_swallowed_by_a_gc_callback_still_stops_binarizing_with_130_and_nothing_kept(tmp_path):
    import inspect
    import subprocess
    import time

    from keras_transformer.data.binarized import write_binarized
    from keras_transformer.data.content_key import RECORD_FILE
    from keras_transformer.data.text_corpus import TextCorpus, binarized_corpus

    lines = [" ".join(["ein", "zwei", "drei", "haus"][: 1 + index % 4]) for index in range(20_000)]
    source, target = tmp_path / "train.de", tmp_path / "train.en"
    source.write_text("\n".join(lines) + "\n")
    target.write_text("\n".join(reversed(lines)) + "\n")
    cache, marker, encoded = tmp_path / "cache", tmp_path / "in_the_collector", tmp_path / "encoded"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([REPO_ROOT, *sys.path]), "KERAS_BACKEND": "jax",
           "JAX_PLATFORMS": "cpu", "TF_CPP_MIN_LOG_LEVEL": "3"}
    script = "from __future__ import annotations\n" + inspect.getsource(WordIds) + BINARIZE
    child = subprocess.Popen([sys.executable, "-c", script, str(source), str(target), str(cache), str(marker), str(encoded)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), child.communicate(timeout=60)
        child.send_signal(signal.SIGINT)
        stdout, stderr = child.communicate(timeout=120)
    finally:
        child.kill()
    assert (child.returncode, stdout, stderr) == (130, "", interrupt.INTERRUPTED + "\n")  # no "Exception ignored"
    # Stopped at the next chunk (500 pairs), far from the end: no corpus and no staging
    # directory left for a later run to trust.
    pairs_encoded = sum(map(int, encoded.read_text().split())) // 2
    assert pairs_encoded < len(lines) // 2, pairs_encoded
    assert set(os.listdir(cache)) <= {RECORD_FILE}

    printed = []
    text = TextCorpus("files", paths=(str(source), str(target)), split="train")
    later = binarized_corpus(text, WordIds(), str(cache), print_fn=printed.append, progress=False)
    assert "written to" in printed[0]
    fresh = write_binarized(text, WordIds(), str(tmp_path / "fresh"), progress=False)
    for name in ("source_ids", "target_ids", "source_offsets", "target_offsets", "lengths"):
        assert (getattr(later, name) == getattr(fresh, name)).all()
