"""One run at a time in a model directory (keras_transformer/train/run_lock.py).

The user's case: two `kt-train` runs started together on one new output directory both
trained into one staging directory, until one died on the other's files. Here two
processes released by one barrier take the lock at the same instant, round after round:
exactly one wins, the other is refused with the holder's pid and host. The lock is taken
before anything is read, only by a run's chief, and released by the kernel when its
holder is killed; where the filesystem has no flock, the lock file's existence stands
in for it. The lock's code is plain Python, the same under every backend; the one test
that trains (`run_training` refused, then run once the holder is killed) runs once.
"""

import errno
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import once_on, tree_digest

import lock_contender
from keras_transformer.train import run, run_directory, run_lock
from keras_transformer.train.run_config import RunConfig
from keras_transformer.train.run_lock import ModelDirectoryInUse, exclusive_use, lock_path

ROUNDS = 20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPAWN = multiprocessing.get_context("spawn")  # fresh interpreters, as two commands are
IN_USE = r"{model_dir} is in use by another kt-train run \(pid {pid} on host {host}, started [^)]+\); wait for it to finish"


def in_use(model_dir, pid):
    return IN_USE.format(model_dir=re.escape(str(model_dir)), pid=pid, host=re.escape(socket.gethostname()))


@pytest.fixture
def no_flock(monkeypatch):
    """flock fails in this process as on a network filesystem without it (ENOLCK)."""

    monkeypatch.setattr(run_lock.fcntl, "flock", _no_locks)


def _no_locks(fd, operation):
    raise OSError(errno.ENOLCK, "No locks available")


def _dead_pid():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


# ---------------------------------------------------------------- two runs at the same instant
@pytest.mark.parametrize("flock", [True, False], ids=["flock", "without_flock"])
def test_of_two_runs_started_at_the_same_instant_exactly_one_takes_the_lock(tmp_path, flock):
    # Even rounds in an output_dir that does not exist yet (the user's case), odd ones in one that does.
    model_dirs = [str(tmp_path / f"round{i}" / "out" / "run") for i in range(ROUNDS)]
    for model_dir in model_dirs[1::2]:
        os.makedirs(os.path.dirname(model_dir))
    barrier, results = SPAWN.Barrier(2), SPAWN.Queue()
    racers = [
        SPAWN.Process(target=lock_contender.race, args=(model_dirs, barrier, results, not flock)) for _ in range(2)
    ]
    for racer in racers:
        racer.start()
    try:
        outcomes = [results.get(timeout=300) for _ in range(2 * ROUNDS)]
    finally:
        for racer in racers:
            racer.join(timeout=60)
            if racer.is_alive():
                racer.kill()
    assert [racer.exitcode for racer in racers] == [0, 0]
    for round_number, model_dir in enumerate(model_dirs):
        (pid, outcome), (other_pid, other_outcome) = sorted(
            (pid, outcome) for number, pid, outcome in outcomes if number == round_number
        )
        assert pid != other_pid
        assert sorted([outcome == "won", other_outcome == "won"]) == [False, True], (round_number, outcome, other_outcome)
        winner, message = (pid, other_outcome) if outcome == "won" else (other_pid, outcome)
        assert re.match(in_use(model_dir, winner), message), message
        assert ("remove " in message) == (not flock)  # only a lock file without flock may be left behind
        # The lock went with its holder; an output_dir made only to hold it went too.
        output_dir = os.path.dirname(model_dir)
        assert (os.listdir(output_dir) == []) if round_number % 2 else not os.path.exists(output_dir)


# ---------------------------------------------------------------- one process, step by step
def test_a_run_is_refused_while_another_holds_the_directory_and_nothing_of_it_changes(tmp_path):
    model_dir = tmp_path / "out" / "run"
    with exclusive_use(str(model_dir)):
        path = lock_path(str(model_dir))
        assert path == str(tmp_path / "out" / ".run.lock")
        holder = open(path).read()
        # flock locks an open file description: a second open in this process is refused too.
        with pytest.raises(ModelDirectoryInUse, match=in_use(model_dir, os.getpid())):
            with exclusive_use(str(model_dir)):
                pytest.fail("two holders at once")
        assert open(path).read() == holder  # the refused run wrote nothing
        assert os.listdir(tmp_path / "out") == [".run.lock"]
    assert not os.path.exists(tmp_path / "out")  # made to hold the lock; empty, removed at the end
    with exclusive_use(str(model_dir)):  # free again
        pass


