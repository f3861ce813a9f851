"""The distributed engine for a run: `tf.distribute` on TensorFlow, `keras.distribution` on JAX, torchrun's processes on PyTorch.

`distribution_scope(name)` picks an engine that already exists and enters its scope;
build, compile and fit the model inside it. Nothing here distributes by hand. Names:

- "auto": TensorFlow: a TPU if one resolves, else `MultiWorkerMirroredStrategy` if
  `TF_CONFIG` lists several workers, else `MirroredStrategy` if there are several GPUs,
  else the default strategy. JAX: `DataParallel` over several devices, else none.
  PyTorch: data parallel when torchrun started several processes (`WORLD_SIZE` > 1),
  else one device.
- "default": one device on every backend.
- "data_parallel": TensorFlow: multi-worker if `TF_CONFIG` lists several workers, else
  mirrored. JAX: `keras.distribution.DataParallel`. PyTorch: one replica per process of a
  torchrun job (`torch_processes`).
- "mirrored", "multi_worker", "tpu": TensorFlow's `MirroredStrategy` (all GPUs, or
  `devices`), `MultiWorkerMirroredStrategy` (from `TF_CONFIG`), `TPUStrategy`
  (`TPUClusterResolver`).
- "model_parallel": JAX's `keras.distribution.ModelParallel`, the large matrices sharded
  by `transformer_layout_map`.

On JAX, Keras' process variables (`KERAS_DISTRIBUTION_NUM_PROCESSES`, ...) make this one
process of several: `select_strategy` joins them first (`jax_processes.initialize`), and
"auto" and "data_parallel" give one `DataParallel` over all their devices, each process
feeding its own rows of every batch (`jax_processes.process_dataset`).

On PyTorch, which has no multi-device `fit` in Keras 3, torchrun's processes are the
replicas: `select_strategy` joins them first (`torch_processes.initialize`), each process
feeds its rows of every batch (`torch_processes.process_dataset`), and
`train.torch_data_parallel` averages each step's gradients across them.

A name the backend cannot run raises `ValueError` saying which can.

The batch is global: `model.fit` under `tf.distribute` splits each batch of the dataset
across the replicas (`experimental_distribute_dataset`, checked for batches of varying
size like the token-budget batches of `data.make_dataset`), and JAX shards each batch
over the devices. So the pipeline's `tokens_per_batch` is the global budget and is not
divided by hand. JAX needs every batch divisible by the number of replicas:
`pad_batches_for_replicas` pads a batch with all-padding rows, which the loss ignores.

The loss of a step is the mean over all its real tokens, on every engine. JAX runs one
program over the global batch, so that is what the loss computes. Under `tf.distribute`
each replica sees only its part: `LabelSmoothedCrossEntropy` returns
`replica_share_of_global_mean`, whose gradient is that of its own sum over the
real-token count all-reduced across the replicas; Keras sums the replicas' gradients.
"""

import contextlib
import functools
import json
import math
import os
import warnings

import keras

from keras_transformer import checks
from keras_transformer.special_tokens import PAD_ID

STRATEGY_NAMES = (
    "auto",
    "default",
    "data_parallel",
    "mirrored",
    "multi_worker",
    "tpu",
    "model_parallel",
)
_SUPPORTED = {
    "tensorflow": ("auto", "default", "data_parallel", "mirrored", "multi_worker", "tpu"),
    "jax": ("auto", "default", "data_parallel", "model_parallel"),
    "torch": ("auto", "default", "data_parallel"),
}
# Environment variables that say a TPU is there to resolve (Cloud TPU VM, TPU node, Colab).
_TPU_ENVIRONMENT = (
    "TPU_NAME",
    "TPU_ACCELERATOR_TYPE",
    "COLAB_TPU_ADDR",
    "KUBE_GOOGLE_CLOUD_TPU_ENDPOINTS",
)
_MODEL_AXIS = "model"
_BATCH_AXIS = "batch"


