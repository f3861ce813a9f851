"""Checkpoint ensembles against checkpoint averaging, on Multi30k's `val` and test2016.

One trained run (`bench/multi30k.py` writes them) decoded four ways with the search
saved in its directory (or `--beam-size` / `--alpha`):

- last: the run's `model.keras` (its weights when the budget ran out);
- averaged: the element-wise mean of its last K checkpoints (section 6.1 of the paper;
  what `kt-average-checkpoints` writes);
- ensemble, probs: the last K checkpoints kept apart and combined at every step by
  the mean of their probabilities (`keras_transformer.inference.ensemble`, fairseq's
  rule);
- ensemble, log-probs: the same with the mean of their log-probabilities,
  renormalised (OpenNMT-py's and Marian's rule).

Nothing is trained: what an ensemble costs is decoding time, K times one model's, so
each setting's seconds are recorded beside its BLEU (on the same machine, in the same
run). `--runs DIR ...` adds an ensemble of whole runs (their `model.keras` files,
which must share the tokenizer) as a fifth setting. Settings are compared on `val`;
test2016 is scored for every one, once.

Usage:

    .venv/bin/python bench/ensemble.py ../shared/data/multi30k \\
        --model-dir saved_models/multi30k_en_de --direction en-de

Adds an entry per model directory to `bench/results/ensemble.json`, draws
`bench/results/ensemble.png`, and prints a markdown table. The seconds of a scoring run
are recorded with it, but decoding speed is measured apart, on an idle machine:
`--timing N` decodes the first N val sentences with each setting (best of 2 interleaved
rounds after a compiling call) and records `timing_idle` in the same entry.
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

SPLITS = {"val": "val", "test2016": "test_2016_flickr"}


def settings(model_dir, last, runs):
    """`{name: a function returning (model, tokenizer)}`, loaded only when scored."""
    import keras_transformer as kt
    from keras_transformer.model.directory import CHECKPOINT_DIR, load_model_and_tokenizer
    from keras_transformer.train.checkpoints import average_checkpoints, latest_checkpoints

    def averaged():
        model, tokenizer = load_model_and_tokenizer(model_dir)
        paths = latest_checkpoints(os.path.join(model_dir, CHECKPOINT_DIR), last)
        return average_checkpoints(model, paths), tokenizer

    chosen = {
        "last": lambda: load_model_and_tokenizer(model_dir),
        f"averaged {last}": averaged,
        f"ensemble of {last}, probs": lambda: kt.load_checkpoint_ensemble(model_dir, last),
        f"ensemble of {last}, log-probs": lambda: kt.load_checkpoint_ensemble(model_dir, last, combine="log_probs"),
    }
    if runs:
        chosen[f"ensemble of {1 + len(runs)} runs, probs"] = lambda: kt.load_ensemble([model_dir, *runs])
    return chosen


def score(model, tokenizer, sources, references, beam_size, alpha, batch_size):
    from keras_transformer.inference.translator import Translator

    translator = Translator(model, tokenizer, beam_size=beam_size, length_penalty=alpha, batch_size=batch_size)
    translator.translate(sources[:batch_size])  # compiles the longest shapes first; not timed
    started = time.monotonic()
    scores = sacrebleu_scores(translator.translate(sources), references)
    return {
        "bleu": round(scores["bleu"], 2),
        "bleu_lowercased": round(scores["bleu_lowercased"], 2),
        "chrf": round(scores["chrf"], 2),
        "seconds": round(time.monotonic() - started, 1),
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", help="folder with Multi30k's val and test_2016_flickr .de/.en files")
    parser.add_argument("--model-dir", required=True, help="a trained model directory with checkpoints/")
    parser.add_argument("--direction", required=True, choices=["de-en", "en-de"])
    parser.add_argument("--last", type=int, default=5, help="checkpoints averaged or ensembled (default 5)")
    parser.add_argument("--runs", nargs="*", default=[], help="other runs' directories to ensemble with it")
    parser.add_argument("--beam-size", type=int, help="default: the directory's saved search")
    parser.add_argument("--alpha", type=float, help="default: the directory's saved search")
    parser.add_argument("--only", nargs="*", help="score only these settings (names as in the table)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument(
        "--timing",
        type=int,
        metavar="N",
        help="instead of scoring: time each setting on the first N val sentences (after a compiling "
        "call, best of 2 rounds, interleaved) on an idle machine, and record it as timing_idle",
    )
    parser.add_argument("--results", default=str(machine.RESULTS_DIR / "ensemble.json"))
    parser.add_argument(
        "--markdown", action="store_true", help="print MODEL_DIR's table from --results, redraw the chart, and exit"
    )
    args = parser.parse_args(argv)
    if args.markdown:
        results_path = pathlib.Path(args.results)
        payload = json.loads(results_path.read_text())
        draw(payload, results_path.with_suffix(".png"))
        print(table(payload["runs"][os.path.normpath(args.model_dir)]))
        return

    from keras_transformer.model.directory import resolve_search

    data_dir = pathlib.Path(args.data_dir)
    source_lang, target_lang = args.direction.split("-")
    beam_size, alpha = resolve_search(args.model_dir, args.beam_size, args.alpha)
    splits = {name: read_split(data_dir, split, source_lang, target_lang) for name, split in SPLITS.items()}
    if args.timing:
        return time_settings(args, beam_size, alpha, splits["val"][0][: args.timing])
    rows = {}
    for name, load in settings(args.model_dir, args.last, args.runs).items():
        if args.only and name not in args.only:
            continue
        model, tokenizer = load()
        rows[name] = {}
        for split, (sources, references) in splits.items():
            rows[name][split] = score(model, tokenizer, sources, references, beam_size, alpha, args.batch_size)
            print(f"{name}, {split}: BLEU {rows[name][split]['bleu']:.2f} in {rows[name][split]['seconds']} s", flush=True)
        del model

    results_path = pathlib.Path(args.results)
    payload = json.loads(results_path.read_text()) if results_path.is_file() else {"benchmark": "ensemble"}
    entry = payload.setdefault("runs", {}).setdefault(os.path.normpath(args.model_dir), {})
    entry.update(direction=args.direction, beam_size=beam_size, alpha=alpha, runs=args.runs)
    entry.setdefault("settings", {}).update(rows)
    entry["machine"] = machine.machine_info()
    machine.write_json(results_path, payload)
    draw(payload, results_path.with_suffix(".png"))
    print(table(entry))


def time_settings(args, beam_size, alpha, sources):
    """Seconds to decode `sources` with each setting: best of 2 rounds, interleaved."""
    from keras_transformer.inference.translator import Translator

    translators = {}
    for name, load in settings(args.model_dir, args.last, args.runs).items():
        if args.only and name not in args.only:
            continue
        model, tokenizer = load()
        translators[name] = Translator(model, tokenizer, beam_size=beam_size, length_penalty=alpha, batch_size=args.batch_size)
        translators[name].translate(sources)  # compiles every shape these sentences reach
    seconds = {name: [] for name in translators}
    for _ in range(2):
        for name, translator in translators.items():
            started = time.monotonic()
            translator.translate(sources)
            seconds[name].append(time.monotonic() - started)
    timing = {
        "sentences": len(sources),
        "seconds": {name: round(min(values), 2) for name, values in seconds.items()},
        "machine": machine.machine_info(),
    }
    results_path = pathlib.Path(args.results)
    payload = json.loads(results_path.read_text())
    payload["runs"][os.path.normpath(args.model_dir)]["timing_idle"] = timing
    machine.write_json(results_path, payload)
    base = timing["seconds"].get("last")
    for name, value in timing["seconds"].items():
        ratio = f" ({value / base:.2f}x last)" if base else ""
        print(f"{name}: {value:.2f} s for {len(sources)} sentences{ratio}")


def table(entry):
    """The markdown table of one model directory's entry (decode times from `--timing`)."""
    timing = entry.get("timing_idle", {})
    seconds = timing.get("seconds", {})
    lines = [
        f"| decoded with | val BLEU | test2016 BLEU / lc / chrF | seconds for {timing.get('sentences', 'N')} val sentences |",
        "|---|---|---|---|",
    ]
    for name, row in entry["settings"].items():
        test = row["test2016"]
        time_cell = "—"
        if name in seconds:
            time_cell = f"{seconds[name]:.1f}"
            if "last" in seconds and name != "last":
                time_cell += f" ({seconds[name] / seconds['last']:.1f}x)"
        lines.append(
            f"| {name} | {row['val']['bleu']:.2f} | {test['bleu']:.2f} / {test['bleu_lowercased']:.2f} / "
            f"{test['chrf']:.2f} | {time_cell} |"
        )
    return "\n".join(lines)


def draw(payload, path):
    """One bar cluster per model directory and split, one bar per setting."""
    entries = list(payload["runs"].items())
    names = list(dict.fromkeys(name for _, entry in entries for name in entry["settings"]))
    groups, series = [], {name: [] for name in names}
    for model_dir, entry in entries:
        for split in SPLITS:
            groups.append(f"{os.path.basename(os.path.normpath(model_dir))}\n{split}")
            for name in names:
                row = entry["settings"].get(name)
                series[name].append(None if row is None else row[split]["bleu"])
    info = entries[-1][1]["machine"]
    machine.grouped_bar_chart(
        path,
        "Multi30k en-de: last checkpoints averaged or ensembled (sacreBLEU)",
        "BLEU",
        groups,
        series,
        note=f"{info.get('cpu_model', '')}; each run's saved search",
    )


if __name__ == "__main__":
    main()