def test_a_lock_file_removed_by_its_holder_between_open_and_lock_is_not_taken(tmp_path, monkeypatch):
    """The file a run opened is released and removed, and a third run takes a new one, before
    the run's flock: it locks a file no one else will open, and must open again, not pass."""
    model_dir = str(tmp_path / "run")
    first = exclusive_use(model_dir)
    first.__enter__()
    third = exclusive_use(model_dir)
    real_flock, calls = run_lock._flock, []

    def flock_after_the_holder_changed(fd):
        calls.append(fd)
        if len(calls) == 1:
            first.__exit__(None, None, None)  # releases and removes the file `fd` is open on
            third.__enter__()  # creates and locks a new one
        real_flock(fd)

    monkeypatch.setattr(run_lock, "_flock", flock_after_the_holder_changed)
    with pytest.raises(ModelDirectoryInUse, match=in_use(model_dir, os.getpid())):
        with exclusive_use(model_dir):
            pytest.fail("two holders at once")
    # The removed file's flock (taken, then dropped), the third run's, and this run's again: refused.
    assert len(calls) == 3
    third.__exit__(None, None, None)
    assert os.listdir(tmp_path) == []


def test_an_empty_lock_file_left_by_an_earlier_version_is_taken(tmp_path):
    (tmp_path / ".run.lock").write_text("")
    with exclusive_use(str(tmp_path / "run")):
        pass
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- a holder killed
@pytest.mark.filterwarnings("ignore:.*no flock here")
@pytest.mark.parametrize("flock", [True, False], ids=["flock", "without_flock"])
def test_the_lock_of_a_run_killed_with_sigkill_is_taken_by_the_next_run(tmp_path, flock, monkeypatch):
    if not flock:
        monkeypatch.setattr(run_lock.fcntl, "flock", _no_locks)
    model_dir = str(tmp_path / "run")
    ready = SPAWN.Event()
    holder = SPAWN.Process(target=lock_contender.hold, args=(model_dir, ready, not flock))
    holder.start()
    try:
        assert ready.wait(300), "the holder did not take the lock"
        with pytest.raises(ModelDirectoryInUse, match=in_use(model_dir, holder.pid)):
            with exclusive_use(model_dir):
                pytest.fail("two holders at once")
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(60)
        assert holder.exitcode == -signal.SIGKILL
        assert os.path.exists(lock_path(model_dir))  # a killed run removes nothing
        with exclusive_use(model_dir):  # the kernel released the flock; without flock, the pid is dead
            assert re.match(rf'{{"pid": {os.getpid()}, ', open(lock_path(model_dir)).read())
    finally:
        if holder.is_alive():
            holder.kill()
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------- without flock
def test_without_flock_the_lock_file_is_the_lock_and_a_warning_says_so(tmp_path, no_flock):
    model_dir = str(tmp_path / "run")
    with pytest.warns(UserWarning, match=r"no flock here \(\[Errno \d+\] No locks available\); the lock is the file"):
        with exclusive_use(model_dir):
            with pytest.raises(ModelDirectoryInUse, match=in_use(model_dir, os.getpid())) as refused:
                with exclusive_use(model_dir):
                    pytest.fail("two holders at once")
            assert str(refused.value).endswith(f"Then remove {lock_path(model_dir)}.")
    assert os.listdir(tmp_path) == []


@pytest.mark.filterwarnings("ignore:.*no flock here")
def test_without_flock_a_lock_of_another_host_is_left_alone_and_one_of_a_dead_pid_here_removed(tmp_path, no_flock):
    model_dir, path = str(tmp_path / "run"), tmp_path / ".run.lock"
    elsewhere = '{"pid": 1, "host": "another-host.example", "started": "2024-01-01 00:00:00 UTC"}\n'
    path.write_text(elsewhere)
    message = (
        rf"{re.escape(model_dir)} is in use by another kt-train run \(pid 1 on host another-host.example, "
        r"started 2024-01-01 00:00:00 UTC\); wait for it to finish, or choose another `name` or `output_dir` "
        rf"\(--set name=... or --set output_dir=...\). No run uses it any more \(one killed on another host\)\? "
        rf"Then remove {re.escape(str(path))}\.$"
    )
    with pytest.raises(ModelDirectoryInUse, match=message):
        with exclusive_use(model_dir):
            pytest.fail("another host's lock taken")
    assert path.read_text() == elsewhere
    # A lock file this host's dead process left: removed, and the run goes on.
    path.write_text(f'{{"pid": {_dead_pid()}, "host": "{socket.gethostname()}", "started": "then"}}\n')
    with exclusive_use(model_dir):
        assert f'"pid": {os.getpid()}' in path.read_text()
    # One that does not say who holds it is left alone too.
    path.write_text("")
    with pytest.raises(ModelDirectoryInUse, match=r"\(its lock .*\.run\.lock does not say which\)"):
        with exclusive_use(model_dir):
            pytest.fail("an unreadable lock taken")
    assert sorted(os.listdir(tmp_path)) == [".run.lock"]