@contextlib.contextmanager
def distribution_scope(
    strategy=None, *, config=None, devices=None, model_parallel_size=None, tpu=None
):
    """Enters the scope of the engine chosen by `strategy` and yields that engine.

    Build, compile and fit the model inside the scope: `tf.distribute` places the
    variables when they are created, and `keras.distribution` (set globally by the
    scope, and restored on exit) lays out variables and batches. The engine is chosen
    by `select_strategy`; an engine already made (`tf.distribute.Strategy` or
    `keras.distribution.DataParallel` / `ModelParallel`) is used as it is. On one
    device the scope does nothing and yields the default strategy (TensorFlow) or None
    (JAX, PyTorch). `MultiWorkerMirroredStrategy` and `TPUStrategy` must be created
    before TensorFlow runs any op: call `select_strategy` first thing in the program
    (the scope then reuses that strategy) or enter the scope before building datasets.

    Args:
        strategy: str name (see `STRATEGY_NAMES` and the module docstring), an engine,
            or None for "auto".
        config: `TransformerConfig`; needed by "model_parallel" (for its layout map).
        devices: optional list of device names ("/gpu:0" on TensorFlow, "gpu:0" on JAX)
            for "mirrored" / "data_parallel" / "model_parallel"; defaults to all.
        model_parallel_size: int, devices along the model axis for "model_parallel";
            defaults to all devices (no data parallelism).
        tpu: TPU name or address for "tpu"; defaults to the environment's TPU.

    Example:

    ```python
    with distribution_scope("auto", config=config) as engine:
        model = build_transformer(config)
        model.compile(optimizer=..., loss=LabelSmoothedCrossEntropy())
        model.fit(dataset)  # the global batch, split over num_replicas(engine)
    ```
    """
    engine = select_strategy(
        strategy, config=config, devices=devices, model_parallel_size=model_parallel_size, tpu=tpu
    )
    with engine.scope() if engine is not None else contextlib.nullcontext():
        yield engine


def select_strategy(
    name=None, *, config=None, devices=None, model_parallel_size=None, tpu=None
):
    """The engine for `name` on the current Keras backend (see `distribution_scope`).

    Returns a `tf.distribute.Strategy` on TensorFlow; a `keras.distribution.DataParallel`,
    `ModelParallel` or None (one device) on JAX; a `torch_processes.TorchDataParallel` or
    None (one process) on PyTorch. Raises `ValueError`
    for an unknown name or one the backend cannot run, naming what it can. The
    TensorFlow cluster strategies ("multi_worker", "tpu") are made once per process and
    returned again by later calls.

    Example:

    ```python
    engine = select_strategy("mirrored", devices=["/gpu:0", "/gpu:1"])
    num_replicas(engine)  # 2
    ```
    """
    if name is None:
        name = "auto"
    if not isinstance(name, str):
        if _is_engine(name):
            return name
        raise ValueError(
            "`strategy` must be a name, a tf.distribute.Strategy or a "
            f"keras.distribution.DataParallel / ModelParallel. Received: strategy={name!r}"
        )
    if name not in STRATEGY_NAMES:
        raise ValueError(f"Unknown strategy {name!r}. Expected one of {STRATEGY_NAMES}.")
    backend = keras.backend.backend()
    supported = _SUPPORTED.get(backend, ("auto", "default"))
    if name not in supported:
        raise ValueError(_unsupported_message(name, backend, supported))
    if backend == "tensorflow":
        return _tensorflow_strategy(name, devices, tpu)
    if backend == "jax":
        return _jax_distribution(name, config, devices, model_parallel_size)
    if backend == "torch":
        return _torch_engine(name)
    return _single_device(backend)


def num_replicas(engine):
    """How many ways each batch is split: data-parallel replicas of `engine` (None: 1)."""
    if engine is None:
        return 1
    if hasattr(engine, "num_replicas_in_sync"):  # tf.distribute.Strategy
        return int(engine.num_replicas_in_sync)
    if _is_keras_distribution(engine):
        return int(engine.num_model_replicas)
    if _is_torch_engine(engine):
        return engine.world_size
    raise ValueError(f"Expected an engine from select_strategy. Received: {engine!r}")


def describe(engine):
    """One line saying what `engine` runs on, for logs: "MirroredStrategy, 2 replicas: ..."."""
    if engine is None:
        return f"one device ({keras.backend.backend()} backend)"
    if _is_torch_engine(engine):
        return engine.describe()
    if hasattr(engine, "num_replicas_in_sync"):
        try:
            devices = ", ".join(engine.extended.worker_devices)
        except RuntimeError:  # the default strategy lists no devices
            return "default strategy (one device, tensorflow backend)"
        return f"{type(engine).__name__}, {engine.num_replicas_in_sync} replicas: {devices}"
    mesh = engine.device_mesh
    axes = ", ".join(f"{name}={size}" for name, size in zip(mesh.axis_names, mesh.shape))
    devices = ", ".join(str(device) for device in mesh.devices.flatten())
    processes = f" ({engine.num_processes} processes)" if engine.num_processes > 1 else ""
    return f"{type(engine).__name__}, mesh ({axes}): {devices}{processes}"


