"""jax_processes.py: one DataParallel model trained by several JAX processes on loopback.

Each child (tests/jax_process_child.py) is one JAX process with one host device, joined
to the others by Keras' variables (KERAS_DISTRIBUTION_*) and jax.distributed over gloo
on CPU; the references train on one device in the test's own process.
"""

import json
import os
import pathlib
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import distributed_child
import jax_process_child
from test_distribute import LOSS_RTOL, REPO, WEIGHT_ATOL, child_env, free_ports

BACKEND = keras.backend.backend()
CHILD = pathlib.Path(jax_process_child.__file__)
CHILD_TIMEOUT_S = 300

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="runs in the jax session")


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A binarized corpus whose token-budget batches vary in rows (odd counts too) and lengths."""
    from keras_transformer.data.binarized import write_binarized
    from keras_transformer.data.tokenizer import train_tokenizer

    rng = np.random.default_rng(0)
    words = "ein zwei drei vier haus katze hund baum".split()
    pairs = [(" ".join(rng.choice(words, 1 + i % 4)), " ".join(rng.choice(words, 1 + i % 3))) for i in range(40)]
    tokenizer = train_tokenizer([side for pair in pairs for side in pair], 24)  # ids below the model's 32
    return write_binarized(pairs, tokenizer, str(tmp_path_factory.mktemp("corpus") / "corpus"), progress=False)


def start_processes(mode, count=2, arguments=(), cwd=None, **env):
    """Starts `count` children of `mode` as the JAX processes of one run; returns the Popen objects.

    A list in `cwd` or in an `env` value gives each process its own.
    """
    address = f"127.0.0.1:{free_ports(1)[0]}"
    flags = f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=1".strip()
    processes = []
    for index in range(count):
        variables = dict(
            KERAS_DISTRIBUTION_JOB_ADDRESSES=address,
            KERAS_DISTRIBUTION_NUM_PROCESSES=str(count),
            KERAS_DISTRIBUTION_PROCESS_ID=str(index),
            XLA_FLAGS=flags,
            **{key: value[index] if isinstance(value, list) else value for key, value in env.items()},
        )
        processes.append(subprocess.Popen(
            [sys.executable, str(CHILD), mode, *arguments], env=child_env("jax", **variables),
            cwd=cwd[index] if cwd else None, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))
    return processes


def results_of(processes, while_waiting=None):
    """Each child's JSON line (and `while_waiting()`, run while they work); a failed child fails the test."""
    try:
        extra = while_waiting() if while_waiting else None
        outputs = [process.communicate(timeout=CHILD_TIMEOUT_S) for process in processes]
    finally:
        stop(processes)
    for process, (_, stderr) in zip(processes, outputs):
        assert process.returncode == 0, stderr[-6000:]
    return [json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs], extra


def stop(processes):
    for process in processes:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_two_processes_train_as_one_device_on_the_same_global_batches(corpus, tmp_path):
    from keras_transformer.data.index_batches import IndexBatches

    whole = IndexBatches(corpus, **jax_process_child.BATCHING)
    steps = range(distributed_child.STEPS)
    shapes = [whole.batch(step)[1].shape for step in steps]
    assert len(set(shapes)) == len(shapes) and any(rows % 2 for rows, _ in shapes)  # varying, one odd

    def reference():  # one device on the whole batches, trained while the processes train
        losses, _, model = distributed_child.fit_losses("default", data=whole.dataset())
        return losses, {weight.path: np.asarray(weight.value) for weight in model.weights}

    processes = start_processes("fit", CORPUS_DIR=corpus.directory, OUT_DIR=str(tmp_path))
    results, (losses, weights) = results_of(processes, reference)

    assert [result["process"] for result in results] == [[0, 2], [1, 2]]
    assert [result["shard"] for result in results] == [[0, 2], [1, 2]]
    assert [result["is_chief"] for result in results] == [True, False]
    assert results[0]["replicas"] == 2 and results[0]["describe"].endswith("(2 processes)")
    for step in steps:
        shares = [[tuple(row) for row in result["rows"][step] if any(row)] for result in results]
        assert len(results[0]["rows"][step]) == len(results[1]["rows"][step])  # the same shapes everywhere
        full = [tuple(row) for row in whole.batch(step)[0]["encoder_inputs"]]
        assert sorted(shares[0] + shares[1]) == sorted(full)  # each row once: none dropped, none twice
    for result in results:
        # One program over the global batch: the mean over all its real tokens, as one device.
        np.testing.assert_allclose(result["losses"], losses, rtol=LOSS_RTOL)
    assert losses[-1] < losses[0]
    for index in range(2):
        saved = np.load(tmp_path / f"process_{index}.npz")
        assert sorted(saved.files) == sorted(weights)
        for path, value in weights.items():
            np.testing.assert_allclose(saved[path], value, atol=WEIGHT_ATOL, err_msg=path)


