"""Training over several PyTorch processes started by torchrun: one replica of the model each.

Keras 3.15 has no multi-device `fit` on PyTorch, so a PyTorch run scales out the way
PyTorch's own data parallelism does: one process per GPU (or per CPU share), started by

    torchrun --standalone --nproc_per_node=2 kt-train --config ... --set strategy=data_parallel

which gives each process `RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR` and `MASTER_PORT`.
Every process holds the whole model and trains it on its rows of every global batch;
`train.torch_data_parallel` averages the gradients of each step across the processes, so
every process applies the same update and the weights stay the same everywhere. Here:

- `initialize()` joins the processes (`torch.distributed.init_process_group` from torchrun's
  environment): NCCL with one GPU a process (`cuda:LOCAL_RANK`, made the current device
  before any variable exists) where CUDA is there, else gloo on CPU. Every collective
  waits at most `timeout_seconds()` (`KERAS_TRANSFORMER_TORCH_TIMEOUT_SECONDS`, default
  600) for the others.
- `TorchDataParallel`, the engine `distribute.select_strategy` returns for "data_parallel"
  (and "auto" under torchrun): what `num_replicas` and `describe` read.
- `shard()`: this process's rows of every global batch, `Shard(rank, world_size)` of
  `data.index_batches`: every process plans the same global batches (the config's token
  budget is the global batch) and gathers rows `rank::world_size` of each, topped up with
  all-padding rows to the same count everywhere. `process_dataset` makes its batches.
- `check_same_run` refuses to start processes that would train different runs (another
  config, corpus or tokenizer), naming what differs.
- `ProcessSync`: the chief's word is final: the weights, optimizer state and epoch a run
  resumes from, when training stops (a time budget reads each process's own clock), and
  a budgeted schedule's total steps (`StepBudgetEstimator` times each process's steps).
- `is_chief()`: rank 0 writes the model directory, logs and checkpoints.

Faults. A process that dies makes the others' next collective fail at once (gloo reports
the closed connection at once), and torchrun, whose agent checks its workers every 0.1 s,
stops the rest of the group with SIGTERM and reports the process that failed first. A
process that hangs (alive but not answering) is noticed by the collective timeout.
Whichever comes first, a process that cannot go on raises `ProcessGroupFailed` (SIGTERM
included), one line naming this process and the cause, which `kt-train` prints as its
error (exit status 2); the run resumes when started again.
"""

import atexit
import contextlib
import datetime
import hashlib
import json
import os
import signal
import threading

import numpy as np

from keras_transformer.chief_sync import ChiefSync


# torchrun's variables; WORLD_SIZE above 1 asks for several processes.
ENVIRONMENT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TIMEOUT_ENVIRONMENT = "KERAS_TRANSFORMER_TORCH_TIMEOUT_SECONDS"
# How long a collective waits for a process that stopped answering. Generous: every process
# waits at its first collective for the slowest to finish preparing (tokenizer, binarized
# corpus) and at each epoch's end for the chief's checkpoints; a process that dies is
# noticed at once anyway (its connections close). PyTorch's own default is 30 minutes.
DEFAULT_TIMEOUT_SECONDS = 600

_state = {"control": None}  # the group for small host-side messages (gloo; the default group under gloo)


class ProcessGroupFailed(ConnectionError):
    """Another process of the run stopped or stopped answering, so this one cannot go on."""


def requested_world_size():
    """`WORLD_SIZE` from the environment (torchrun sets it), 1 when unset."""
    raw = os.environ.get("WORLD_SIZE", "").strip()
    if not raw:
        return 1
    try:
        size = int(raw)
    except ValueError:
        size = 0
    if size < 1:
        raise ValueError(f"WORLD_SIZE must be a positive whole number (torchrun sets it). Received: {raw!r}")
    return size


def launched():
    """Whether torchrun started this process (`RANK` is set), one of several or alone."""
    return bool(os.environ.get("RANK", "").strip())


def requested():
    """Whether torchrun started this process as one of several (`WORLD_SIZE` > 1)."""
    return requested_world_size() > 1


def timeout_seconds():
    """How long a collective waits: `KERAS_TRANSFORMER_TORCH_TIMEOUT_SECONDS`, else 600."""
    raw = os.environ.get(TIMEOUT_ENVIRONMENT, "").strip()
    if not raw:
        return DEFAULT_TIMEOUT_SECONDS
    try:
        seconds = int(raw)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise ValueError(f"{TIMEOUT_ENVIRONMENT} must be a positive whole number of seconds. Received: {raw!r}")
    return seconds


