"""Training runs that need a fresh process, for test_distribute.py.

Device layouts are fixed when a backend starts (two logical CPUs for TensorFlow, two
host devices for JAX, a TF_CONFIG cluster), so these runs happen in child processes:
`python tests/distributed_child.py MODE` prints one JSON line with its results. The test
module imports `fit_losses` too, for single-device references in its own process.

Every run trains the same tiny Transformer from the same seed on one fixed batch of 4
sentence pairs. Without padding (`batch`) each replica of a 2-way split gets as many
real tokens; the uneven batch (`uneven_batch`) puts 2 real target tokens on one replica
and 10 on the other. The loss is the mean over all real tokens either way, so the
losses and weights must equal one device's. TensorFlow's runs train on the uneven batch
only (the even one is its easy case, and each run traces its own step: seconds of a
test session); JAX's train on both.
"""

import json
import os
import sys

import numpy as np

GLOBAL_BATCH = 4
STEPS = 3
LEARNING_RATE = 1e-2
CONFIG_VALUES = dict(
    vocab_size=32,
    d_model=16,
    d_ff=32,
    num_heads=2,
    num_encoder_layers=1,
    num_decoder_layers=1,
    dropout=0.0,
    max_length=32,
)


def config():
    import keras_transformer as kt

    return kt.TransformerConfig.from_preset("tiny", **CONFIG_VALUES)


def batch(size=GLOBAL_BATCH, seed=0):
    """`(inputs, labels)` of `size` pairs, source length 6, target length 5, no padding."""
    rng = np.random.default_rng(seed)
    inputs = {
        "encoder_inputs": rng.integers(1, 32, (size, 6)).astype("int32"),
        "decoder_inputs": rng.integers(1, 32, (size, 5)).astype("int32"),
    }
    return inputs, rng.integers(1, 32, (size, 5)).astype("int32")


def uneven_batch():
    """The batch of 4 with rows 0-1 (the first replica's half) padded to 1 real target token each.

    Over 2 replicas, one holds 2 real target tokens and the other 10. The padding is
    where the pipeline puts it: after the source's tokens, and after the first decoder
    input (BOS) and the first label.
    """
    inputs, labels = batch()
    inputs["encoder_inputs"][:2, 3:] = 0
    inputs["decoder_inputs"][:2, 1:] = 0
    labels[:2, 1:] = 0
    return inputs, labels


def uneven_rows_dataset():
    """The uneven batch, then its last 3 rows again and again.

    Over 2 replicas the 3 rows split 2 + 1, holding 6 and 5 real target tokens: unequal
    rows and tokens. The first batch divides evenly: Keras 3.15 builds the model from
    the replicas' first batches averaged, which fails for parts of unequal shapes.
    """
    import tensorflow as tf

    inputs, labels = uneven_batch()
    last_three = ({key: value[1:] for key, value in inputs.items()}, labels[1:])
    first = tf.data.Dataset.from_tensors((inputs, labels))
    return first.concatenate(tf.data.Dataset.from_tensors(last_three).repeat())


def dataset(size=GLOBAL_BATCH, pairs=None):
    """The same batch (`pairs`, or `batch(size)`), again and again."""
    import tensorflow as tf

    return tf.data.Dataset.from_tensors(batch(size) if pairs is None else pairs).repeat()


def initial_losses(pairs, replicas=2):
    """The first step's loss of the seed-7 model: the global mean, and the replicas' mean.

    The first is what one device trains on; the second is what averaging each replica's
    own mean (Keras' scaling of its built-in losses) would give for an even split of
    `pairs`, to show that the uneven batch tells the two apart.
    """
    import keras

    from keras_transformer import build_transformer
    from keras_transformer.train.losses import LabelSmoothedCrossEntropy

    keras.utils.set_random_seed(7)
    model = build_transformer(config())
    loss = LabelSmoothedCrossEntropy()
    inputs, labels = pairs
    size = len(labels) // replicas
    parts = [slice(index * size, (index + 1) * size) for index in range(replicas)]
    per_replica = [
        float(loss(labels[part], model({key: value[part] for key, value in inputs.items()})))
        for part in parts
    ]
    return float(loss(labels, model(inputs))), float(np.mean(per_replica))


def max_weight_difference(model, other):
    """Largest absolute difference between two models' weights, matched by path."""
    import keras

    values = {weight.path: keras.ops.convert_to_numpy(weight.value) for weight in other.weights}
    return max(
        float(np.abs(keras.ops.convert_to_numpy(weight.value) - values[weight.path]).max())
        for weight in model.weights
    )


def fit_losses(strategy="default", data=None, callbacks=(), **scope_args):
    """Per-step training losses of the tiny model under `distribution_scope(strategy)`."""
    import keras

    from keras_transformer import build_transformer
    from keras_transformer.distribute import distribution_scope
    from keras_transformer.train.losses import LabelSmoothedCrossEntropy

    keras.utils.set_random_seed(7)
    with distribution_scope(strategy, config=config(), **scope_args) as engine:
        model = build_transformer(config())
        model.compile(
            optimizer=keras.optimizers.Adam(LEARNING_RATE), loss=LabelSmoothedCrossEntropy()
        )
        # One step per epoch: the history holds each step's loss.
        history = model.fit(
            dataset() if data is None else data,
            epochs=STEPS,
            steps_per_epoch=1,
            callbacks=list(callbacks),
            verbose=0,
        )
    return [float(loss) for loss in history.history["loss"]], engine, model


