"""Training over several JAX processes: one `DataParallel` model over all their devices.

A TPU pod slice above one host, or GPUs on several machines, run one JAX process per
host. Each is started with the same command and Keras' three variables
(`KERAS_DISTRIBUTION_JOB_ADDRESSES`, `KERAS_DISTRIBUTION_NUM_PROCESSES`,
`KERAS_DISTRIBUTION_PROCESS_ID`; a TPU slice or SLURM fills in the ones left out), and:

- `initialize()` calls `keras.distribution.initialize()` (which calls
  `jax.distributed.initialize`) before JAX starts its backend, with the distributed
  runtime's heartbeat timeout set to `heartbeat_seconds()` (its shutdown barrier's to
  twice that): a process that is killed or hangs ends every other one within about the
  heartbeat (the runtime aborts them with "Terminating process because the JAX
  distributed service detected fatal errors") instead of JAX's 100 s. A process that raises reports it
  first (`report_failure`, through the runtime's key-value store): every other one
  stops at once with one line naming it, and status 1.
- `data_parallel()` is `keras.distribution.DataParallel` over every process's devices,
  each process's devices side by side on the batch axis, with Keras' own sharding of
  the dataset off (`auto_shard_dataset=False`): Keras can only split a dataset whose
  batch size is static, which the token-budget batches are not. Each process instead
  feeds its own rows of every global batch (`process_dataset`, `process_rows`), and
  Keras' JAX trainer makes them one global `jax.Array`
  (`jax.make_array_from_process_local_data`), so one program runs over the global
  batch: the loss is the mean over all its real tokens, the metrics, the learning rate
  and the step count are global, exactly as on one process's devices.
- Every process gets the same number of rows: with `R` processes of `L` devices each,
  a global batch of `n` pairs is cut into `R * L` parts of `ceil(n / (R * L))` rows
  (`data.index_batches.Shard`: rows `i::R*L`, topped up with all-padding rows, which
  the loss and the metrics ignore), and process `p` feeds parts `p*L ... p*L + L - 1`.
  Every process plans the same global batches, so the parts are disjoint, cover the
  batch, and have the same shapes on every process.
- `check_same_run` compares what each process is about to train (its run config, the
  corpus's content, the tokenizer) and refuses to start, naming what differs.
- `ProcessSync` makes the chief's word final: the weights and epoch it resumed from,
  whether to stop (a time budget read from each process's own clock could stop one
  process a step before another, which would leave it waiting forever) and a budgeted
  schedule's total steps.
- `is_chief()`: process 0 writes the model directory, logs and checkpoints.

`keras.distribution.ModelParallel` over several processes trains, but Keras 3.15 cannot
save weights that span processes (reading them raises "Fetching value for `jax.Array`
that spans non-addressable devices"), so `model_parallel` is refused there.
"""

import atexit
import contextlib
import functools
import hashlib
import json
import os
import sys
import threading
import time

import keras
import numpy as np

from keras_transformer import internals
from keras_transformer.chief_sync import ChiefSync

# Keras' variables for keras.distribution.initialize(); any of them set asks for several processes.
ENVIRONMENT = (
    "KERAS_DISTRIBUTION_JOB_ADDRESSES",
    "KERAS_DISTRIBUTION_NUM_PROCESSES",
    "KERAS_DISTRIBUTION_PROCESS_ID",
)
HEARTBEAT_ENVIRONMENT = "KERAS_TRANSFORMER_JAX_HEARTBEAT_SECONDS"
# JAX's defaults are 100 s (heartbeat) and 300 s (shutdown). The runtime's heartbeats run
# on their own threads, so a long XLA compile or a slow step never misses one.
DEFAULT_HEARTBEAT_SECONDS = 30
# The exit status of a process that stops because another one failed.
STOPPED_BY_ANOTHER_STATUS = 1
# The distributed runtime's key-value store: the first failure's one line.
_FAILURE_KEY = "keras_transformer/failure"
_state = {"reported": False, "exiting": False, "watch": None}
# How long the watch waits on the store at a time: also how long it may delay the exit.
_WATCH_WAIT_MS = 500


def requested():
    """Whether Keras' process variables are set, i.e. this is one process of several."""
    return any(os.environ.get(name, "").strip() for name in ENVIRONMENT)