def is_chief():
    """True in the one process that writes logs, checkpoints to keep, and exports.

    On PyTorch under torchrun, rank 0 (`RANK`). Else from `TF_CONFIG` when it is set
    (the "chief" task, or worker 0 of a cluster with no chief); else, on JAX, process 0
    (`jax.process_index()`, or before JAX joins the other processes,
    `KERAS_DISTRIBUTION_PROCESS_ID`); else True (one process).
    """
    if keras.backend.backend() == "torch":
        from keras_transformer import torch_processes

        if torch_processes.launched():
            return torch_processes.is_chief()
    tf_config = _tf_config()
    if tf_config:
        task = tf_config.get("task") or {}
        cluster = tf_config.get("cluster") or {}
        task_type, index = task.get("type"), int(task.get("index", 0))
        if task_type is None or task_type in ("chief", "master"):
            return True
        has_chief = "chief" in cluster or "master" in cluster
        return task_type == "worker" and index == 0 and not has_chief
    if keras.backend.backend() == "jax":
        from keras_transformer import jax_processes

        return jax_processes.is_chief()  # never starts JAX's backend before initialize()
    return True


def global_to_replica_batch(global_batch, replicas):
    """The largest share of a global batch (examples or tokens) one replica receives.

    `tf.distribute` splits a batch of `global_batch` rows into `replicas` parts of
    `ceil(global_batch / replicas)` or one fewer; JAX needs it to divide evenly. For
    planning memory and logs: the dataset itself keeps the global budget.

    Example:

    ```python
    global_to_replica_batch(25000, 4)  # 6250 tokens per replica
    ```
    """
    checks.check_positive_int("global_batch", global_batch)
    checks.check_positive_int("replicas", replicas)
    if global_batch < replicas:
        raise ValueError(
            f"A global batch of {global_batch} cannot feed {replicas} replicas: some would "
            "get nothing. Raise the batch (tokens_per_batch) or use fewer replicas."
        )
    return math.ceil(global_batch / replicas)


def pad_batches_for_replicas(dataset, replicas, pad_id=PAD_ID):
    """Pads each batch of `dataset` with all-`pad_id` rows up to a multiple of `replicas`.

    JAX shards a batch evenly over the devices and refuses a batch size that does not
    divide (the token-budget batches vary in size, and an epoch's last batch is short).
    The added rows are padding everywhere, labels included, so the loss and the metrics
    (which ignore padding labels) are unchanged. With `replicas == 1` the dataset is
    returned as is.

    Args:
        dataset: `tf.data.Dataset` of batches (any nest of tensors with a batch axis).
        replicas: int, e.g. `num_replicas(engine)`.
        pad_id: the value of the added rows. Defaults to `PAD_ID` (0).
    """
    import tensorflow as tf

    checks.check_positive_int("replicas", replicas)
    if replicas == 1:
        return dataset

    @tf.autograph.experimental.do_not_convert  # plain TensorFlow ops: nothing for AutoGraph to rewrite
    def pad(*batch):
        batch = batch[0] if len(batch) == 1 else batch
        size = tf.shape(tf.nest.flatten(batch)[0])[0]
        extra = (-size) % replicas

        def pad_one(tensor):
            paddings = [[0, extra]] + [[0, 0]] * (tensor.shape.rank - 1)
            return tf.pad(tensor, paddings, constant_values=tf.cast(pad_id, tensor.dtype))

        return tf.nest.map_structure(pad_one, batch)

    return dataset.map(pad, num_parallel_calls=tf.data.AUTOTUNE)


