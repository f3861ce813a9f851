"""Time of the label-smoothed loss and its gradient, by how the label's log-probability is read.

`smoothed_label_loss` reads the label term two ways: gathered with `take_along_axis` (the
loss on JAX and PyTorch, and every metric) or as the sum of the log-probabilities times
the dense smoothed target (the loss on TensorFlow). Both are timed here with a log-softmax
before them and their gradient with respect to the logits, on the logits of one Multi30k
training batch (2,048 target positions of 8,000 classes by default), through the backend's own
autodiff, compiled where the backend compiles (`tf.function`, `jax.jit`), fastest of
`--rounds` rounds of `--repeats` calls, the two readings interleaved. Writes JSON with
the machine.

Usage:

    for backend in tensorflow jax torch; do
        KERAS_BACKEND=$backend .venv/bin/python bench/loss_speed.py
    done
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import keras  # noqa: E402
import numpy as np  # noqa: E402
from keras import ops  # noqa: E402

from bench import machine  # noqa: E402
from keras_transformer.train.losses import smoothed_label_loss  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
READINGS = {"gather": False, "dense target": True}  # label reading -> `dense`


def value_and_gradient(dense, label_smoothing):
    """A compiled `(labels, logits) -> (summed loss, d loss / d logits)` for this backend."""

    def loss(labels, logits):
        log_probs = ops.log_softmax(logits, axis=-1)
        return ops.sum(smoothed_label_loss(log_probs, labels, label_smoothing, dense=dense))

    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function
        def step(labels, logits):
            with tf.GradientTape() as tape:
                tape.watch(logits)
                value = loss(labels, logits)
            return value, tape.gradient(value, logits)

        return step
    if backend == "jax":
        import jax

        return jax.jit(jax.value_and_grad(lambda logits, labels: loss(labels, logits)))
    import torch

    def step(labels, logits):
        logits = logits.detach().requires_grad_(True)
        value = loss(labels, logits)
        value.backward()
        return value, logits.grad

    return step


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--length", type=int, default=16)
    parser.add_argument("--vocab-size", type=int, default=8000)
    parser.add_argument("--label-smoothing", type=float, default=0.1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--output", help="the JSON written (default bench/results/loss_speed_BACKEND.json)")
    args = parser.parse_args(argv)
    backend = keras.backend.backend()
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(args.rows, args.length, args.vocab_size)).astype("float32")
    labels = rng.integers(4, args.vocab_size, size=(args.rows, args.length)).astype("int32")
    labels[:, -2:] = 0  # some padding, as a bucketed batch has
    logits_t, labels_t = ops.convert_to_tensor(logits), ops.convert_to_tensor(labels)
    steps, gradients = {}, {}
    for name, dense in READINGS.items():
        step = value_and_gradient(dense, args.label_smoothing)
        if backend == "jax":
            steps[name] = lambda step=step: step(logits_t, labels_t)
        else:
            steps[name] = lambda step=step: step(labels_t, logits_t)
        gradients[name] = ops.convert_to_numpy(steps[name]()[1])  # compiles, and checks agreement
    difference = float(np.abs(gradients["gather"] - gradients["dense target"]).max())
    best = {name: float("inf") for name in steps}
    for round_ in range(args.rounds):
        for name, step in steps.items():
            start = time.perf_counter()
            for _ in range(args.repeats):
                value, gradient = step()
            ops.convert_to_numpy(value)  # waits for the last call
            best[name] = min(best[name], (time.perf_counter() - start) / args.repeats)
        print(f"round {round_ + 1}: " + ", ".join(f"{name} {t * 1000:.1f} ms" for name, t in best.items()), flush=True)
    payload = {
        "benchmark": "loss_speed",
        "backend": backend,
        "logits": [args.rows, args.length, args.vocab_size],
        "label_smoothing": args.label_smoothing,
        "milliseconds": {name: round(t * 1000, 2) for name, t in best.items()},
        "gather_over_dense_target": round(best["gather"] / best["dense target"], 2),
        "max_gradient_difference": difference,
        "the loss uses": "dense target" if backend == "tensorflow" else "gather",
        "machine": machine.machine_info(),
    }
    print(json.dumps({key: payload[key] for key in ("milliseconds", "gather_over_dense_target")}))
    output = args.output or ROOT / "bench" / "results" / f"loss_speed_{backend}.json"
    print(machine.write_json(output, payload))


if __name__ == "__main__":
    main()