def initialize():
    """Joins this process to the others of its torchrun job, once; returns how many there are.

    Does nothing (and returns 1) when `WORLD_SIZE` is not above 1. With CUDA, process
    `LOCAL_RANK` takes GPU `LOCAL_RANK` (the current device, which Keras' "cuda" means) and
    the processes talk over NCCL, with a gloo group beside it for small host-side messages;
    without CUDA, gloo on CPU. Call it before the model is built: `select_strategy` does.

    Raises:
        ValueError: `WORLD_SIZE` is set without the rest of torchrun's variables, or names
            more processes on this machine than it has GPUs.
    """
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    if not requested():
        return 1
    missing = [name for name in ENVIRONMENT if not os.environ.get(name, "").strip()]
    if missing or not dist.is_available():
        raise ValueError(
            f"WORLD_SIZE={os.environ['WORLD_SIZE']} asks for several PyTorch processes, but "
            + (f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set" if missing
               else "this PyTorch has no torch.distributed")
            + ": start them with torchrun (torchrun --nproc_per_node=N kt-train ...), which sets "
            f"{', '.join(ENVIRONMENT)}."
        )
    timeout = datetime.timedelta(seconds=timeout_seconds())
    if torch.cuda.is_available():
        local_rank = int(os.environ["LOCAL_RANK"])
        if local_rank >= torch.cuda.device_count():
            raise ValueError(
                f"LOCAL_RANK={local_rank}, but this machine shows {torch.cuda.device_count()} GPU(s): "
                "start at most one process per GPU (torchrun --nproc_per_node)."
            )
        _check_keras_device(f"cuda:{local_rank}")
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", timeout=timeout, device_id=torch.device("cuda", local_rank))
        _state["control"] = dist.new_group(backend="gloo", timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
        _state["control"] = dist.group.WORLD
    atexit.register(_destroy)
    _stop_on_sigterm()
    return dist.get_world_size()


def is_multi_process():
    """Whether this process is one of several joined by `initialize()`."""
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank():
    """This process's number, from 0 (`RANK` before `initialize()`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return int(os.environ.get("RANK", "0").strip() or 0)


def world_size():
    """How many processes train the run (`WORLD_SIZE` before `initialize()`)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return requested_world_size()


def is_chief():
    """True in rank 0 (and in a lone process): the one that writes the model directory."""
    return rank() == 0


def device():
    """The device this process trains on: `cuda:LOCAL_RANK` under NCCL, else the CPU."""
    import torch

    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


class TorchDataParallel:
    """The engine of a PyTorch run over several processes: one replica of the model each.

    What `distribute.select_strategy("data_parallel")` returns under torchrun. Its `scope()`
    does nothing: each process builds its own model, and `compile_transformer` attaches the
    gradient averaging (`train.torch_data_parallel.attach`) while several processes run.

    Attributes:
        rank: int, this process's number.
        world_size: int, the processes (replicas).
        backend: str, "nccl" or "gloo".
        device: `torch.device` this process trains on.
    """

    def __init__(self):
        import torch.distributed as dist

        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.backend = str(dist.get_backend())
        self.device = device()

    @contextlib.contextmanager
    def scope(self):
        yield self

    def describe(self):
        return (
            f"PyTorch data parallel, {self.world_size} processes over {self.backend}: "
            f"rank {self.rank} on {self.device}"
        )

    def __repr__(self):
        return f"TorchDataParallel(rank={self.rank}, world_size={self.world_size}, backend={self.backend!r})"


def shard():
    """This process's `Shard` of every global batch: rows `rank::world_size`."""
    from keras_transformer.data.index_batches import Shard

    return Shard(rank(), world_size())


def process_dataset(make_batches, start=0):
    """This process's rows of every global batch from global batch `start`: an endless `tf.data.Dataset`.

    Args:
        make_batches: callable from a `Shard` to an `IndexBatches` with that shard, or an
            `IndexBatches` made with `shard=shard()`.
        start: int, the global batch to start at (a resumed run's).
    """
    own = shard()
    batches = make_batches(own) if callable(make_batches) else make_batches
    if batches.shard != own:
        raise ValueError(f"The IndexBatches must be made with this process's shard {own}. Received: {batches.shard}")
    return batches.dataset(start)


def check_same_run(values):
    """Refuses to start unless every process holds the same `values`; returns nothing.

    Each value (anything `json.dumps` takes, with `default=str`) is hashed; the hashes of
    all processes are gathered (`all_gather_object`) and compared with rank 0's. Every
    process calls it at the same point.

    Args:
        values: `{name: value}`, e.g. each run-config key, the corpus's and the tokenizer's
            fingerprints.

    Raises:
        ValueError: naming each value that differs, the processes that differ from rank 0,
            and this process's own value.
    """
    import torch.distributed as dist

    if not is_multi_process():
        return
    names = sorted(values)
    digests = [_digest(values[name]) for name in names]
    gathered = [None] * dist.get_world_size()
    with collectives("comparing the processes' runs"):
        dist.all_gather_object(gathered, (names, digests), group=_state["control"])
    differing = []
    for index, name in enumerate(names):
        others = [
            str(process) for process, (their_names, theirs) in enumerate(gathered)
            if their_names != names or theirs[index] != gathered[0][1][index]
        ]
        if others:
            differing.append(
                f"{name} (process {', '.join(others)} differs from process 0; here, process "
                f"{dist.get_rank()}: {_shown(values[name])})"
            )
    if differing:
        raise ValueError(
            f"The {len(gathered)} PyTorch processes would train different runs: " + "; ".join(differing)
            + ". Start every process with the same command, run config, corpus and tokenizer."
        )


def chief_value(value):
    """Rank 0's `value` (anything picklable) in every process; `value` itself in a lone process."""
    import torch.distributed as dist

    if not is_multi_process():
        return value
    box = [value]
    with collectives("receiving the chief's value"):
        dist.broadcast_object_list(box, src=0, group=_state["control"])
    return box[0]


def broadcast_from_chief(variables):
    """Gives every process rank 0's values of `variables` (Keras variables), in place."""
    import torch
    import torch.distributed as dist

    if not is_multi_process():
        return
    with torch.no_grad(), collectives("receiving the chief's weights"):
        for variable in variables:
            dist.broadcast(variable.value.data, src=0)


@contextlib.contextmanager
def collectives(doing):
    """Turns a collective's failure into `ProcessGroupFailed`: one line naming this process and the cause."""
    try:
        yield
    except RuntimeError as error:  # gloo and NCCL raise RuntimeError (DistBackendError) on a lost peer or timeout
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ProcessGroupFailed(
            f"process {rank()} of {world_size()} stopped while {doing}: another process of the run "
            f"failed or stopped answering ({first_line}). Start the same command again to resume."
        ) from error


class ProcessSync(ChiefSync):
    """`ChiefSync` over torchrun's processes (`torch.distributed` broadcasts from rank 0)."""

    def _is_multi_process(self):
        return is_multi_process()

    def _broadcast_variables(self, variables):
        broadcast_from_chief(variables)

    def _broadcast_ints(self, values):
        import torch
        import torch.distributed as dist

        state = torch.tensor(values, dtype=torch.int64)
        with collectives("agreeing with the chief on when to stop"):
            dist.broadcast(state, src=0, group=_state["control"])
        return [int(value) for value in state]


def _stop_on_sigterm():
    """SIGTERM raises `ProcessGroupFailed`: torchrun's way of ending the others when one process fails.

    Without it the process would vanish without a word (Python's default for SIGTERM);
    with it, the run unwinds as after any error (its lock, its staging directory) and says
    why in one line. A handler the program set itself is kept; a thread other than the
    main one cannot set one.
    """
    if threading.current_thread() is not threading.main_thread() or signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
        return

    def stop(signum, frame):
        raise ProcessGroupFailed(
            f"process {rank()} of {world_size()} stopped: torchrun ended the run (SIGTERM), as it does when "
            "another process of the run failed. Start the same command again to resume."
        )

    signal.signal(signal.SIGTERM, stop)


def _check_keras_device(expected):
    chosen = os.environ.get("KERAS_TORCH_DEVICE", "").strip()
    if chosen and chosen != expected:
        raise ValueError(
            f"KERAS_TORCH_DEVICE={chosen!r} would put every process on one device; under torchrun "
            f"each process trains on its own GPU ({expected} here). Unset KERAS_TORCH_DEVICE."
        )


def _destroy():
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


def _digest(value):
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _shown(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def corpus_fingerprint(corpus):
    """A digest of what a `BinarizedCorpus` holds, cheap for a file corpus (its files' recorded checksums)."""
    meta = {key: value for key, value in corpus.meta.items() if key != "seconds"}
    if "files" in meta:  # on disk: the blake2b of each array, recorded while writing
        return _digest(meta)
    digest = hashlib.blake2b(json.dumps(meta, sort_keys=True).encode())
    for array in (corpus.source_ids, corpus.target_ids, corpus.source_offsets, corpus.target_offsets):
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


__all__ = [
    "DEFAULT_TIMEOUT_SECONDS",
    "ENVIRONMENT",
    "TIMEOUT_ENVIRONMENT",
    "ProcessGroupFailed",
    "ProcessSync",
    "TorchDataParallel",
    "broadcast_from_chief",
    "check_same_run",
    "chief_value",
    "collectives",
    "corpus_fingerprint",
    "device",
    "initialize",
    "is_chief",
    "is_multi_process",
    "launched",
    "process_dataset",
    "rank",
    "requested",
    "requested_world_size",
    "shard",
    "timeout_seconds",
    "world_size",
]
