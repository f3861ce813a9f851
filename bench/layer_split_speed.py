"""Step time of the Multi30k recipe's model with its encoder and decoder layers split other ways.

A 45-minute run's step count depends on the day (the same machine ran 10-16% more steps
on some days), so a split's own cost is measured here, side by side: the en->de recipe's
model (d_model 256, d_ff 1024, 8,000 pieces) as 3+3, 2+4 and 4+2 layers, each compiled as
the recipe compiles it (no XLA), timed on the four commonest bucket shapes of 2,048-token
batches, interleaved round by round in one process; per split the fastest round counts.
Writes bench/results/layer_split_speed.json.

Usage:

    .venv/bin/python bench/layer_split_speed.py
    .venv/bin/python bench/layer_split_speed.py --splits 3+3,1+5 --rounds 6
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

import keras_transformer as kt  # noqa: E402
from bench import machine  # noqa: E402
from keras_transformer.train.compile import compile_transformer  # noqa: E402

RESULTS = pathlib.Path(__file__).resolve().parent / "results" / "layer_split_speed.json"
# (rows, padded length): the four buckets that hold ~90% of Multi30k's pairs at 2,048 tokens.
SHAPES = ((170, 12), (128, 16), (102, 20), (85, 24))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--splits", default="3+3,2+4,4+2", help="comma-separated ENCODER+DECODER layers")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=5, help="passes over the shapes a round")
    parser.add_argument("--output", default=str(RESULTS), help="the JSON written")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    batches = []
    for rows, length in SHAPES:
        ids = rng.integers(4, 8000, size=(rows, length)).astype("int32")
        batches.append(({"encoder_inputs": ids, "decoder_inputs": ids}, ids))
    models = {}
    for split in args.splits.split(","):
        encoder_layers, decoder_layers = (int(n) for n in split.split("+"))
        keras.utils.set_random_seed(0)
        config = kt.TransformerConfig.from_preset(
            "small", vocab_size=8000, d_ff=1024, max_length=64,
            num_encoder_layers=encoder_layers, num_decoder_layers=decoder_layers,
        )
        model = kt.build_transformer(config)
        compile_transformer(model, kt.TrainingConfig(warmup_steps=400), jit_compile=False)
        for batch in batches:  # builds the graphs of every shape before timing
            model.train_on_batch(*batch)
        models[split] = model
    best = {split: float("inf") for split in models}
    for round_ in range(args.rounds):
        for split, model in models.items():
            start = time.perf_counter()
            for _ in range(args.steps):
                for batch in batches:
                    model.train_on_batch(*batch)
            best[split] = min(best[split], (time.perf_counter() - start) / (args.steps * len(batches)))
        print(f"round {round_ + 1}: " + ", ".join(f"{s} {t:.3f} s" for s, t in best.items()), flush=True)
    reference = next(iter(best.values()))
    payload = {
        "benchmark": "layer_split_speed",
        "shapes": [list(shape) for shape in SHAPES],
        "seconds_per_step": {split: round(t, 4) for split, t in best.items()},
        "relative_to_first": {split: round(t / reference, 3) for split, t in best.items()},
        "machine": machine.machine_info(),
    }
    print(json.dumps(payload["relative_to_first"]))
    print(machine.write_json(args.output, payload))


if __name__ == "__main__":
    main()
