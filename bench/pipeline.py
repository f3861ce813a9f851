"""Input pipeline throughput against what the model consumes: is input ever the bottleneck?

Builds the training batches exactly as `training/train.py` does (the run config's corpus,
tokenizer and `keras_transformer.data.make_dataset`: tokenize, add BOS/EOS, bucket by
length, batch by token budget, shuffle, prefetch), then iterates whole epochs without a
model and counts target tokens per second. It compares that with the training
throughput in `bench/results/train_throughput.json` (written by
`bench/train_throughput.py`), when present: the ratio is how many times faster the
input is produced than the fastest measured model consumes it.

Two numbers per corpus:
- `prepare_seconds`: the `make_dataset` call, which tokenizes the corpus once (its
  counting pass fills the in-memory cache);
- steady-state epochs: batches from the cache, shuffled and padded, as every epoch after
  the first sees them. Tokens are counted from the labels: real (non-pad) target tokens
  and padded target positions.

It also reports the CPU seconds the pipeline spends per million target tokens, and from
it the share of one core that feeding the fastest model would take.

Usage:

    .venv/bin/python bench/pipeline.py
    .venv/bin/python bench/pipeline.py --data-dir ../shared/data/multi30k

Writes bench/results/pipeline.json and pipeline.png.
"""

import argparse
import json
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")  # tf.data feeds every backend alike
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
CONFIGS = REPO / "training" / "configs"
PAD_ID = 0


def corpus_batches(run_config):
    """`(dataset, stats, prepare_seconds, tokenizer_seconds)` for `run_config`'s train split."""
    from keras_transformer.data.pipeline import evenly_spaced_boundaries, make_dataset
    from keras_transformer.train.run import load_corpus, prepare_tokenizer

    splits = load_corpus(run_config)
    config = run_config.model_config()
    with tempfile.TemporaryDirectory() as model_dir:
        start = time.perf_counter()
        tokenizer = prepare_tokenizer(run_config, splits["train"], model_dir, resuming=False)
        tokenizer_seconds = time.perf_counter() - start
    start = time.perf_counter()
    dataset, stats = make_dataset(
        splits["train"],
        tokenizer,
        max_length=config.max_length,
        tokens_per_batch=run_config.tokens_per_batch,
        bucket_boundaries=evenly_spaced_boundaries(run_config.bucket_width, config.max_length),
        seed=run_config.seed,
    )
    prepare_seconds = time.perf_counter() - start
    return dataset, stats, config, prepare_seconds, tokenizer_seconds


def time_epoch(dataset):
    """Iterates one epoch; returns wall and CPU seconds and token counts."""
    import numpy as np

    batches = real = padded = source = 0
    cpu, wall = time.process_time(), time.perf_counter()
    for inputs, labels in dataset:
        labels = labels.numpy()
        batches += 1
        real += int(np.count_nonzero(labels != PAD_ID))
        padded += labels.size
        source += int(np.count_nonzero(inputs["encoder_inputs"].numpy() != PAD_ID))
    return {
        "wall_seconds": time.perf_counter() - wall,
        "cpu_seconds": time.process_time() - cpu,
        "batches": batches,
        "target_tokens": real,
        "padded_target_positions": padded,
        "source_tokens": source,
    }


def measure_corpus(name, run_config, epochs):
    dataset, stats, config, prepare_seconds, tokenizer_seconds = corpus_batches(run_config)
    runs = [time_epoch(dataset) for _ in range(epochs)]
    best = min(runs, key=lambda run: run["wall_seconds"])
    result = {
        "corpus": name,
        "train_pairs": stats.total,
        "kept_pairs": stats.kept,
        "max_length": config.max_length,
        "tokens_per_batch": run_config.tokens_per_batch,
        "vocab_size": run_config.vocab_size,
        "bucket_boundaries": list(stats.bucket_boundaries),
        "tokenizer_training_seconds": round(tokenizer_seconds, 3),
        "prepare_seconds": round(prepare_seconds, 3),
        "epochs": runs,
        "target_tokens_per_second": best["target_tokens"] / best["wall_seconds"],
        "padded_target_positions_per_second": best["padded_target_positions"] / best["wall_seconds"],
        "padding_fraction": 1.0 - best["target_tokens"] / best["padded_target_positions"],
        "batches_per_second": best["batches"] / best["wall_seconds"],
        "cpu_seconds_per_million_target_tokens": 1e6 * best["cpu_seconds"] / best["target_tokens"],
    }
    print(
        f"{name}: {stats.kept} pairs, {best['batches']} batches/epoch; tokenize+count "
        f"{prepare_seconds:.1f} s; steady epoch {best['wall_seconds']:.2f} s = "
        f"{result['target_tokens_per_second']:,.0f} target tok/s "
        f"({result['padding_fraction']:.0%} padding), "
        f"{result['cpu_seconds_per_million_target_tokens']:.2f} CPU s per 1M tokens",
        flush=True,
    )
    return result


