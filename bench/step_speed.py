"""Step time of a run config's model and of variants of it, measured side by side.

A 45-minute run's step count depends on the machine and the day (the same machine ran
10-16% more steps on some days, and two machines of one kind differ by 2x), so what a
change costs a step is measured here, in one process: the config's model (built,
compiled and batched as `kt-train` builds them: its `[model]` and `[training]` tables,
`jit_compile`, and batches of its `tokens_per_batch`) and each variant, a list of
`--set`-style overrides of the same config, timed on the four commonest Multi30k bucket
shapes (padded lengths 12 to 24, as many rows as the token budget holds), interleaved
round by round; per variant the fastest round counts. Writes JSON with the machine.

Usage:

    .venv/bin/python bench/step_speed.py                       # the de->en recipe, and with en->de's dropouts
    .venv/bin/python bench/step_speed.py --config training/configs/multi30k_en_de.toml \\
        --variant "3+3:" \\
        --variant "2+4: model.num_encoder_layers=2 model.num_decoder_layers=4" \\
        --variant "4+2: model.num_encoder_layers=4 model.num_decoder_layers=2" \\
        --set model.attention_dropout=0 --set model.activation_dropout=0 \\
        --output bench/results/layer_split_speed.json
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

from bench import machine  # noqa: E402
from keras_transformer.train.run import build_and_compile  # noqa: E402
from keras_transformer.train.run_config import RunConfig  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "step_speed.json"
# The padded lengths of the four buckets that hold ~90% of Multi30k's pairs (buckets 4 apart).
LENGTHS = (12, 16, 20, 24)
DEFAULT_VARIANTS = (
    "the recipe:",
    "with attention and activation dropout 0.1: model.attention_dropout=0.1 model.activation_dropout=0.1",
)


def parse_variant(text):
    """`"LABEL: key=value key=value"` -> `(label, [assignments])`; nothing after the colon: the config."""
    label, colon, assignments = text.partition(":")
    if not colon or not label.strip():
        raise ValueError(
            f"a variant is 'LABEL: key=value key=value ...' (the overrides may be empty). Received: {text!r}"
        )
    return label.strip(), assignments.split()


def shapes(tokens_per_batch):
    """`(rows, padded length)` of a batch of each common length, as the pipeline fills them."""
    return [(tokens_per_batch // length, length) for length in LENGTHS]


def random_batches(tokens_per_batch, vocab_size, seed=0):
    """One `(inputs, labels)` batch of random ordinary ids for each of `shapes(tokens_per_batch)`."""
    rng = np.random.default_rng(seed)
    batches = []
    for rows, length in shapes(tokens_per_batch):
        ids = rng.integers(4, vocab_size, size=(rows, length)).astype("int32")
        batches.append(({"encoder_inputs": ids, "decoder_inputs": ids}, ids))
    return batches


def build_variant(run_config, batches):
    """The run config's model, compiled as `kt-train` compiles it, every batch shape traced."""
    keras.utils.set_random_seed(0)
    model = build_and_compile(run_config, run_config.model_config())
    for batch in batches:  # builds the graph of every shape before timing
        model.train_on_batch(*batch)
    return model


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "training" / "configs" / "multi30k.toml"))
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="an override for every variant (repeatable)"
    )
    parser.add_argument(
        "--variant", action="append", metavar="'LABEL: KEY=VALUE ...'",
        help="a variant of the config (repeatable); default: the config, and with attention and activation dropout",
    )
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="passes over the shapes a round")
    parser.add_argument("--output", default=str(RESULTS), help="the JSON written")
    args = parser.parse_args(argv)
    try:
        variants = [parse_variant(text) for text in args.variant or DEFAULT_VARIANTS]
    except ValueError as error:
        parser.error(str(error))
    base = RunConfig.from_toml(args.config, overrides=args.set)
    batch_shapes = shapes(base.tokens_per_batch)
    batches = random_batches(base.tokens_per_batch, base.vocab_size)
    configs = {label: base.with_overrides(assignments) for label, assignments in variants}
    models = {label: build_variant(config, batches) for label, config in configs.items()}
    best = {label: float("inf") for label in models}
    for round_ in range(args.rounds):
        for label, model in models.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                for batch in batches:
                    model.train_on_batch(*batch)
            best[label] = min(best[label], (time.perf_counter() - start) / (args.steps * len(batches)))
        print(f"round {round_ + 1}: " + ", ".join(f"{label} {t:.3f} s" for label, t in best.items()), flush=True)
    reference = next(iter(best.values()))
    payload = {
        "benchmark": "step_speed",
        "config": pathlib.Path(args.config).name,
        "overrides": args.set,
        "variants": {label: assignments for label, assignments in variants},
        "shapes": [list(shape) for shape in batch_shapes],
        "seconds_per_step": {label: round(t, 4) for label, t in best.items()},
        "relative_to_first": {label: round(t / reference, 3) for label, t in best.items()},
        "machine": machine.machine_info(),
    }
    print(json.dumps(payload["relative_to_first"]))
    print(machine.write_json(args.output, payload))


if __name__ == "__main__":
    main()
