"""One of several JAX processes, for test_jax_processes.py.

`python tests/jax_process_child.py MODE` runs with Keras' process variables
(`KERAS_DISTRIBUTION_*`) set by the test, one host device each, and prints one JSON
line. The model, its seed and the step count are distributed_child.py's, so the losses
compare with `distributed_child.fit_losses` on one device.

- `fit`: a user's script: `select_strategy("auto")` first (it joins the processes), then
  this process's rows of the token-budget batches of the binarized corpus in
  `CORPUS_DIR` (`jax_processes.process_dataset`), `fit`, and the weights saved to
  `OUT_DIR/process_<index>.npz`.
- `mismatch`: `check_same_run` with a `tokens_per_batch` that differs between processes.
- `kt_train`: `kt-train` with the arguments after the mode, in the working directory
  the test gives each process.
- `fault`: trains until killed; writes `OUT_DIR/step_<index>` after its second step, and
  raises after its third in the process `RAISE_IN` names.
"""

import json
import os
import sys

import numpy as np

import distributed_child

# Batches of 2 x 6, 3 x 4 and 4 x 8 tokens over the test's corpus: three shapes, one odd row count.
BATCHING = dict(max_length=8, tokens_per_batch=36, bucket_boundaries=[4, 6, 8], seed=1)


def corpus_batches(shard):
    from keras_transformer.data.binarized import open_binarized
    from keras_transformer.data.index_batches import IndexBatches

    corpus = open_binarized(os.environ["CORPUS_DIR"])
    return IndexBatches(corpus, shard=shard, **BATCHING)


def run_fit():
    from keras_transformer import distribute

    engine = distribute.select_strategy("auto")  # first thing: joins the other processes
    import jax

    from keras_transformer import jax_processes

    data = jax_processes.process_dataset(corpus_batches, engine)
    losses, _, model = distributed_child.fit_losses(engine, data=data)
    index = jax.process_index()
    weights = {weight.path: np.asarray(weight.value) for weight in model.weights}
    np.savez(os.path.join(os.environ["OUT_DIR"], f"process_{index}.npz"), **weights)
    shard = jax_processes.process_shard(engine)
    rows = [corpus_batches(shard).batch(step)[0]["encoder_inputs"].tolist() for step in range(distributed_child.STEPS)]
    return {
        "losses": losses,
        "process": [index, jax.process_count()],
        "shard": [shard.index, shard.count],
        "replicas": distribute.num_replicas(engine),
        "describe": distribute.describe(engine),
        "is_chief": distribute.is_chief(),
        "rows": rows,
    }


def run_mismatch():
    from keras_transformer import jax_processes

    jax_processes.initialize()
    import jax

    try:
        jax_processes.check_same_run({"tokens_per_batch": 32 + jax.process_index(), "tokenizer": "same"})
    except ValueError as error:
        return {"error": str(error)}
    return {"error": None}


def run_fault():
    import keras

    from keras_transformer import build_transformer, distribute
    from keras_transformer.train.losses import LabelSmoothedCrossEntropy

    engine = distribute.select_strategy("auto")
    import jax

    from keras_transformer import jax_processes

    marker = os.path.join(os.environ["OUT_DIR"], f"step_{jax.process_index()}")

    raises = os.environ.get("RAISE_IN") == str(jax.process_index())

    class Marker(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch == 1:
                open(marker, "w").close()
            if batch == 2 and raises:
                raise RuntimeError(f"process {jax.process_index()} failed on purpose")

    data = jax_processes.process_dataset(corpus_batches, engine)
    with distribute.distribution_scope(engine):
        model = build_transformer(distributed_child.config())
        model.compile(optimizer="adam", loss=LabelSmoothedCrossEntropy())
        model.fit(data, epochs=1, steps_per_epoch=10**6, callbacks=[Marker()], verbose=0)
    return {"finished": True}


def run_kt_train():
    """`kt-train` (its `main`) with the arguments after the mode, in the working directory the test gave."""
    from keras_transformer.cli import train

    return {"status": train.main(sys.argv[2:])}


if __name__ == "__main__":
    modes = {"fit": run_fit, "mismatch": run_mismatch, "fault": run_fault, "kt_train": run_kt_train}
    print(json.dumps(modes[sys.argv[1]]()), flush=True)
