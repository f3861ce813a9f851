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