# ---------------------------------------------------------------- run_training
def _refuse_at_plan(recorded):
    def plan_run(run_config, chief, print_fn):
        recorded.append(("plan", os.path.exists(lock_path(run_config.model_dir))))
        raise RuntimeError("stopped at the plan")

    return plan_run


@pytest.mark.parametrize("chief", [True, False], ids=["chief", "worker"])
def test_only_the_chief_takes_the_lock_and_before_it_reads_the_directory(tmp_path, monkeypatch, chief):
    recorded = []
    monkeypatch.setattr(run.distribute, "is_chief", lambda: chief)
    monkeypatch.setattr(run, "_plan_run", _refuse_at_plan(recorded))
    real = run.exclusive_use
    monkeypatch.setattr(run, "exclusive_use", lambda model_dir: (recorded.append(("lock", model_dir)), real(model_dir))[1])
    config = RunConfig(name="run", output_dir=str(tmp_path / "out"))
    with pytest.raises(RuntimeError, match="stopped at the plan"):
        run.run_training(config, print_fn=lambda line: None)
    if chief:
        assert recorded == [("lock", config.model_dir), ("plan", True)]  # held while the plan reads
    else:
        assert recorded == [("plan", False)]  # a worker writes nowhere there: no lock
    assert not os.path.exists(tmp_path / "out")


SOURCE_WORDS = "red blue green black white small big old new one two three".split()
TARGET_WORDS = "rot blau gruen schwarz weiss klein gross alt neu eins zwei drei".split()


def _tiny_run(tmp_path):
    rng = np.random.default_rng(0)
    words = [rng.integers(0, 12, size=1 + i % 2) for i in range(100)]
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "train.en").write_text("".join(" ".join(SOURCE_WORDS[w] for w in ws) + "\n" for ws in words))
    (corpus / "train.de").write_text("".join(" ".join(TARGET_WORDS[w] for w in ws[::-1]) + "\n" for ws in words))
    return dict(
        name="tiny", output_dir=str(tmp_path / "runs"), corpus="files", data_dir=str(corpus),
        validation_split="", test_split="", vocab_size=40, epochs=1, tokens_per_batch=200, bleu_every_epochs=0,
        sample_translations=0, jit_compile=False, verbose=0,
        model=dict(d_model=16, d_ff=32, num_heads=2, num_encoder_layers=1, num_decoder_layers=1, max_length=8,
                   dropout=0.0),
    )


@once_on("tensorflow", "the lock is taken before anything backend-specific runs")
def test_run_training_is_refused_while_another_run_trains_there_and_runs_once_it_is_killed(tmp_path, capsys):
    from keras_transformer.cli import train as train_cli
    from keras_transformer.model.directory import load_model_and_tokenizer

    settings = _tiny_run(tmp_path)
    config = RunConfig(**settings)
    ready = SPAWN.Event()
    staged = {"tokenizer.model": "the first run's tokenizer", "training_log.csv": "epoch,loss\n0,9.1\n"}
    staging = run_directory.staging_directory(config.model_dir)
    holder = SPAWN.Process(target=lock_contender.hold, args=(config.model_dir, ready, False, staging, staged))
    holder.start()
    try:
        assert ready.wait(300), "the holder did not take the lock"
        before = tree_digest(tmp_path / "runs")
        assert sorted(before) == [".tiny.lock", ".tiny.staging/tokenizer.model", ".tiny.staging/training_log.csv"]
        with pytest.raises(ModelDirectoryInUse, match=in_use(config.model_dir, holder.pid)):
            run.run_training(config, print_fn=lambda line: None)
        # kt-train: one line, exit status 2.
        argv = ["--config", os.path.join(REPO, "training", "configs", "demo.toml"), "--set", f"output_dir={settings['output_dir']}",
                "--set", "name=tiny"]
        capsys.readouterr()
        with pytest.raises(SystemExit) as exit_status:
            train_cli.main(argv)
        assert exit_status.value.code == 2
        error = capsys.readouterr().err
        assert re.fullmatch("kt-train: error: " + in_use(config.model_dir, holder.pid) + r".*\n", error), error
        assert tree_digest(tmp_path / "runs") == before  # nothing of the first run touched
        os.kill(holder.pid, signal.SIGKILL)
        holder.join(60)
    finally:
        if holder.is_alive():
            holder.kill()
    # The killed run's staging directory (no epoch finished, so no backup/) is started again.
    result = run.run_training(config, print_fn=lambda line: None)
    assert result.model_dir == config.model_dir
    load_model_and_tokenizer(config.model_dir)
    assert os.listdir(tmp_path / "runs") == ["tiny"]  # no staging, no lock left