def heartbeat_seconds():
    """How long a dead or hung process goes unnoticed: `KERAS_TRANSFORMER_JAX_HEARTBEAT_SECONDS`, else 30."""
    raw = os.environ.get(HEARTBEAT_ENVIRONMENT, "").strip()
    if not raw:
        return DEFAULT_HEARTBEAT_SECONDS
    try:
        seconds = int(raw)
    except ValueError:
        seconds = 0
    if seconds <= 0:
        raise ValueError(
            f"{HEARTBEAT_ENVIRONMENT} must be a positive whole number of seconds. Received: {raw!r}"
        )
    return seconds


def initialize():
    """Joins this process to the others (`keras.distribution.initialize()`), once; returns the process count.

    Does nothing (and returns 1) when Keras' variables are not set and JAX is not
    initialized already. The distributed runtime's heartbeat and shutdown timeouts are
    `heartbeat_seconds()`. Must run before JAX starts its backend: before any array, any
    `jax.devices()`, any model; `distribute.select_strategy` calls it first thing.

    Raises:
        RuntimeError: JAX's backend already started, so this process cannot join.
    """
    import jax

    if jax.distributed.is_initialized():
        return jax.process_count()
    if not requested():
        return 1
    seconds = heartbeat_seconds()
    try:
        # The shutdown barrier at exit: processes that end together (kt-train waits for the
        # chief's final save first) meet there within moments; twice the heartbeat leaves room
        # for a slow interpreter exit on a loaded host.
        with _jax_initialize_options(heartbeat_timeout_seconds=seconds, shutdown_timeout_seconds=2 * seconds):
            keras.distribution.initialize()  # reads Keras' variables, seeds every process alike
    except RuntimeError as error:
        if "before any JAX calls" not in str(error):
            raise
        raise RuntimeError(
            f"{', '.join(name for name in ENVIRONMENT if os.environ.get(name))} ask for several JAX "
            "processes, but JAX already started on this one: call "
            "keras_transformer.distribute.select_strategy(...) (or keras.distribution.initialize()) "
            "first thing in the program, before any array, model or jax.devices()."
        ) from error
    _watch_for_failures()
    return jax.process_count()


def report_failure(error):
    """Tells the other processes that this one failed with `error`: each stops at once with one line.

    Called by `failure_reported` and by the `sys.excepthook` that `initialize` installs;
    the first report wins. This process then ends with status 1 at exit, without waiting
    for the others at JAX's shutdown barrier (they are gone). Without a report (a process
    killed, or one that hangs), the distributed runtime stops the others within
    `heartbeat_seconds()`.
    """
    if _state["reported"] or not is_multi_process():
        return
    client = internals.jax_distributed_client()
    if client is None:
        return
    import jax

    _state["reported"] = True
    text = str(error).strip().splitlines()
    detail = f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
    if isinstance(error, KeyboardInterrupt):
        detail = "interrupted"
    with contextlib.suppress(Exception):  # another process reported first
        client.key_value_set(_FAILURE_KEY, f"JAX process {jax.process_index()} of {jax.process_count()} failed ({detail})")


@contextlib.contextmanager
def failure_reported():
    """Reports an exception that leaves the block (`report_failure`), then lets it go on up."""
    try:
        yield
    except BaseException as error:
        report_failure(error)
        raise


def _watch_for_failures():
    """A thread that ends this process with one line as soon as another one reports a failure."""
    if not is_multi_process() or _state["watch"] is not None:
        return
    client = internals.jax_distributed_client()
    if client is None:
        return
    import jax

    here = f"JAX process {jax.process_index()} of {jax.process_count()}"

    main = threading.main_thread()

    def watch():
        # Ends with the main thread, before the exit handlers run: a thread still inside the
        # runtime's C++ call when Python finalizes aborts the process ("FATAL: exception not
        # rethrown"), so the interpreter waits for this one (not a daemon) at most one wait.
        while main.is_alive() and not _state["exiting"]:
            started = time.monotonic()
            try:
                message = client.blocking_key_value_get(_FAILURE_KEY, _WATCH_WAIT_MS)
            except Exception:  # nothing reported yet; a runtime error is the runtime's to report
                time.sleep(max(0.0, _WATCH_WAIT_MS / 1000 - (time.monotonic() - started)))
                continue
            if _state["reported"] or _state["exiting"]:
                return  # this process failed itself: its own error is what it shows
            print(f"{message}; {here} stops too", file=sys.stderr, flush=True)
            os._exit(STOPPED_BY_ANOTHER_STATUS)

    _state["watch"] = threading.Thread(target=watch, name="keras_transformer-failure-watch")
    _state["watch"].start()
    hook = sys.excepthook

    def report_and_show(kind, value, traceback):
        report_failure(value)
        hook(kind, value, traceback)

    sys.excepthook = report_and_show
    # Registered after JAX's own exit handler, so it runs first.
    atexit.register(_at_exit)