def run_mirrored():
    """Two logical CPUs: MirroredStrategy against one device, and how a batch is split."""
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    from keras_transformer import distribute

    # 2 real target tokens on one replica and 10 on the other, then rows split 2 + 1.
    single, _, single_model = fit_losses("default", data=uneven_rows_dataset())
    mirrored, engine, model = fit_losses(
        "mirrored", data=uneven_rows_dataset(), devices=["/cpu:0", "/cpu:1"]
    )

    # Batches of 4 and 3 rows with an unknown static batch size, as the token-budget
    # pipeline makes them: tf.distribute splits each global batch over the replicas.
    rows = tf.data.Dataset.range(7).map(lambda i: tf.fill([3], tf.cast(i, tf.int32)))
    varying = rows.padded_batch(4)
    split = [
        [int(part.shape[0]) for part in engine.experimental_local_results(batch)]
        for batch in engine.experimental_distribute_dataset(varying)
    ]
    return {
        "single": single,
        "mirrored": mirrored,
        "replicas": distribute.num_replicas(engine),
        "describe": distribute.describe(engine),
        "variable_type": type(model.weights[0].value).__name__,
        "split": split,
        "weight_difference": max_weight_difference(model, single_model),
        "initial": initial_losses(uneven_batch()),
    }


def run_multi_worker():
    """One worker of a TF_CONFIG cluster: "auto" must pick MultiWorkerMirroredStrategy."""
    import keras

    from keras_transformer import distribute

    # First thing, before TensorFlow runs an op: the strategy connects to the cluster.
    early = distribute.select_strategy("auto")
    task_index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    work_dir = os.environ["WORK_DIR"]
    chief = distribute.is_chief()
    # Every worker checkpoints, each to its own directory (TensorFlow's multi-worker
    # recipe); the chief's directory is the one a run keeps.
    own_dir = os.path.join(work_dir, "chief" if chief else f"worker_{task_index}")
    callbacks = [
        keras.callbacks.BackupAndRestore(os.path.join(own_dir, "backup")),
        keras.callbacks.ModelCheckpoint(
            os.path.join(own_dir, "model.weights.h5"), save_weights_only=True
        ),
    ]
    losses, engine, _ = fit_losses("auto", data=dataset(pairs=uneven_batch()), callbacks=callbacks)
    return {
        "losses": losses,
        "engine": type(engine).__name__,
        "replicas": distribute.num_replicas(engine),
        "is_chief": chief,
        "same_engine": engine is early,
        "checkpoint": os.path.exists(os.path.join(own_dir, "model.weights.h5")),
    }


def run_multi_worker_corpus():
    """One worker of a TF_CONFIG cluster, training on its rows of a binarized corpus's batches.

    `CORPUS_DIR` holds the corpus (written by the test); each worker gathers only the rows
    `worker_shard()` gives it, and the strategy all-reduces the step over both workers.
    """
    from keras_transformer import distribute

    early = distribute.select_strategy("auto")  # before TensorFlow runs an op
    from keras_transformer.data.binarized import open_binarized
    from keras_transformer.data.index_batches import IndexBatches, distributed_dataset

    corpus = open_binarized(os.environ["CORPUS_DIR"])
    shards = []

    def make_batches(shard):
        shards.append(shard)
        return IndexBatches(corpus, max_length=8, tokens_per_batch=32, shard=shard)

    data = distributed_dataset(early, make_batches)
    losses, engine, _ = fit_losses("auto", data=data)
    shard = shards[0]  # one input pipeline in this worker
    rows = [make_batches(shard).batch(step)[0]["encoder_inputs"].tolist() for step in range(STEPS)]
    return {
        "losses": losses,
        "rows": rows,
        "shard": [shard.index, shard.count],
        "replicas": distribute.num_replicas(engine),
        "same_engine": engine is early,
    }


def run_jax():
    """Two host devices: DataParallel and ModelParallel (the test compares one device)."""
    import keras

    from keras_transformer import distribute

    data_parallel, engine, _ = fit_losses("data_parallel")
    after_scope = keras.distribution.distribution()
    uneven, _, _ = fit_losses("data_parallel", data=dataset(pairs=uneven_batch()))
    model_parallel, mp_engine, mp_model = fit_losses("model_parallel", model_parallel_size=2)
    shown = (
        "encoder_layer_0/self_attention/query/kernel",
        "encoder_layer_0/feed_forward/output_dense/kernel",
        "encoder_layer_0/self_attention_norm/gamma",
    )
    sharding = {
        weight.path: str(weight.value.sharding.spec)
        for weight in mp_model.weights
        if weight.path in shown
    }
    # A batch of 3 cannot be split over 2 devices; padded with a row of padding, it
    # must train as the 3 real pairs do on one device.
    padded, _, _ = fit_losses(
        "data_parallel", data=distribute.pad_batches_for_replicas(dataset(3), 2)
    )
    return {
        "data_parallel": data_parallel,
        "data_parallel_uneven": uneven,
        "model_parallel": model_parallel,
        "replicas": distribute.num_replicas(engine),
        "model_parallel_replicas": distribute.num_replicas(mp_engine),
        "describe": distribute.describe(mp_engine),
        "after_scope": repr(after_scope),
        "sharding": sharding,
        "padded_odd": padded,
    }


if __name__ == "__main__":
    mode = sys.argv[1]
    modes = {"mirrored": run_mirrored, "multi_worker": run_multi_worker, "jax": run_jax,
             "multi_worker_corpus": run_multi_worker_corpus}
    result = modes[mode]()
    print(json.dumps(result), flush=True)