def replica_share_of_global_mean(local_mean, local_count):
    """This replica's share of the mean over every real token of the step.

    A loss that averages over the `local_count` real tokens of its replica's part of the
    batch returns this instead. Its gradient is that of `local_sum / global_count`
    (`local_sum = local_mean * local_count`; `global_count` is `local_count` summed
    over the replicas): the shares add up to the mean over all the step's tokens, and
    Keras' TensorFlow trainer sums the replicas' gradients, so the update is the one
    device would make on the whole batch, however unevenly the real tokens (and rows)
    fall on the replicas. Dividing each replica's own mean by the number of replicas,
    as Keras does for its built-in losses, would weigh a replica with few real tokens
    as much as one with many.

    Its value is the step's global mean divided by the number of replicas, on every
    replica: Keras multiplies a replica's loss by that number before logging it and
    weighs the replicas by their rows, so the logged loss is the global mean too, even
    when a batch splits into unequal rows (3 rows as 2 + 1). The sum and the count
    travel in one all-reduce of two numbers per step.

    `local_mean` itself (the same tensor, so one device is unchanged to the bit) is
    returned on one replica, outside a replica context (`strategy.run`), and on JAX and
    PyTorch, whose step is one program over the global batch.

    Args:
        local_mean: float scalar tensor, the mean over this replica's real tokens (0
            when it has none).
        local_count: scalar tensor, how many real tokens that mean is over.

    Example:

    ```python
    loss = total / ops.maximum(num_real, 1.0)
    return replica_share_of_global_mean(loss, num_real)
    ```
    """
    if keras.backend.backend() != "tensorflow":
        return local_mean
    import tensorflow as tf

    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        # None: cross-replica context (a whole batch handed to the loss directly).
        return local_mean
    local_count = tf.stop_gradient(tf.cast(local_count, local_mean.dtype))
    local_sum = local_mean * local_count  # 0 when the replica has no real token
    totals = context.all_reduce(
        tf.distribute.ReduceOp.SUM, tf.stop_gradient(tf.stack([local_sum, local_count]))
    )
    global_count = tf.maximum(totals[1], 1.0)
    share = local_sum / global_count
    logged = totals[0] / global_count / context.num_replicas_in_sync
    # The value of `logged`, the gradient of `share`.
    return share + tf.stop_gradient(logged - share)


def transformer_layout_map(config, device_mesh, model_axis=_MODEL_AXIS):
    """`keras.distribution.LayoutMap` that shards the Transformer's large matrices.

    Megatron-style: the query/key/value projections and the first FFN matrix are split
    by output columns (whole heads per device), the attention output projection and
    the second FFN matrix by input rows, so each block needs one reduction. Embedding
    matrices are split along `d_model`, not the vocabulary, so any vocabulary size
    divides. Layer norms and the remaining biases are replicated.

    Args:
        config: `TransformerConfig` of the model.
        device_mesh: `keras.distribution.DeviceMesh` with an axis named `model_axis`.
        model_axis: str, the mesh axis to shard over. Defaults to "model".
    """
    if model_axis not in device_mesh.axis_names:
        raise ValueError(
            f"The device mesh has no axis {model_axis!r}. "
            f"Received: axis_names={device_mesh.axis_names}"
        )
    size = device_mesh.shape[list(device_mesh.axis_names).index(model_axis)]
    for name in ("d_model", "d_ff", "num_heads"):
        if getattr(config, name) % size:
            raise ValueError(
                f"`{name}` must be divisible by the model-parallel size {size} to shard "
                f"the matrices evenly. Received: {name}={getattr(config, name)}"
            )
    columns, rows = (None, model_axis), (model_axis, None)
    layout_map = keras.distribution.LayoutMap(device_mesh)
    layout_map[r".*token_embedding/embeddings"] = columns
    layout_map[r"output_projection/kernel"] = rows
    layout_map[r".*_attention/(query|key|value)/kernel"] = columns
    layout_map[r".*_attention/(query|key|value)/bias"] = (model_axis,)
    layout_map[r".*_attention/attention_output/kernel"] = rows
    # A gated FFN's gate is split like the projection it multiplies, unit for unit.
    layout_map[r".*feed_forward/(intermediate|gate)_dense/kernel"] = columns
    layout_map[r".*feed_forward/(intermediate|gate)_dense/bias"] = (model_axis,)
    layout_map[r".*feed_forward/output_dense/kernel"] = rows
    return layout_map


# ------------------------------------------------------------------ internals
def _is_keras_distribution(value):
    # keras.distribution exports its subclasses, not their base class.
    return isinstance(value, (keras.distribution.DataParallel, keras.distribution.ModelParallel))


def _is_torch_engine(value):
    if keras.backend.backend() != "torch":
        return False
    from keras_transformer import torch_processes

    return isinstance(value, torch_processes.TorchDataParallel)


def _is_engine(value):
    if _is_keras_distribution(value) or _is_torch_engine(value):
        return True
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return isinstance(value, tf.distribute.Strategy)
    return False


