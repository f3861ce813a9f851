"""torch_processes.py and train/torch_data_parallel.py: one model trained by torchrun's processes.

The children (tests/torch_ddp_child.py) are two processes of `python -m
torch.distributed.run --standalone --nproc_per_node=2`, gloo on loopback CPU; the
references train in one process, the test's own. The rest runs in this process, in a
process group of one.
"""

import json
import os
import pathlib
import subprocess
import sys
import time

import keras
import numpy as np
import pytest

import distributed_child
import jax_process_child
import torch_ddp_child
from test_distribute import LOSS_RTOL, WEIGHT_ATOL, child_env

BACKEND = keras.backend.backend()
CHILD = pathlib.Path(torch_ddp_child.__file__)
CHILD_TIMEOUT_S = 300
# The children's collective timeout: a process that stops answering is given up on after it.
TIMEOUT_SECONDS = 20

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="runs in the torch session")


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


def torchrun(arguments, tmp_path, **env):
    """Starts two children under torchrun; returns the Popen (stdout and stderr piped)."""
    variables = dict(OMP_NUM_THREADS="1", OUT_DIR=str(tmp_path), TMPDIR=str(tmp_path),
                     KERAS_TRANSFORMER_TORCH_TIMEOUT_SECONDS=str(TIMEOUT_SECONDS), **env)
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", str(CHILD), *arguments],
        env=child_env("torch", **variables), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def finished(process):
    """`(returncode, stdout, stderr)` once `process` ends (killed if it outlives CHILD_TIMEOUT_S)."""
    try:
        stdout, stderr = process.communicate(timeout=CHILD_TIMEOUT_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    return process.returncode, stdout, stderr


# ------------------------------------------------------------- two processes as one
def test_two_processes_train_as_one_process_on_the_same_global_batches(corpus, tmp_path):
    from keras_transformer.data.index_batches import IndexBatches

    whole = IndexBatches(corpus, **jax_process_child.BATCHING)
    steps = range(distributed_child.STEPS)
    shapes = [whole.batch(step)[1].shape for step in steps]
    assert len(set(shapes)) == len(shapes) and any(rows % 2 for rows, _ in shapes)  # varying, one odd

    process = torchrun(["fit"], tmp_path, CORPUS_DIR=corpus.directory)
    references = {}  # one process on the whole batches, trained while the children train
    for mode in torch_ddp_child.MODES:
        losses, accuracies, model = torch_ddp_child.fit_losses(whole.dataset(), mode)
        references[mode] = losses, accuracies, torch_ddp_child.weights_of(model)
    status, stdout, stderr = finished(process)
    assert status == 0, stderr[-6000:]
    results = sorted((json.loads(line) for line in stdout.splitlines() if line.startswith("{")), key=lambda r: r["rank"])

    assert [result["rank"] for result in results] == [0, 1]
    assert [result["shard"] for result in results] == [[0, 2], [1, 2]]
    assert [result["is_chief"] for result in results] == [True, False]
    assert [result["describe"] for result in results] == [
        f"PyTorch data parallel, 2 processes over gloo: rank {rank} on cpu" for rank in (0, 1)
    ]
    assert results[0]["replicas"] == 2
    for rank, result in enumerate(results):
        assert result["mismatch"] == (
            "The 2 PyTorch processes would train different runs: tokens_per_batch (process 1 differs "
            f"from process 0; here, process {rank}: {32 + rank}). Start every process with the same "
            "command, run config, corpus and tokenizer."
        )
    for step in steps:
        shares = [[tuple(row) for row in result["rows"][step] if any(row)] for result in results]
        assert len(results[0]["rows"][step]) == len(results[1]["rows"][step])  # the same shapes everywhere
        assert sorted(shares[0] + shares[1]) == sorted(tuple(row) for row in whole.batch(step)[0]["encoder_inputs"])
    for mode, (losses, accuracies, weights) in references.items():
        for result in results:
            # The mean over all the global batch's real tokens, and its metrics, as one process.
            np.testing.assert_allclose(result[mode]["losses"], losses, rtol=LOSS_RTOL, err_msg=mode)
            np.testing.assert_allclose(result[mode]["accuracies"], accuracies, rtol=LOSS_RTOL, err_msg=mode)
        for rank in (0, 1):
            saved = np.load(tmp_path / f"{mode}_{rank}.npz")
            assert sorted(saved.files) == sorted(weights)
            for path, value in weights.items():
                np.testing.assert_allclose(saved[path], value, atol=WEIGHT_ATOL, err_msg=f"{mode}: {path}")
    # The captured step took every shape at its first batch, in both processes.
    assert [result["captured"]["captures"] for result in results] == [len(shapes)] * 2
    assert [result["eager"]["captures"] for result in results] == [None] * 2


# ------------------------------------------------------------------ kt-train
RUN_CONFIG = """
name = "run"
corpus = "files"
source_lang = "en"
target_lang = "de"
validation_split = ""
test_split = ""
vocab_size = 40
epochs = 3
steps_per_epoch = 4
bleu_every_epochs = 0
sample_translations = 0
verbose = 0
jit_compile = false
keep_checkpoints = 1
tokens_per_batch = 48
strategy = "data_parallel"

[model]
d_model = 16
d_ff = 32
num_heads = 2
num_encoder_layers = 1
num_decoder_layers = 1
max_length = 8
dropout = 0.0
"""


def write_run(tmp_path):
    """A files corpus of 80 pairs and the run config of a 3-epoch run over it; returns kt-train's arguments."""
    rng = np.random.default_rng(0)
    source = "red blue green black white small big old new one two three".split()
    target = "rot blau gruen schwarz weiss klein gross alt neu eins zwei drei".split()
    words = [rng.integers(0, 12, size=1 + i % 3) for i in range(80)]
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.en").write_text("".join(" ".join(source[w] for w in ws) + "\n" for ws in words))
    (data / "train.de").write_text("".join(" ".join(target[w] for w in ws[::-1]) + "\n" for ws in words))
    config = tmp_path / "run.toml"
    paths = f'data_dir = "{data}"\noutput_dir = "{tmp_path / "out"}"\nbinarized_dir = "{tmp_path / "binarized"}"\n'
    config.write_text(paths + RUN_CONFIG)
    return ["run", "--config", str(config)]


def starts(tmp_path, pids=False):
    """{rank: [global batch each run's stream started at]}, runs in order of pid (or, `pids`, the pids)."""
    found = {}
    for path in sorted(tmp_path.glob("start_*"), key=lambda p: int(p.name.split("_")[2])):
        _, rank, pid = path.name.split("_")
        found.setdefault(int(rank), []).append(int(pid) if pids else int(path.read_text()))
    return found


def test_kt_train_under_torchrun_resumes_after_a_killed_process_and_only_the_chief_writes(tmp_path):
    arguments = write_run(tmp_path)
    model_dir = tmp_path / "out" / "run"
    staging = tmp_path / "out" / ".run.staging"

    # Rank 1 dies mid-epoch (global step 6 of 4-step epochs); rank 0 ends with one line and status 2.
    status, _, stderr = finished(torchrun(arguments, tmp_path, KILL_AT_STEP="6"))
    ended = time.time()
    assert status != 0
    lines = [line for line in stderr.splitlines() if line.startswith("kt-train: error: process 0 of 2 stopped")]
    assert len(lines) == 1, stderr[-6000:]
    # Its own collective failing, or torchrun's SIGTERM: whichever reached it first.
    assert "another process of the run failed" in lines[0]
    assert lines[0].endswith("Start the same command again to resume.")
    print(f"rank 0 and torchrun ended {ended - float((tmp_path / 'killed').read_text()):.2f} s after rank 1 was killed")
    assert not model_dir.exists() and (staging / "backup").is_dir()  # the first epoch's backup, to resume from

    # The same command resumes: every process starts at global batch 4 (one epoch done), as the chief says.
    status, _, stderr = finished(torchrun(arguments, tmp_path))
    assert status == 0, stderr[-6000:]
    assert starts(tmp_path) == {0: [0, 4], 1: [0, 4]}
    assert (model_dir / "model.keras").is_file() and not staging.exists()
    log = (model_dir / "training_log.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in log[1:]] == ["0", "1", "2"]  # each epoch once: one writer
    # TensorBoard names each events file after the process writing it: the chiefs' only (both runs').
    writers = {int(path.name.split(".")[-3]) for path in model_dir.rglob("events.out.tfevents.*")}
    assert writers and writers <= set(starts(tmp_path, pids=True)[0])
    # The other process wrote its callbacks' files into a scratch directory of its own, which it
    # deletes when the run ends: only the killed run's is left.
    scratch = [path for path in tmp_path.glob("keras_transformer_worker_*") if path.is_dir()]
    assert len(scratch) == 1 and (scratch[0] / "training_log.csv").is_file()


# ------------------------------------------------------------- in this process
@pytest.fixture
def world_of_one(tmp_path):
    """A gloo process group of one process, removed afterwards."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _parameters():
    import torch

    return [torch.nn.Parameter(torch.full(shape, float(index + 1))) for index, shape in enumerate([(3,), (2, 2), (5,)])]


def test_gradient_buckets_close_at_the_size_in_backward_order_with_the_extras_last(world_of_one):
    import torch

    from keras_transformer.train.torch_data_parallel import GradientBuckets

    parameters = _parameters()
    buckets = GradientBuckets(parameters, extras=3, bucket_bytes=5 * 4)  # 5 float32 a bucket
    try:
        assert [[id(p) for p in bucket.parameters] for bucket in buckets.buckets] == [
            [id(parameters[2])], [id(parameters[1])], [id(parameters[0])]
        ]
        assert [bucket.flat.numel() for bucket in buckets.buckets] == [5, 4, 3 + 3]
        weight = torch.tensor(4.0)
        buckets.start(weight, torch.tensor([4.0, 8.0, 1.0]))
        (sum((p * (i + 1)).sum() for i, p in enumerate(parameters[1:]))).backward()  # parameters[0]: no gradient
        extras = buckets.finish()
        # One process: its weight times its gradient, over its weight; zeros where backward made none.
        assert [p.grad.tolist() for p in parameters] == [[0.0] * 3, [[1.0, 1.0], [1.0, 1.0]], [2.0] * 5]
        assert extras.tolist() == [4.0, 8.0, 1.0]
    finally:
        buckets.remove()


def test_a_backward_pass_outside_the_step_is_refused_not_left_unaveraged(world_of_one):
    from keras_transformer.train.torch_data_parallel import GradientBuckets

    parameters = _parameters()
    buckets = GradientBuckets(parameters, extras=2)
    try:
        with pytest.raises(RuntimeError, match="outside the data-parallel training step.*would not be averaged"):
            parameters[0].sum().backward()
    finally:
        buckets.remove()


def test_a_process_weighs_its_real_target_tokens_or_else_its_label_elements():
    import torch

    from keras_transformer.train.losses import LabelSmoothedCrossEntropy
    from keras_transformer.train.torch_data_parallel import local_weight

    class Compiled:
        loss = LabelSmoothedCrossEntropy()

    labels = np.array([[5, 6, 0], [7, 0, 0]], "int32")
    assert float(local_weight(Compiled(), labels)) == 3.0  # the padding (0) is no token
    Compiled.loss = keras.losses.MeanSquaredError()
    assert float(local_weight(Compiled(), labels)) == 6.0
    assert local_weight(Compiled(), labels).dtype == torch.float32


def test_a_failed_collective_becomes_one_line_naming_this_process(monkeypatch):
    from keras_transformer import torch_processes

    with pytest.raises(torch_processes.ProcessGroupFailed) as caught:
        with torch_processes.collectives("averaging the gradients"):
            raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:1234.\nmore detail")
    assert str(caught.value) == (
        "process 0 of 1 stopped while averaging the gradients: another process of the run failed or stopped "
        "answering ([pair.cc:553] Connection closed by peer [127.0.0.1]:1234.). Start the same command "
        "again to resume."
    )
    assert isinstance(caught.value, OSError)  # kt-train prints it as its one-line error


def test_torchruns_variables_are_checked_before_joining(monkeypatch):
    from keras_transformer import torch_processes

    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(ValueError, match=r"WORLD_SIZE=2 asks for several PyTorch processes, but RANK, "
                                         r"LOCAL_RANK, MASTER_ADDR, MASTER_PORT are not set: start them with torchrun"):
        torch_processes.initialize()
    monkeypatch.setenv(torch_processes.TIMEOUT_ENVIRONMENT, "soon")
    with pytest.raises(ValueError, match=r"KERAS_TRANSFORMER_TORCH_TIMEOUT_SECONDS must be a positive whole number"):
        torch_processes.timeout_seconds()
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert torch_processes.initialize() == 1 and not torch_processes.is_multi_process()


def test_one_process_trains_as_it_did_without_data_parallelism():
    from conftest import tiny_config
    from keras_transformer import build_transformer
    from keras_transformer.train import torch_data_parallel
    from keras_transformer.train.compile import compile_transformer

    model = compile_transformer(build_transformer(tiny_config()))
    step = model.captured_train_step
    assert torch_data_parallel.attach(model) is model and model.captured_train_step is step
