"""Which weights of a finished run to ship: val BLEU of single checkpoints along the run
and of averages over windows of its newest checkpoints.

`bench/multi30k.py` scores the last weights and the average of the newest 5
checkpoints. This asks the two questions behind that choice, on `val` only (the split
to tune on): does BLEU still rise over the run's last checkpoints (`--steps`: each
checkpoint alone), and does a longer averaging window than 5 pay (`--windows`: the
uniform mean of the newest N checkpoints, `average_checkpoints`; 0 is the final weights)?
Run the training with `--set keep_checkpoints=N` large enough that the checkpoints are
still there (`bench/multi30k.py` prunes to `keep_checkpoints` after scoring).

Usage:

    .venv/bin/python bench/checkpoint_windows.py ../shared/data/multi30k \\
        --model-dir saved_models/multi30k_en_de --direction en-de \\
        --windows 0,5,10,20,40 --steps 4500,5400,6300,7200,8100

Adds one entry per model directory to `bench/results/checkpoint_windows.json`, draws
`bench/results/checkpoint_windows.png` (val BLEU against the step of each single
checkpoint, and against the window) from the latest entry, and prints a markdown table.
"""

import argparse
import json
import os
import pathlib
import re
import sys

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402
from bench.multi30k import TRAINING_FILE  # noqa: E402
from bench.search_settings import read_split, score  # noqa: E402

STEP = re.compile(r"step_(\d+)\.weights\.h5$")  # the checkpoints run_training writes every N updates


def parse_searches(text):
    """`"4:0.6,4:1.4"` -> `[(4, 0.6), (4, 1.4)]`: beam size and length penalty pairs."""
    searches = []
    for item in text.split(","):
        beam, _, alpha = item.partition(":")
        if not alpha:
            raise SystemExit(f"--searches takes BEAM:ALPHA pairs, such as 4:0.6,4:1.4; received {item!r}")
        searches.append((int(beam), float(alpha)))
    return searches


def checkpoint_path(checkpoint_dir, step):
    from keras_transformer.train.checkpoints import STEP_CHECKPOINT_PATTERN

    path = checkpoint_dir / STEP_CHECKPOINT_PATTERN.format(step=step)
    if not path.is_file():
        kept = sorted(p.name for p in checkpoint_dir.glob("*.weights.h5"))
        raise SystemExit(f"no checkpoint for step {step} at {path}; the directory keeps {kept[:3]} ... {kept[-3:]}")
    return path