def _unsupported_message(name, backend, supported):
    if backend == "torch":
        return (
            f"Strategy {name!r} is not available on the PyTorch backend, which scales out as "
            "processes started by torchrun, one replica each: use 'data_parallel' (or 'auto') "
            "under torchrun, KERAS_BACKEND=jax for model_parallel, or KERAS_BACKEND=tensorflow "
            f"for mirrored, multi_worker and tpu. Expected one of {supported}."
        )
    hint = {
        ("jax", "mirrored"): "use 'data_parallel' (keras.distribution.DataParallel)",
        ("jax", "tpu"): "'auto' and 'data_parallel' use the TPU devices JAX sees",
        ("jax", "multi_worker"): (
            "call keras.distribution.initialize() in every process, then use 'data_parallel'"
        ),
        ("tensorflow", "model_parallel"): "ModelParallel needs KERAS_BACKEND=jax",
    }.get((backend, name), "")
    return (
        f"Strategy {name!r} is not available on the {backend} backend"
        + (f": {hint}" if hint else "")
        + f". Expected one of {supported}."
    )


def _single_device(backend):
    if backend == "torch":
        import torch

        if torch.cuda.is_available() and torch.cuda.device_count() > 1:
            warnings.warn(
                f"{torch.cuda.device_count()} GPUs are visible but this process trains on one; "
                "start one process per GPU with torchrun --nproc_per_node to use them all "
                "(strategy 'auto' or 'data_parallel').",
                stacklevel=3,
            )
    return None


_NOT_UNDER_TORCHRUN = (
    "strategy='data_parallel' on PyTorch trains one replica per process started by torchrun, "
    "and this process was not (WORLD_SIZE is not set): run torchrun --nproc_per_node=N kt-train ... "
    "(or torchrun ... your_script.py), or use strategy='auto' for one device."
)
_ONE_DEVICE_OF_SEVERAL_TORCH_PROCESSES = (
    "strategy='default' trains on one device, but torchrun started this process as one of "
    "{processes} (WORLD_SIZE): use 'auto' or 'data_parallel' to train over all of them."
)


def _torch_engine(name):
    from keras_transformer import torch_processes

    # First, before any variable exists: the process group, and each process's GPU.
    processes = torch_processes.initialize()
    if processes > 1:
        if name == "default":
            raise ValueError(_ONE_DEVICE_OF_SEVERAL_TORCH_PROCESSES.format(processes=processes))
        return torch_processes.TorchDataParallel()
    if name == "data_parallel" and not os.environ.get("WORLD_SIZE", "").strip():
        raise ValueError(_NOT_UNDER_TORCHRUN)
    return _single_device("torch")  # torchrun with one process: a world of one


def _tf_config():
    raw = os.environ.get("TF_CONFIG", "")
    if not raw.strip():
        return {}
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as error:
        raise ValueError(f"TF_CONFIG is not valid JSON ({error}). Received: {raw!r}") from None
    if not isinstance(value, dict):
        raise ValueError(f"TF_CONFIG must be a JSON object. Received: {raw!r}")
    return value


def _num_tf_config_workers():
    cluster = _tf_config().get("cluster") or {}
    return sum(len(cluster.get(kind, ())) for kind in ("chief", "master", "worker"))


def _tensorflow_strategy(name, devices, tpu):
    import tensorflow as tf

    if name == "default":
        return tf.distribute.get_strategy()
    if name == "tpu":
        return _tpu_strategy(tpu)
    if name == "multi_worker":
        if not _tf_config():
            raise ValueError(
                "strategy='multi_worker' reads the cluster from the TF_CONFIG environment "
                "variable, which is not set. See docs/scaling_out.md for an example."
            )
        return _multi_worker_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices)
    if name == "auto" and tpu is not None:
        return _tpu_strategy(tpu)
    if name == "auto" and any(os.environ.get(key) for key in _TPU_ENVIRONMENT):
        try:
            return _tpu_strategy(None)
        except ValueError:  # the environment names no TPU that this process can reach
            pass
    # "auto" without a TPU, and "data_parallel".
    if _num_tf_config_workers() > 1:
        return _multi_worker_strategy()
    if name == "data_parallel" or devices:
        return tf.distribute.MirroredStrategy(devices)
    if len(tf.config.list_logical_devices("GPU")) > 1:
        return tf.distribute.MirroredStrategy()
    return tf.distribute.get_strategy()


# One per process: both connect this process to a cluster when created, which
# TensorFlow allows once. Later calls (a second scope, "auto" again) get the same one.
@functools.lru_cache(maxsize=None)
def _tpu_strategy(tpu):
    import tensorflow as tf

    if tpu is None and os.environ.get("TPU_ACCELERATOR_TYPE") and not os.environ.get("TPU_NAME"):
        tpu = "local"  # a Cloud TPU VM: the TPU is attached to this host
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu)
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


