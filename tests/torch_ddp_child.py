"""One of several PyTorch processes started by torchrun, for test_torch_data_parallel.py.

`python -m torch.distributed.run --standalone --nproc_per_node=2 tests/torch_ddp_child.py MODE`
(torchrun's variables set by torchrun) prints one JSON line per process, tagged with its
rank, and writes its files under `OUT_DIR`. The model, its seed and the step count are
distributed_child.py's, the batches jax_process_child.py's, so the losses compare with
`fit_losses` run on one process over the whole batches.

- `fit`: a user's script: `select_strategy("auto")` first (it joins the processes), a
  `check_same_run` that must refuse (each process's `tokens_per_batch` differs), then this
  process's rows of the token-budget batches of the corpus in `CORPUS_DIR`, trained by
  `model.fit` through the eager step and through the captured step (`CapturedTrainStep`,
  captured at a shape's first batch); the weights of each are saved to
  `OUT_DIR/<mode>_<rank>.npz`.
- `run ARGS...`: `kt-train ARGS...` (the command's own `main`, so its one-line errors and
  exit status), recording where each process's batches start (`OUT_DIR/start_<rank>_<pid>`);
  with `KILL_AT_STEP` set, rank 1 writes the time to `OUT_DIR/killed` and kills itself
  (`KILL_SIGNAL`, default SIGKILL; SIGSTOP makes it hang) after that global step.
"""

import json
import os
import signal
import sys
import time

import numpy as np

import distributed_child
import jax_process_child

MODES = ("eager", "captured")
# Buckets of 4 kB: the tiny model's gradients (about 20 kB) go out in several all-reduces.
BUCKET_BYTES = 4096


def corpus_batches(shard):
    from keras_transformer.data.binarized import open_binarized
    from keras_transformer.data.index_batches import IndexBatches

    return IndexBatches(open_binarized(os.environ["CORPUS_DIR"]), shard=shard, **jax_process_child.BATCHING)


def compiled_model(mode):
    """The seed-7 tiny model, compiled as distributed_child.fit_losses compiles it; `mode` picks its step."""
    import keras

    from keras_transformer import build_transformer
    from keras_transformer.train import torch_data_parallel
    from keras_transformer.train.losses import LabelSmoothedCrossEntropy
    from keras_transformer.train.metrics import MaskedAccuracy
    from keras_transformer.train.torch_step import CapturedTrainStep

    keras.utils.set_random_seed(7)
    model = build_transformer(distributed_child.config())
    model.compile(
        optimizer=keras.optimizers.Adam(distributed_child.LEARNING_RATE),
        loss=LabelSmoothedCrossEntropy(),
        metrics=[MaskedAccuracy()],
        jit_compile=False,
    )
    if mode == "captured":
        model.captured_train_step = CapturedTrainStep(model, capture_after=1)
    return torch_data_parallel.attach(model, bucket_bytes=BUCKET_BYTES)  # one process: the model as it is


def fit_losses(data, mode):
    """`(losses, accuracies, model)` of `distributed_child.STEPS` steps, one step per epoch."""
    model = compiled_model(mode)
    history = model.fit(data, epochs=distributed_child.STEPS, steps_per_epoch=1, verbose=0)
    return history.history["loss"], history.history["masked_accuracy"], model


def weights_of(model):
    import keras

    return {weight.path: keras.ops.convert_to_numpy(weight.value) for weight in model.weights}


def run_fit():
    from keras_transformer import distribute, torch_processes

    engine = distribute.select_strategy("auto")  # first thing: joins the other processes
    rank = torch_processes.rank()
    try:
        torch_processes.check_same_run({"tokens_per_batch": 32 + rank, "tokenizer": "same"})
        mismatch = None
    except ValueError as error:
        mismatch = str(error)
    result = {
        "rank": rank,
        "mismatch": mismatch,
        "replicas": distribute.num_replicas(engine),
        "describe": distribute.describe(engine),
        "is_chief": distribute.is_chief(),
        "shard": [torch_processes.shard().index, torch_processes.shard().count],
        "rows": [corpus_batches(torch_processes.shard()).batch(step)[0]["encoder_inputs"].tolist()
                 for step in range(distributed_child.STEPS)],
    }
    for mode in MODES:
        data = torch_processes.process_dataset(corpus_batches)
        losses, accuracies, model = fit_losses(data, mode)
        np.savez(os.path.join(os.environ["OUT_DIR"], f"{mode}_{rank}.npz"), **weights_of(model))
        step = model.captured_train_step
        result[mode] = {"losses": losses, "accuracies": accuracies,
                        "captures": getattr(step.inner, "captures", None) if step is not None else None}
    return result


def run_kt_train():
    import keras

    from keras_transformer import torch_processes
    from keras_transformer.cli import train
    from keras_transformer.train import run

    out = os.environ["OUT_DIR"]
    real_process_dataset = torch_processes.process_dataset

    def recorded(make_batches, start=0):
        with open(os.path.join(out, f"start_{torch_processes.rank()}_{os.getpid()}"), "w") as file:
            file.write(str(start))
        return real_process_dataset(make_batches, start)

    torch_processes.process_dataset = recorded
    kill_at = int(os.environ.get("KILL_AT_STEP", "0"))
    if kill_at and os.environ["RANK"] == "1":
        class KillAtStep(keras.callbacks.Callback):
            def on_train_batch_end(self, batch, logs=None):
                if int(keras.ops.convert_to_numpy(self.model.optimizer.iterations)) == kill_at:
                    with open(os.path.join(out, "killed"), "w") as file:
                        file.write(repr(time.time()))
                    os.kill(os.getpid(), getattr(signal, os.environ.get("KILL_SIGNAL", "SIGKILL")))

        real_callbacks = run._run_callbacks
        run._run_callbacks = lambda *args, **kwargs: real_callbacks(*args, **kwargs) + [KillAtStep()]
    sys.exit(train.main(sys.argv[2:]))


if __name__ == "__main__":
    if sys.argv[1] == "run":
        run_kt_train()  # exits with kt-train's status
    print(json.dumps(run_fit()), flush=True)