def plot(entry, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (by_step, by_window) = plt.subplots(1, 2, figsize=(11, 4))
    for key in entry["searches"]:
        points = sorted((row["step"], row["bleu"]) for row in entry["single"] if row["search"] == key)
        final = [row["bleu"] for row in entry["windows"] if row["search"] == key and row["window"] == 0]
        if final:
            points.append((entry["final_step"], final[0]))
        if points:
            by_step.plot(*zip(*points), marker="o", label=key)
        windows = sorted((row["window"], row["bleu"]) for row in entry["windows"] if row["search"] == key)
        if windows:
            by_window.plot(*zip(*windows), marker="o", label=key)
    by_step.set(xlabel="update (the last point: the final weights)", ylabel="val BLEU", title="one checkpoint")
    by_window.set(
        xlabel=f"newest checkpoints averaged (every {entry['checkpoint_every']} updates; 0: final weights)",
        ylabel="val BLEU",
        title="an average of the newest N",
    )
    for axis in (by_step, by_window):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"{entry['direction']}: {entry['model_dir']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("data_dir", help="folder with Multi30k's val .de/.en files")
    parser.add_argument("--model-dir", required=True, help="a trained model directory with its checkpoints/")
    parser.add_argument("--direction", required=True, choices=["de-en", "en-de"])
    parser.add_argument("--windows", default="0,5,10,20", help="comma-separated N (0: the final weights)")
    parser.add_argument("--steps", default="", help="comma-separated updates whose checkpoint is scored alone")
    parser.add_argument("--searches", default="4:0.6,4:1.4", help="BEAM:ALPHA pairs, comma-separated")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--results", default=str(machine.RESULTS_DIR / "checkpoint_windows.json"))
    args = parser.parse_args(argv)

    from keras_transformer.model.directory import CHECKPOINT_DIR, load_model_and_tokenizer
    from keras_transformer.train.checkpoints import average_checkpoints, latest_checkpoints

    windows = [int(n) for n in args.windows.split(",") if n]
    steps = [int(s) for s in args.steps.split(",") if s]
    searches = parse_searches(args.searches)
    names = {search: f"beam {search[0]}, α {search[1]:g}" for search in searches}
    checkpoint_dir = pathlib.Path(args.model_dir) / CHECKPOINT_DIR
    step_paths = [checkpoint_path(checkpoint_dir, step) for step in steps]  # refuse before decoding
    source_lang, target_lang = args.direction.split("-")
    sources, references = read_split(pathlib.Path(args.data_dir), "val", source_lang, target_lang)
    model, tokenizer = load_model_and_tokenizer(args.model_dir)
    final = model.get_weights()
    checkpoint_steps = sorted(
        int(match.group(1)) for match in (STEP.search(p) for p in latest_checkpoints(checkpoint_dir, 10**6)) if match
    )
    if not checkpoint_steps:
        raise SystemExit(f"{checkpoint_dir} holds no step_*.weights.h5 checkpoints (checkpoint_every_steps not set?)")
    training = pathlib.Path(args.model_dir) / TRAINING_FILE  # bench/multi30k.py's record of the run
    final_step = json.loads(training.read_text())["steps"] if training.is_file() else checkpoint_steps[-1]

    def score_all(label):
        rows = []
        for search in searches:
            row = score(model, tokenizer, sources, references, *search, args.batch_size)
            rows.append({"search": names[search], "bleu": row["bleu"], "seconds": row["seconds"]})
            print(f"val {label}, {names[search]}: BLEU {row['bleu']:.2f}", flush=True)
        return rows

    entry = {
        "direction": args.direction,
        "model_dir": os.path.normpath(args.model_dir),
        "searches": list(names.values()),
        "final_step": final_step,
        "checkpoints": len(checkpoint_steps),
        "checkpoint_every": checkpoint_steps[-1] - checkpoint_steps[-2] if len(checkpoint_steps) > 1 else None,
        "windows": [],
        "single": [],
        "machine": machine.machine_info(),
    }
    for step, path in zip(steps, step_paths):
        model.load_weights(path)
        entry["single"] += [{"step": step, **row} for row in score_all(f"step {step}")]
    for window in windows:
        model.set_weights(final)
        paths = [] if window == 0 else latest_checkpoints(checkpoint_dir, window)
        if paths:
            average_checkpoints(model, paths)
        label = "final weights" if window == 0 else f"mean of the newest {len(paths)}"
        rows = score_all(label)
        first = None if window == 0 else os.path.basename(paths[0])
        entry["windows"] += [{"window": window, "averaged": len(paths), "first": first, **row} for row in rows]

    results_path = pathlib.Path(args.results)
    payload = json.loads(results_path.read_text()) if results_path.is_file() else {"benchmark": "checkpoint_windows"}
    payload.setdefault("runs", {})[entry["model_dir"]] = entry
    machine.write_json(results_path, payload)
    plot(entry, results_path.with_suffix(".png"))
    print("| weights | " + " | ".join(entry["searches"]) + " |\n|---|" + "---|" * len(searches))
    for key, rows, label in (
        ("step", entry["single"], "checkpoint at update {}"),
        ("window", entry["windows"], "newest {} averaged"),
    ):
        for value in sorted({row[key] for row in rows}):
            cells = [f"{row['bleu']:.2f}" for row in rows if row[key] == value]
            name = "final weights" if key == "window" and value == 0 else label.format(value)
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