def test_kt_train_over_two_processes_writes_only_in_the_chief(tmp_path):
    from keras_transformer.model.directory import CONFIG_FILE, CSV_LOG_FILE, MANIFEST_FILE, MODEL_FILE, TOKENIZER_FILE

    settings = dict(
        demo_num_train=300, vocab_size=64, max_train_seconds=0, epochs=1, steps_per_epoch=2, verbose=2,
        tokens_per_batch=200, bleu_every_epochs=1, bleu_samples=2, sample_translations=1, jit_compile="auto",
        **{"training.decay": "rsqrt", "model.d_model": 16, "model.d_ff": 32, "model.num_heads": 2,
           "model.num_encoder_layers": 1, "model.num_decoder_layers": 1, "model.max_length": 24},
    )
    arguments = ["--config", str(REPO / "training" / "configs" / "demo.toml")]
    for key, value in settings.items():
        arguments += ["--set", f"{key}={value}"]
    directories = [tmp_path / name for name in ("chief", "chief_tmp", "other", "other_tmp")]
    for directory in directories:
        directory.mkdir()
    chief, chief_tmp, other, other_tmp = directories
    processes = start_processes(
        "kt_train", arguments=arguments, cwd=[chief, other], TMPDIR=[str(chief_tmp), str(other_tmp)]
    )
    results, _ = results_of(processes)

    assert results == [{"status": 0}, {"status": 0}]
    model_dir = chief / "saved_models" / "demo"
    for name in (MODEL_FILE, TOKENIZER_FILE, CONFIG_FILE, MANIFEST_FILE, CSV_LOG_FILE):
        assert (model_dir / name).is_file(), name
    with open(model_dir / CSV_LOG_FILE) as file:
        assert len(file.read().strip().splitlines()) == 2  # the header, one epoch (val_bleu included)
    # The other process wrote nothing where it ran, and deleted its scratch directory.
    assert list(other.iterdir()) == [] and list(other_tmp.iterdir()) == []


def test_processes_that_would_train_different_runs_are_refused_naming_the_difference():
    results, _ = results_of(start_processes("mismatch"))
    for index, result in enumerate(results):
        assert result["error"] == (
            "The 2 JAX processes would train different runs: tokens_per_batch (process 1 differs from "
            f"process 0; here, process {index}: {32 + index}). Start every process with the same command, "
            "run config, corpus and tokenizer."
        )


def test_a_killed_process_ends_the_others_with_a_nonzero_status(corpus, tmp_path):
    # The chief: the others lose the runtime's coordinator at once. A killed process 1 is
    # noticed by the missing heartbeats instead (measured in docs/scaling_out.md: a short
    # heartbeat is missed now and then on this loaded 2-core host, so the test does not rely on it).
    processes = start_processes("fault", CORPUS_DIR=corpus.directory, OUT_DIR=str(tmp_path))
    chief, other = processes
    try:
        wait_for_marker(tmp_path / "step_1", processes)
        chief.send_signal(signal.SIGKILL)
        _, stderr = other.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        stop(processes)
    assert other.returncode != 0
    assert "Terminating process because the JAX distributed service detected fatal errors" in stderr


def test_the_heartbeat_is_read_from_the_environment(monkeypatch):
    from keras_transformer import jax_processes

    monkeypatch.delenv(jax_processes.HEARTBEAT_ENVIRONMENT, raising=False)
    assert jax_processes.heartbeat_seconds() == 30
    monkeypatch.setenv(jax_processes.HEARTBEAT_ENVIRONMENT, "7")
    assert jax_processes.heartbeat_seconds() == 7
    for bad in ("0", "-3", "2.5", "soon"):
        monkeypatch.setenv(jax_processes.HEARTBEAT_ENVIRONMENT, bad)
        with pytest.raises(ValueError, match=rf"must be a positive whole number of seconds. Received: '{bad}'"):
            jax_processes.heartbeat_seconds()


def test_a_process_that_raises_stops_the_others_at_once_with_one_line(corpus, tmp_path):
    failing = 0  # the chief: the runtime's coordinator goes with it (process 1 failing is measured in docs)
    processes = start_processes("fault", CORPUS_DIR=corpus.directory, OUT_DIR=str(tmp_path), RAISE_IN=str(failing))
    try:
        outputs = [process.communicate(timeout=CHILD_TIMEOUT_S) for process in processes]
    finally:
        stop(processes)
    other = 1 - failing
    assert [process.returncode for process in processes] == [1, 1]
    message = f"RuntimeError: process {failing} failed on purpose"
    assert outputs[failing][1].rstrip().endswith(message)  # its own traceback, then nothing of JAX's
    assert outputs[other][1].rstrip().splitlines()[-1] == (
        f"JAX process {failing} of 2 failed ({message}); JAX process {other} of 2 stops too"
    )


def wait_for_marker(path, processes, timeout=CHILD_TIMEOUT_S):
    """Waits until `path` exists; fails with a child's stderr if one ended first."""
    import time

    deadline = time.monotonic() + timeout
    while not path.exists():
        for process in processes:
            if process.poll() is not None:
                pytest.fail(f"a process ended before {path.name}: {process.stderr.read()[-4000:]}")
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.2)