@functools.lru_cache(maxsize=None)
def _multi_worker_strategy():
    try:
        return _keras_multi_worker_strategy_class()()
    except RuntimeError as error:
        if "program startup" not in str(error):
            raise
        raise RuntimeError(
            "MultiWorkerMirroredStrategy must be created before TensorFlow runs any op "
            "(building a dataset or a tokenizer runs ops): call "
            "keras_transformer.distribute.select_strategy(...) first thing in the program; "
            "distribution_scope then reuses that strategy."
        ) from error


@functools.lru_cache(maxsize=None)
def _keras_multi_worker_strategy_class():
    import tensorflow as tf

    class KerasMultiWorkerMirroredStrategy(tf.distribute.MultiWorkerMirroredStrategy):
        """`MultiWorkerMirroredStrategy` whose `reduce` takes what Keras 3's `fit` passes.

        Keras 3.15's TensorFlow trainer calls `strategy.reduce` on a nest (the first
        batch, to build the model: keras-team/keras#20329) and with `axis=0` on the
        scalar logs ("auto" reduction); the collective strategy handles neither and
        `fit` fails on the first step. This reduces each leaf of a nest, and scalars
        across replicas without an axis, which is what Keras asks for; everything
        else is TensorFlow's own collective reduction.
        """

        def reduce(self, reduce_op, value, axis):
            parent = super()

            def reduce_leaf(leaf):
                local = (
                    self.experimental_local_results(leaf)[0]
                    if isinstance(leaf, tf.distribute.DistributedValues)
                    else leaf
                )
                leaf_axis = None if axis is not None and local.shape.rank == 0 else axis
                return parent.reduce(reduce_op, leaf, leaf_axis)

            return tf.nest.map_structure(reduce_leaf, value)

    return KerasMultiWorkerMirroredStrategy


_ONE_DEVICE_OF_SEVERAL_PROCESSES = (
    "strategy={name!r} trains on one device, but this is one of {processes} JAX processes "
    "(KERAS_DISTRIBUTION_* variables): use 'auto' or 'data_parallel' to train over all their devices."
)
_MODEL_PARALLEL_OF_SEVERAL_PROCESSES = (
    "strategy='model_parallel' over {processes} JAX processes is not supported: it trains, but "
    "Keras 3.15 cannot save weights that span processes (\"Fetching value for `jax.Array` that "
    "spans non-addressable devices is not possible\"), so no checkpoint or model could be "
    "written. Use 'data_parallel' (each process holds the whole model), or model_parallel in "
    "a single process over one host's devices."
)


def _jax_distribution(name, config, devices, model_parallel_size):
    from keras_transformer import jax_processes

    # First, before JAX starts its backend: Keras' process variables join this process to the others.
    processes = jax_processes.initialize()
    distribution = keras.distribution
    if name == "default":
        if processes > 1:
            raise ValueError(_ONE_DEVICE_OF_SEVERAL_PROCESSES.format(name=name, processes=processes))
        return None
    if processes > 1:
        if name == "model_parallel":
            raise ValueError(_MODEL_PARALLEL_OF_SEVERAL_PROCESSES.format(processes=processes))
        # Every process's devices, each process's side by side; each process feeds its rows.
        return jax_processes.data_parallel(list(devices) if devices else None)
    devices = list(devices) if devices else distribution.list_devices()
    if name == "auto":
        return distribution.DataParallel(devices=devices) if len(devices) > 1 else None
    if name == "data_parallel":
        return distribution.DataParallel(devices=devices)
    # "model_parallel"
    if config is None:
        raise ValueError(
            "strategy='model_parallel' needs the model's `config` to lay out its matrices. "
            "Received: config=None"
        )
    size = len(devices) if model_parallel_size is None else model_parallel_size
    if not checks.is_int(size) or size <= 0 or len(devices) % size:
        raise ValueError(
            f"`model_parallel_size` must be a positive divisor of the {len(devices)} devices. "
            f"Received: model_parallel_size={model_parallel_size!r}"
        )
    mesh = distribution.DeviceMesh(
        shape=(len(devices) // size, size), axis_names=(_BATCH_AXIS, _MODEL_AXIS), devices=devices
    )
    return distribution.ModelParallel(
        layout_map=transformer_layout_map(config, mesh), batch_dim_name=_BATCH_AXIS
    )
