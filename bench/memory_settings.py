"""A translation memory's settings (kNN-MT) tuned on Multi30k's `val`.

Builds the memory of the training split from a trained model directory's own decoder
states once (`keras_transformer.inference.memory.build_translation_memory`, timed), then
translates `val` with the model directory's search (its `eval_beam_size`,
`eval_length_penalty`) for each setting of the grid: neighbours `k`, temperature `T`,
the memory's weight, and optionally the pair search (`pairs=M`: only the keys of the `M`
training pairs nearest each sentence) and the length penalty (`alpha=A`). A weight of 0
is the model alone, the row the others are read against. test2016 is never scored here: the chosen setting goes into the run config
(`eval_memory_*`), and `bench/multi30k.py` scores it there (`--rescore` for a model
directory trained already).

Usage:

    .venv/bin/python bench/memory_settings.py ../shared/data/multi30k \\
        --model-dir saved_models/multi30k_en_de --direction en-de \\
        --settings 16,30,0 --settings 16,30,0.5 --settings 16,30,0.5,pairs=32 \
        --memory /tmp/en_de_train.memory.npz

Adds each setting's row to `bench/results/memory_settings.json` (one entry per model
directory) as soon as it is decoded, so a grid stopped part way keeps what it finished,
and prints the entry as a markdown table at the end.
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
from bench.search_settings import read_split  # noqa: E402


def parse_setting(text):
    """'K,T,WEIGHT[,pairs=M][,scale=S][,alpha=A]' -> dict; SystemExit naming the expected form."""
    try:
        neighbors, temperature, weight, *options = text.split(",")
        setting = {"neighbors": int(neighbors), "temperature": float(temperature), "weight": float(weight),
                   "pairs": None, "scale": None, "alpha": None}
        for option in options:
            name, value = option.split("=")
            if name not in ("pairs", "scale", "alpha"):
                raise ValueError(name)
            setting[name] = int(value) if name == "pairs" else float(value)
        return setting
    except ValueError:
        raise SystemExit(
            "a setting is 'K,T,WEIGHT[,pairs=M][,scale=S][,alpha=A]', for example 16,30,0.5 or "
            "16,30,0.5,pairs=32,scale=400. "
            f"Received: {text!r}"
        ) from None


def memory_grid_parser(description, settings_form):
    """The arguments this script and bench/memory_likelihood.py share: data, model, grid, memory file."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("data_dir", help="folder with Multi30k's train and val .de/.en files")
    parser.add_argument("--model-dir", required=True, help="a trained model directory")
    parser.add_argument("--direction", required=True, choices=["de-en", "en-de"])
    parser.add_argument("--settings", action="append", required=True, help=f"{settings_form}; repeat for a grid")
    parser.add_argument("--memory", help="a memory file: read if it exists, else built and written there")
    return parser


def main(argv=None):
    parser = memory_grid_parser(__doc__.split("\n\n")[0], "K,T,WEIGHT[,pairs=M][,scale=S][,alpha=A]")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--results", default=str(machine.RESULTS_DIR / "memory_settings.json"))
    args = parser.parse_args(argv)
    settings = [parse_setting(text) for text in args.settings]

    from keras_transformer.inference.memory import MemoryModel, TranslationMemory, build_translation_memory
    from keras_transformer.inference.translator import Translator
    from keras_transformer.model.directory import load_model_and_tokenizer, resolve_search

    data_dir = pathlib.Path(args.data_dir)
    source_lang, target_lang = args.direction.split("-")
    model, tokenizer = load_model_and_tokenizer(args.model_dir)
    beam_size, alpha = resolve_search(args.model_dir)
    train_sources, train_targets = read_split(data_dir, "train", source_lang, target_lang)
    started = time.monotonic()
    if args.memory and os.path.isfile(args.memory):
        memory, build_seconds = TranslationMemory.load(args.memory), None
        print(f"{memory!r}, read from {args.memory}", flush=True)
    else:
        memory = build_translation_memory(model, tokenizer, train_sources, train_targets,
                                          batch_size=args.batch_size, progress=True)
        build_seconds = round(time.monotonic() - started, 1)
        print(f"{memory!r}, built in {build_seconds:.0f} s", flush=True)
        if args.memory:
            memory.save(args.memory)
    val_sources, val_references = read_split(data_dir, "val", source_lang, target_lang)
    info = {
        "direction": args.direction,
        "search": {"beam_size": beam_size, "length_penalty": alpha},
        "memory_keys": len(memory),
        "machine": machine.machine_info(),
    }
    if build_seconds is not None:
        info["memory_build_seconds"] = build_seconds
    for setting in settings:
        started = time.monotonic()
        decoding_model = MemoryModel(model, memory, neighbors=setting["neighbors"],
                                     temperature=setting["temperature"], weight=setting["weight"],
                                     distance_scale=setting["scale"], pairs=setting["pairs"])
        setting_alpha = alpha if setting["alpha"] is None else setting["alpha"]
        translator = Translator(decoding_model, tokenizer, beam_size=beam_size, length_penalty=setting_alpha,
                                batch_size=args.batch_size)
        scores = sacrebleu_scores(translator.translate(val_sources, progress=True), val_references)
        row = {
            **setting, "alpha": setting_alpha,
            "bleu": round(scores["bleu"], 2), "chrf": round(scores["chrf"], 2),
            "seconds": round(time.monotonic() - started, 1),
        }
        print(f"val {describe(row)}: BLEU {row['bleu']:.2f} chrF {row['chrf']:.2f} ({row['seconds']:.0f} s)",
              flush=True)
        entry = add_row(args.results, args.model_dir, info, row)
    print("| k | T | weight | distance scale | pairs | alpha | val BLEU | val chrF | decode (s) |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for row in entry["val_grid"]:
        print(f"| {row['neighbors']} | {row['temperature']:g} | {row['weight']:g} | {row.get('scale') or '-'} "
              f"| {row.get('pairs') or 'all'} | {row.get('alpha', alpha):g} | {row['bleu']:.2f} | {row['chrf']:.2f} "
              f"| {row['seconds']:.0f} |")


def add_row(results, model_dir, info, row, benchmark="memory_settings"):
    """Adds one setting's row to the model's entry of the results file; returns the entry.

    Written after every setting, the file read again each time: a grid stopped part way
    keeps the decodes it finished (each ~1-10 minutes of CPU), and grids of other models
    written meanwhile stay. A later grid of the same model adds rows.
    """
    results_path = pathlib.Path(results)
    payload = json.loads(results_path.read_text()) if results_path.is_file() else {"benchmark": benchmark}
    entry = payload.setdefault("runs", {}).setdefault(os.path.normpath(model_dir), {"val_grid": []})
    entry.update(info)
    entry.setdefault("val_grid", []).append(row)
    machine.write_json(results_path, payload)
    return entry


def describe(row):
    """'k 16 T 30 weight 0.5 scale 400 pairs 32 alpha 1.4'."""
    pairs = "all" if row["pairs"] is None else row["pairs"]
    scale = "-" if row["scale"] is None else f"{row['scale']:g}"
    return (f"k {row['neighbors']} T {row['temperature']:g} weight {row['weight']:g} scale {scale} pairs {pairs} "
            f"alpha {row['alpha']:g}")


if __name__ == "__main__":
    main()