def model_consumption(path):
    """`{"preset / backend": ours' target tokens/s}` from train_throughput.json, if any."""
    path = pathlib.Path(path)
    if not path.is_file():
        return {}
    payload = json.loads(path.read_text())
    rates = {}
    for backend, part in payload.get("backends", {}).items():
        for preset, entry in part.get("presets", {}).items():
            ours = entry.get("models", {}).get("ours")
            if ours:
                rates[f"{preset} / {backend}"] = ours["target_tokens_per_second"]
    # The real training runs of bench/multi30k.py, when present: what fit consumed.
    multi30k = path.with_name("multi30k.json")
    if multi30k.is_file():
        for direction, entry in json.loads(multi30k.read_text()).get("directions", {}).items():
            rates[f"multi30k {direction} fit"] = entry["target_tokens_per_second"]
    return rates


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data-dir", help="Multi30k folder (train.de / train.en); optional")
    parser.add_argument("--epochs", type=int, default=3, help="steady-state epochs timed (best counts)")
    parser.add_argument("--demo-pairs", type=int, default=50_000, help="demo corpus training pairs")
    parser.add_argument(
        "--throughput-json",
        default=str(machine.RESULTS_DIR / "train_throughput.json"),
        help="train_throughput.py results to compare with",
    )
    parser.add_argument("--output", default=str(machine.RESULTS_DIR / "pipeline.json"))
    args = parser.parse_args(argv)

    from keras_transformer.train.run_config import RunConfig

    start_load = machine.load_average()
    corpora = {}
    demo = RunConfig.from_toml(CONFIGS / "demo.toml").replace(demo_num_train=args.demo_pairs)
    corpora["demo"] = measure_corpus("demo", demo, args.epochs)
    if args.data_dir:
        if not (pathlib.Path(args.data_dir) / "train.de").is_file():
            print(f"No Multi30k train.de/train.en in {args.data_dir}; skipped.", flush=True)
        else:
            multi30k = RunConfig.from_toml(CONFIGS / "multi30k.toml").replace(data_dir=args.data_dir)
            corpora["multi30k"] = measure_corpus("multi30k", multi30k, args.epochs)

    consumption = model_consumption(args.throughput_json)
    fastest = max(consumption.values()) if consumption else None
    for result in corpora.values():
        if fastest:
            result["headroom_over_fastest_model"] = result["target_tokens_per_second"] / fastest
            # Seconds of CPU the pipeline needs per second of training at the fastest rate.
            result["cores_to_feed_fastest_model"] = (
                result["cpu_seconds_per_million_target_tokens"] * fastest / 1e6
            )
            print(
                f"{result['corpus']}: input {result['headroom_over_fastest_model']:.0f}x faster than the "
                f"fastest model ({fastest:,.0f} tok/s); feeding it takes "
                f"{result['cores_to_feed_fastest_model']:.1%} of one core",
                flush=True,
            )
    info = machine.machine_info()
    info["load_average_1min_at_start"] = start_load
    payload = {
        "benchmark": "pipeline",
        "command": " ".join([pathlib.Path(sys.executable).name] + sys.argv),
        "machine": info,
        "corpora": corpora,
        "model_target_tokens_per_second": consumption,
        "model_results": str(args.throughput_json) if consumption else None,
    }
    machine.write_json(args.output, payload)
    groups = [f"input:\n{name}" for name in corpora] + [k.replace(" / ", "\n") for k in consumption]
    values = [r["target_tokens_per_second"] for r in corpora.values()] + list(consumption.values())
    machine.grouped_bar_chart(
        pathlib.Path(args.output).with_suffix(".png"),
        "Input pipeline vs training: target tokens/s (log scale)",
        "target tokens / s",
        groups,
        {"tokens/s": values},
        note=f"{info['cpu_model']}, {info['usable_cores']} cores, load {start_load}->{info['load_average_1min']}",
        log_scale=True,
    )


if __name__ == "__main__":
    main()
