"""Keras' Adam against `FusedAdam` on a run config's model, side by side, on TensorFlow.

Times, in one process and interleaved round by round (the fastest round counts):
`optimizer.apply` alone on the model's weights with fixed gradients, and whole training
steps (`train_on_batch` on the four commonest Multi30k bucket shapes, as
`bench/step_speed.py` builds them), each with `keras.optimizers.Adam` and with
`kt.FusedAdam`, each built by the config's `make_optimizer` (schedule, betas, epsilon,
clipnorm, weight decay). Writes JSON with the machine, and a PNG bar chart beside it.

Usage:

    .venv/bin/python bench/optimizer_speed.py --config training/configs/multi30k_en_de.toml
"""

import argparse
import os
import pathlib
import sys
import time
from unittest import mock

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench import machine  # noqa: E402
from bench.step_speed import random_batches, shapes  # noqa: E402
from keras_transformer.train import compile as compile_module  # noqa: E402
from keras_transformer.train.fused_adam import FusedAdam  # noqa: E402
from keras_transformer.train.run import build_and_compile  # noqa: E402
from keras_transformer.train.run_config import RunConfig  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "optimizer_speed.json"


def compiled_apply(optimizer, gradients, weights):
    """`optimizer.apply(gradients, weights)` as one graph, as `fit` runs it."""
    return tf.function(lambda: optimizer.apply(gradients, weights))


def best_time(function, best, label, repeats):
    start = time.perf_counter()
    for _ in range(repeats):
        function()
    best[label] = min(best.get(label, float("inf")), (time.perf_counter() - start) / repeats)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "training" / "configs" / "multi30k_en_de.toml"))
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a config override (repeatable)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="passes over the four batch shapes a round")
    parser.add_argument("--output", default=str(RESULTS), help="the JSON written")
    args = parser.parse_args(argv)
    if keras.backend.backend() != "tensorflow":
        parser.error(f"FusedAdam's kernel is TensorFlow's; run with KERAS_BACKEND=tensorflow. Received: {keras.backend.backend()}")
    config = RunConfig.from_toml(args.config, overrides=args.set)
    training = config.training_config()
    if training.optimizer != "adam":
        parser.error(f"the config's optimizer must be Adam. Received: {training.optimizer!r}")
    batches = random_batches(config.tokens_per_batch, config.vocab_size)

    models, appliers = {}, {}
    for label, adam_class in (("keras Adam", keras.optimizers.Adam), ("FusedAdam", FusedAdam)):
        keras.utils.set_random_seed(0)
        # Built and compiled as kt-train does (schedule, clipping, weight decay, loss,
        # metrics); only the Adam class that `make_optimizer` instantiates differs.
        with mock.patch.object(compile_module, "FusedAdam", adam_class):
            model = build_and_compile(config, config.model_config())
        assert type(model.optimizer) is adam_class, type(model.optimizer)
        for batch in batches:  # traces every shape before timing
            model.train_on_batch(*batch)
        models[label] = model
        # `apply` alone: a second optimizer of the same class and config over the same weights.
        alone = adam_class.from_config(model.optimizer.get_config())
        weights = model.trainable_variables
        alone.build(weights)
        gradients = [tf.random.normal(w.shape, stddev=1e-2, seed=i) for i, w in enumerate(weights)]
        appliers[label] = compiled_apply(alone, gradients, weights)
        appliers[label]()

    # One untimed round first: Keras' Adam's first round after both models are built runs
    # several times slower (2.3 s against 0.36 s a step), on every run of this script.
    for label, model in models.items():
        appliers[label]()
        for batch in batches:
            model.train_on_batch(*batch)

    apply_best, step_best = {}, {}
    for round_ in range(args.rounds):
        for label in models:
            best_time(appliers[label], apply_best, label, repeats=20)
            model = models[label]
            best_time(
                lambda: [model.train_on_batch(*batch) for batch in batches],
                step_best, label, repeats=args.steps,
            )
        print(
            f"round {round_ + 1}: "
            + ", ".join(
                f"{label} apply {1000 * apply_best[label]:.1f} ms, step {1000 * step_best[label] / len(batches):.1f} ms"
                for label in models
            ),
            flush=True,
        )
    seconds_per_step = {label: t / len(batches) for label, t in step_best.items()}
    payload = {
        "benchmark": "optimizer_speed",
        "config": pathlib.Path(args.config).name,
        "overrides": args.set,
        "parameters": int(sum(np.prod(w.shape) for w in models["FusedAdam"].trainable_variables)),
        "shapes": [list(shape) for shape in shapes(config.tokens_per_batch)],
        "clipnorm": training.clipnorm,
        "weight_decay": training.weight_decay,
        "apply_ms": {label: round(1000 * t, 2) for label, t in apply_best.items()},
        "step_ms": {label: round(1000 * t, 1) for label, t in seconds_per_step.items()},
        "step_speedup": round(seconds_per_step["keras Adam"] / seconds_per_step["FusedAdam"], 3),
        "machine": machine.machine_info(),
    }
    print(
        f"apply: {payload['apply_ms']}; step: {payload['step_ms']} "
        f"({payload['step_speedup']:.3f}x the updates in a time budget)"
    )
    print(machine.write_json(args.output, payload))
    info = payload["machine"]
    print(
        machine.grouped_bar_chart(
            pathlib.Path(args.output).with_suffix(".png"),
            f"Adam's update and the training step ({payload['step_speedup']:.3f}x the updates)",
            "milliseconds (best round)",
            ["optimizer.apply", "training step"],
            {label: [apply_best[label] * 1000, seconds_per_step[label] * 1000] for label in models},
            note=f"{payload['config']}; {info['cpu_model']}, {info['usable_cores']} cores, TensorFlow; "
            f"{payload['parameters']:,} weights, "
            f"clipnorm {training.clipnorm}, weight decay {training.weight_decay}",
        )
    )


if __name__ == "__main__":
    main()