def _at_exit():
    _state["exiting"] = True
    if not _state["reported"]:
        return
    # The others stopped on the report: JAX's shutdown barrier would wait for them in vain.
    with contextlib.suppress(Exception):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(1)


def is_multi_process():
    """Whether JAX runs as several processes (never starts JAX's backend when it does not)."""
    import jax

    return jax.distributed.is_initialized() and jax.process_count() > 1


def is_chief():
    """True in process 0 (and in a lone process); never starts JAX's backend."""
    import jax

    if jax.distributed.is_initialized():
        return jax.process_index() == 0
    return int(os.environ.get("KERAS_DISTRIBUTION_PROCESS_ID", "0") or 0) == 0


def global_devices():
    """Every process's devices, as Keras names them, each process's side by side (its rows are contiguous)."""
    import jax

    devices = sorted(jax.devices(), key=lambda device: (device.process_index, device.id))
    return [f"{device.platform}:{device.id}" for device in devices]


def data_parallel(devices=None):
    """`keras.distribution.DataParallel` over `devices` (default: `global_devices()`), each process feeding its rows."""
    return keras.distribution.DataParallel(devices=devices or global_devices(), auto_shard_dataset=False)


def process_parts(distribution):
    """`(first, count, total)`: this process feeds parts `first ... first + count - 1` of `total` of each batch.

    The parts are the positions of the batch axis of `distribution`'s device mesh (its
    data-parallel replicas) held by this process's devices.

    Raises:
        ValueError: this process's devices are not side by side on the batch axis.
    """
    import jax

    mesh = distribution.device_mesh.backend_mesh
    axis = mesh.axis_names.index(distribution.batch_dim_name)
    positions = sorted({
        index[axis] for index, device in np.ndenumerate(mesh.devices) if device.process_index == jax.process_index()
    })
    total = mesh.devices.shape[axis]
    if not positions or positions != list(range(positions[0], positions[0] + len(positions))):
        raise ValueError(
            f"Process {jax.process_index()}'s devices must be side by side on the batch axis of the "
            f"device mesh to feed their rows as one block. Received: positions {positions} of {total}; "
            "use keras_transformer.jax_processes.data_parallel(), which orders the devices by process."
        )
    return positions[0], len(positions), total


