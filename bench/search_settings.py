"""Beam size and length penalty tuned on Multi30k's `val`, then scored once on test2016.

The settings of `Translator` (beam size, alpha of GNMT's length penalty) are chosen on
the validation split, never on the test set: each pair of the grid translates `val`
with a trained model directory (`bench/multi30k.py` writes them), the best by cased
sacreBLEU is kept, and only then are it and the default (beam 4, alpha 0.6) scored on
test2016, so the test figure of the chosen setting is not selected on test.

Usage:

    .venv/bin/python bench/search_settings.py ../shared/data/multi30k \\
        --model-dir saved_models/multi30k_en_de --direction en-de

Adds the grid and both test scores to `bench/results/search_settings.json` (one entry
per model directory) and prints them as a markdown table. `--save` also writes the
chosen setting into the model directory's `config.toml` (`eval_beam_size`,
`eval_length_penalty`), where `Translator`, kt-translate, kt-evaluate and kt-export
find it. The recipe's own values go in its config (`training/configs/multi30k*.toml`).
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

from bench import machine  # noqa: E402
from bench.multi30k import sacrebleu_scores  # noqa: E402

DEFAULT = (4, 0.6)  # Translator's defaults, the paper's alpha


def read_split(data_dir, split, source_lang, target_lang):
    def lines(lang):
        with open(data_dir / f"{split}.{lang}", encoding="utf-8") as file:
            return file.read().splitlines()

    return lines(source_lang), lines(target_lang)


def score(model, tokenizer, sources, references, beam_size, alpha, batch_size):
    from keras_transformer.inference.translator import Translator

    started = time.monotonic()
    translator = Translator(model, tokenizer, beam_size=beam_size, length_penalty=alpha, batch_size=batch_size)
    scores = sacrebleu_scores(translator.translate(sources), references)
    return {
        "beam_size": beam_size,
        "alpha": alpha,
        "bleu": round(scores["bleu"], 2),
        "chrf": round(scores["chrf"], 2),
        "length_ratio": scores["length_ratio"],
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", help="folder with Multi30k's val and test_2016_flickr .de/.en files")
    parser.add_argument("--model-dir", required=True, help="a trained model directory")
    parser.add_argument("--direction", required=True, choices=["de-en", "en-de"])
    parser.add_argument("--beam-sizes", default="4,6", help="comma-separated")
    parser.add_argument("--alphas", default="0.6,1.0,1.4", help="comma-separated")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--save", action="store_true", help="write the setting chosen on val into MODEL_DIR/config.toml"
    )
    parser.add_argument("--results", default=str(machine.RESULTS_DIR / "search_settings.json"))
    args = parser.parse_args(argv)

    from keras_transformer.model.directory import load_model_and_tokenizer

    data_dir = pathlib.Path(args.data_dir)
    source_lang, target_lang = args.direction.split("-")
    model, tokenizer = load_model_and_tokenizer(args.model_dir)
    val_sources, val_references = read_split(data_dir, "val", source_lang, target_lang)
    grid = []
    for beam_size in [int(b) for b in args.beam_sizes.split(",")]:
        for alpha in [float(a) for a in args.alphas.split(",")]:
            grid.append(score(model, tokenizer, val_sources, val_references, beam_size, alpha, args.batch_size))
            print(f"val beam {beam_size} alpha {alpha:g}: BLEU {grid[-1]['bleu']:.2f}", flush=True)
    best = max(grid, key=lambda row: row["bleu"])
    test_sources, test_references = read_split(data_dir, "test_2016_flickr", source_lang, target_lang)
    test = {}
    for name, (beam_size, alpha) in (("default", DEFAULT), ("chosen on val", (best["beam_size"], best["alpha"]))):
        if name == "chosen on val" and (beam_size, alpha) == DEFAULT:
            test[name] = test["default"]
            continue
        test[name] = score(model, tokenizer, test_sources, test_references, beam_size, alpha, args.batch_size)
        print(f"test2016 {name} (beam {beam_size}, alpha {alpha:g}): BLEU {test[name]['bleu']:.2f}", flush=True)

    results_path = pathlib.Path(args.results)
    payload = json.loads(results_path.read_text()) if results_path.is_file() else {"benchmark": "search_settings"}
    payload.setdefault("runs", {})[os.path.normpath(args.model_dir)] = {
        "direction": args.direction,
        "val_grid": grid,
        "test2016": test,
        "machine": machine.machine_info(),
    }
    machine.write_json(results_path, payload)
    if args.save:
        from keras_transformer.model.directory import write_search_settings

        path = write_search_settings(args.model_dir, best["beam_size"], best["alpha"])
        print(f"beam {best['beam_size']}, alpha {best['alpha']:g} saved in {path}")
    print("| beam | alpha | val BLEU | val chrF | output/reference length |\n|---|---|---|---|---|")
    for row in grid:
        print(f"| {row['beam_size']} | {row['alpha']:g} | {row['bleu']:.2f} | {row['chrf']:.2f} | {row['length_ratio']:.3f} |")


if __name__ == "__main__":
    main()
