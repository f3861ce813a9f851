"""Sequence packing against bucketing: how many of the tokens a step computes are real?

Builds the training batches of a run config (default `training/configs/multi30k.toml`)
twice, as `kt-train` does: bucketed by length (the config's buckets) and packed
(`make_dataset(..., packing=True)`: several pairs per row of `max_length` tokens). For
each it reports the share of real tokens on both sides and the batches per epoch, then
trains the config's model on it for `--steps` steps (the same initial weights, the
run's optimizer and schedule) and times the steps after the first few: real target
tokens per second is what a time budget buys.

Usage:

    .venv/bin/python bench/packing.py --data-dir ../shared/data/multi30k
    .venv/bin/python bench/packing.py --data-dir ../shared/data/multi30k --steps 60 --set model.d_model=128

Writes bench/results/packing.json and packing.png.
"""

import argparse
import os
import pathlib
import statistics
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
PAD_ID = 0
WARMUP_STEPS = 5  # the first steps trace the graph (one trace per new batch shape)


def datasets(run_config):
    """`{"bucketed": (dataset, stats), "packed": (dataset, stats)}` and the tokenizer."""
    from keras_transformer.data.pipeline import evenly_spaced_boundaries, make_dataset
    from keras_transformer.train.run import load_corpus, prepare_tokenizer

    splits = load_corpus(run_config)
    config = run_config.model_config()
    with tempfile.TemporaryDirectory() as model_dir:
        tokenizer = prepare_tokenizer(run_config, splits["train"], model_dir, resuming=False)
    common = dict(
        max_length=config.max_length,
        tokens_per_batch=run_config.tokens_per_batch,
        seed=run_config.seed,
        repeat=True,
    )
    boundaries = evenly_spaced_boundaries(run_config.bucket_width, config.max_length)
    return {
        "bucketed": make_dataset(splits["train"], tokenizer, bucket_boundaries=boundaries, **common),
        "packed": make_dataset(splits["train"], tokenizer, packing=True, **common),
    }


def real_fractions(dataset, batches):
    """Real-token shares of the encoder inputs and the labels over `batches` batches."""
    import numpy as np

    source = target = slots = 0
    for inputs, labels in dataset.take(batches).as_numpy_iterator():
        source += int(np.count_nonzero(inputs["encoder_inputs"] != PAD_ID))
        target += int(np.count_nonzero(labels != PAD_ID))
        slots += labels.size
    return source / slots, target / slots


def train_steps(run_config, dataset, steps, initial_weights):
    """Trains `steps` steps; returns per-step seconds after warm-up and real target tokens."""
    import keras
    import numpy as np

    from keras_transformer.train.run import build_and_compile

    model = build_and_compile(run_config, run_config.model_config())
    model.set_weights(initial_weights)
    times, tokens = [], []
    batch_tokens = iter(
        int(np.count_nonzero(labels != PAD_ID)) for _, labels in dataset.take(steps).as_numpy_iterator()
    )

    class Timer(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.start = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter() - self.start)
            tokens.append(next(batch_tokens))

    model.fit(dataset.take(steps), epochs=1, steps_per_epoch=steps, verbose=0, callbacks=[Timer()])
    return times[WARMUP_STEPS:], tokens[WARMUP_STEPS:]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(REPO / "training" / "configs" / "multi30k.toml"))
    parser.add_argument("--data-dir", default=None, help="the corpus folder (overrides the config's data_dir)")
    parser.add_argument("--steps", type=int, default=60, help="training steps timed per pipeline")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="run config override")
    parser.add_argument("--output", default=str(machine.RESULTS_DIR / "packing.json"))
    args = parser.parse_args(argv)

    import keras

    from keras_transformer.train.run_config import RunConfig

    overrides = list(args.set) + ([f"data_dir={args.data_dir}"] if args.data_dir else [])
    run_config = RunConfig.from_toml(args.config, overrides=overrides)
    keras.utils.set_random_seed(run_config.seed)
    pipelines = datasets(run_config)
    from keras_transformer.model.transformer import build_transformer

    initial_weights = build_transformer(run_config.model_config()).get_weights()
    results = {}
    for name, (dataset, stats) in pipelines.items():
        source_real, target_real = real_fractions(dataset, stats.num_batches)
        times, tokens = train_steps(run_config, dataset, args.steps, initial_weights)
        seconds = statistics.median(times)
        results[name] = {
            "batches_per_epoch": stats.num_batches,
            "source_real_fraction": round(source_real, 4),
            "target_real_fraction": round(target_real, 4),
            "median_step_seconds": round(seconds, 4),
            "real_target_tokens_per_second": round(sum(tokens) / sum(times), 1),
            "timed_steps": len(times),
            "stats": str(stats),
        }
        print(
            f"{name}: {stats.num_batches} batches/epoch, real tokens {source_real:.1%} (source) "
            f"{target_real:.1%} (target); step {seconds:.3f} s; "
            f"{results[name]['real_target_tokens_per_second']:,.0f} real target tok/s",
            flush=True,
        )
    ratio = results["packed"]["real_target_tokens_per_second"] / results["bucketed"]["real_target_tokens_per_second"]
    print(f"packed / bucketed real target tokens per second: {ratio:.2f}x")
    payload = {
        "machine": machine.machine_info(),
        "backend": keras.backend.backend(),
        "config": args.config,
        "overrides": overrides,
        "results": results,
        "packed_over_bucketed": round(ratio, 3),
    }
    machine.write_json(args.output, payload)
    machine.grouped_bar_chart(
        pathlib.Path(args.output).with_suffix(".png"),
        "Multi30k training batches: bucketed vs packed",
        "real target tokens / s",
        ["real target tokens / s"],
        {name: [entry["real_target_tokens_per_second"]] for name, entry in results.items()},
        note=f"{machine.machine_info()['cpu_model']}; {keras.backend.backend()}",
    )


if __name__ == "__main__":
    main()