def process_shard(distribution):
    """The `Shard` whose `IndexBatches.batches(replicas=count)` are this process's parts.

    `Shard(first // count, total // count)`: with one device per process, the process
    index and count.
    """
    from keras_transformer.data.index_batches import Shard

    first, count, total = process_parts(distribution)
    return Shard(first // count, total // count)


def process_dataset(make_batches, distribution, start=0):
    """This process's rows of every global batch, from global batch `start`: an endless `tf.data.Dataset`.

    Each element is the concatenation of this process's parts (`process_parts`), one per
    local device, each `ceil(n / total)` rows: the same shapes on every process.

    Args:
        make_batches: callable from a `Shard` to an `IndexBatches` with that shard (as for
            `data.index_batches.distributed_dataset`), or an `IndexBatches` made with
            `shard=process_shard(distribution)`.
        distribution: the run's `DataParallel` (`data_parallel()`).
        start: int, the global batch to start at.
    """
    import tensorflow as tf

    first, count, total = process_parts(distribution)
    shard = process_shard(distribution)
    batches = make_batches(shard) if callable(make_batches) else make_batches
    if batches.shard != shard:
        raise ValueError(
            f"The IndexBatches must be made with this process's shard {shard}. Received: {batches.shard}"
        )

    def generate():
        parts = batches.batches(start, replicas=count)
        while True:
            group = [next(parts) for _ in range(count)]
            inputs = {key: np.concatenate([part[0][key] for part in group]) for key in group[0][0]}
            yield inputs, np.concatenate([part[1] for part in group])

    spec = tf.TensorSpec([None, None], tf.int32)
    dataset = tf.data.Dataset.from_generator(
        generate, output_signature=({"encoder_inputs": spec, "decoder_inputs": spec}, spec)
    )
    dataset = dataset.apply(tf.data.experimental.assert_cardinality(tf.data.INFINITE_CARDINALITY))
    return dataset.prefetch(tf.data.AUTOTUNE)


def process_rows(dataset, distribution, pad_id=0):
    """This process's rows of each global batch of a `tf.data.Dataset` (every process reads all of it).

    For datasets every process makes whole (a validation split): each batch is padded
    with all-`pad_id` rows to a multiple of the data-parallel replicas, and this process
    keeps its block of them. The loss and the metrics ignore the padding rows.
    """
    import tensorflow as tf

    first, count, total = process_parts(distribution)

    @tf.autograph.experimental.do_not_convert  # plain TensorFlow ops
    def rows(*batch):
        batch = batch[0] if len(batch) == 1 else batch
        size = tf.shape(tf.nest.flatten(batch)[0])[0]
        per_part = (size + total - 1) // total

        def keep(tensor):
            padded = tf.pad(
                tensor,
                [[0, per_part * total - size]] + [[0, 0]] * (tensor.shape.rank - 1),
                constant_values=tf.cast(pad_id, tensor.dtype),
            )
            return padded[first * per_part:(first + count) * per_part]

        return tf.nest.map_structure(keep, batch)

    return dataset.map(rows, num_parallel_calls=tf.data.AUTOTUNE)


def check_same_run(values):
    """Refuses to start unless every process holds the same `values`; returns nothing.

    Each value (anything `json.dumps` takes, with `default=str`) is hashed; the hashes
    of all processes are gathered (`jax.experimental.multihost_utils.process_allgather`)
    and compared with process 0's. Every process calls it at the same point.

    Args:
        values: `{name: value}`, e.g. each run-config key, the corpus's content key and
            the tokenizer's fingerprint.

    Raises:
        ValueError: naming each value that differs, the processes that differ from
            process 0, and this process's own value.
    """
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return
    names = sorted(values)
    digests = np.array([_digest(values[name]) for name in names], np.int32).reshape(len(names), 2)
    gathered = np.asarray(multihost_utils.process_allgather(digests))  # [processes, names, 2]
    differing = []
    for index, name in enumerate(names):
        others = [p for p in range(len(gathered)) if not np.array_equal(gathered[p, index], gathered[0, index])]
        if others:
            differing.append(f"{name} (process {', '.join(map(str, others))} differs from process 0; "
                             f"here, process {jax.process_index()}: {_shown(values[name])})")
    if differing:
        raise ValueError(
            f"The {len(gathered)} JAX processes would train different runs: " + "; ".join(differing)
            + ". Start every process with the same command, run config, corpus and tokenizer."
        )


def chief_value(value):
    """Process 0's `value` (an int or float) in every process."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() == 1:
        return value
    kind = type(value)
    return kind(multihost_utils.broadcast_one_to_all(np.asarray(value, np.float64 if kind is float else np.int32)))


def wait_for_all(name):
    """Returns once every process has called `wait_for_all(name)` (the chief's final save, before all exit)."""
    import jax
    from jax.experimental import multihost_utils

    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


class ProcessSync(ChiefSync):
    """`ChiefSync` over JAX's processes (`jax.experimental.multihost_utils` broadcasts)."""

    def _is_multi_process(self):
        return is_multi_process()

    def _broadcast_variables(self, variables):
        from jax.experimental import multihost_utils

        values = multihost_utils.broadcast_one_to_all([np.asarray(variable.value) for variable in variables])
        for variable, value in zip(variables, values):
            variable.assign(value)

    def _broadcast_ints(self, values):
        from jax.experimental import multihost_utils

        # int32: JAX's default, without x64 enabled.
        return [int(value) for value in multihost_utils.broadcast_one_to_all(np.asarray(values, np.int32))]


@contextlib.contextmanager
def _jax_initialize_options(**options):
    """`jax.distributed.initialize` with `options` while Keras calls it (Keras passes only the addresses)."""
    import jax

    original = jax.distributed.initialize
    jax.distributed.initialize = functools.partial(original, **options)
    try:
        yield
    finally:
        jax.distributed.initialize = original


def _digest(value):
    """Two int32 of the sha256 of `value`'s JSON."""
    text = json.dumps(value, sort_keys=True, default=str).encode()
    return np.frombuffer(hashlib.sha256(text).digest()[:8], np.int32).tolist()


def _shown(value, limit=80):
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


__all__ = [
    "ENVIRONMENT",
    "HEARTBEAT_ENVIRONMENT",
    "ProcessSync",
    "check_same_run",
    "chief_value",
    "data_parallel",
    "failure_reported",
    "global_devices",
    "heartbeat_seconds",
    "initialize",
    "is_chief",
    "is_multi_process",
    "process_dataset",
    "process_parts",
    "process_rows",
    "process_shard",
    "report_failure",
    "requested",
    "wait_for_all",
]
