"""Multi30k quality in a wall-clock budget: train, average checkpoints, score test2016.

For each direction asked for (de->en, en->de), on the Multi30k corpus at DATA_DIR
(`train`, `val`, `test_2016_flickr` `.de` / `.en` files):

1. trains the direction's config (`training/configs/multi30k.toml` for de->en,
   `multi30k_en_de.toml`, which extends it, for en->de) with `max_train_seconds` = the budget
   (`keras_transformer.train.run.run_training`: tokenizer, token-budget batches, the warmup
   schedule, a checkpoint per epoch, TensorBoard / CSV logs), then
2. averages the newest `--average` checkpoints (the paper's section 6.1),
3. translates the 1,000 test2016 sentences with beam 4 (alpha 0.6, the paper's; the
   column every run has), greedily, and with the config's own search (`eval_beam_size`,
   `eval_length_penalty`, chosen on val) where it differs from beam 4, alpha 0.6, with
   the last weights and with the averaged ones, and scores each with sacreBLEU:
   cased BLEU with the default 13a tokenization (the headline figure), lowercased
   BLEU (comparable to the "lowercased, tokenized" figures published for Multi30k),
   and chrF; the `val` split too (last weights, beam 4 and the config's search), the
   split to tune on, so each run shows whether val still prefers the config's search, and
4. scores the checkpoints written along the run (greedy, test2016, about every
   `--curve-minutes`) for the chart of BLEU against training minutes. The run keeps
   every checkpoint for it and prunes them to the config's `keep_checkpoints` after.

The budget counts `model.fit` only (the per-epoch validation loss included); the
tokenizer, averaging and all decoding come on top and are timed separately: nothing
is decoded during the budget. What training measured (seconds, steps, tokens a second,
validation losses, the machine) goes into the model directory as `bench_training.json`
before any decoding, so a run whose scoring crashed or was stopped is scored again by
the same command with `--rescore` (no training; the entry is marked `rescored`).

Usage (one command; the path is an argument, nothing is copied into the repository):

    .venv/bin/python bench/multi30k.py ../shared/data/multi30k --minutes 45
    .venv/bin/python bench/multi30k.py ../shared/data/multi30k --directions en-de --minutes 45
    .venv/bin/python bench/multi30k.py ../shared/data/multi30k --minutes 2 --set model.d_model=128

Writes the models to `saved_models/multi30k_<src>_<tgt>/` (TensorBoard logs and the
test translations there too) and the scores to `bench/results/multi30k.json` (every run
in `runs`; per direction, the latest run of the recipe as shipped, without `--set`) with
charts, `bench/results/multi30k.png` (the recipe's BLEU per direction) and
`bench/results/multi30k_minutes.png` (BLEU against training minutes: per direction, the
recipe and the three other runs that score highest on val), and each direction's training curves,
`bench/results/multi30k_<src>_<tgt>_curves.png`. `--markdown` prints the run table of
the results file; `--charts` redraws the charts from it. `--results` moves the JSON and
every chart to another folder (a trial on another machine, say), named after its stem.
"""

import argparse
import dataclasses
import json
import os
import pathlib
import re
import shutil
import sys
import textwrap
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "training" / "configs"
# The recipe of each direction: en->de extends de->en and changes only its search.
CONFIGS = {"de-en": CONFIG_DIR / "multi30k.toml", "en-de": CONFIG_DIR / "multi30k_en_de.toml"}
DIRECTIONS = tuple(CONFIGS)
DECODES = ("beam", "greedy")  # beam 4, alpha 0.6 (every run has it), greedy
PAPER_SEARCH = {"beam_size": 4, "length_penalty": 0.6}


def sacrebleu_scores(hypotheses, references):
    """Cased BLEU (13a), its length ratio, lowercased BLEU and chrF of detokenized output,
    with signatures."""
    import sacrebleu

    cased = sacrebleu.BLEU()
    lowercased = sacrebleu.BLEU(lowercase=True)
    chrf = sacrebleu.CHRF()
    cased_score = cased.corpus_score(hypotheses, [references])
    return {
        "bleu": cased_score.score,
        # Output tokens per reference token: a search tuned on a split whose references are
        # longer than the test split's shows it here (en->de's val against test2016).
        "length_ratio": round(cased_score.sys_len / max(cased_score.ref_len, 1), 4),
        "bleu_lowercased": lowercased.corpus_score(hypotheses, [references]).score,
        "chrf": chrf.corpus_score(hypotheses, [references]).score,
        "signatures": {
            "bleu": str(cased.get_signature()),
            "bleu_lowercased": str(lowercased.get_signature()),
            "chrf": str(chrf.get_signature()),
        },
    }


# Written into the model directory as soon as training ends: what `--rescore` needs to
# score the run again (the test decodes crashed or were cut short) without training it.
TRAINING_FILE = "bench_training.json"


def direction_config(data_dir, direction, minutes, average, overrides, output_dir, curve_minutes):
    """The run config of one direction (its recipe, `--set` overrides, the budget, the
    paths), and the checkpoints its directory keeps once it is scored."""
    from keras_transformer.train.run_config import RunConfig

    source_lang, target_lang = direction.split("-")
    run_config = RunConfig.from_toml(str(CONFIGS[direction])).with_overrides(list(overrides))
    keep_after = max(run_config.keep_checkpoints, average)
    return run_config.replace(
        name=f"multi30k_{source_lang}_{target_lang}",
        data_dir=str(data_dir),
        source_lang=source_lang,
        target_lang=target_lang,
        max_train_seconds=minutes * 60.0,
        output_dir=str(output_dir),
        # Every checkpoint stays until the BLEU-against-minutes curve has scored them.
        keep_checkpoints=10**6 if curve_minutes else keep_after,
    ), keep_after


def run_direction(data_dir, direction, minutes, average, overrides, output_dir, curve_minutes, results_path):
    """Trains, averages and scores one direction; returns its JSON-ready entry. The
    recipe's training curves go beside `results_path`, as its other charts do."""
    from keras_transformer.train.run import run_training

    run_config, keep_after = direction_config(data_dir, direction, minutes, average, overrides, output_dir,
                                              curve_minutes)
    print(f"=== {direction}: {minutes:g} minutes of training, {run_config.model_dir}", flush=True)
    load_at_start = machine.load_average()
    result = run_training(run_config)
    training = {
        "train_seconds": round(result.train_seconds, 1),
        "steps": result.steps,
        "steps_per_epoch": result.steps_per_epoch,
        "epochs_started": len(result.history.history.get("loss", [])),  # the last one cut by the budget
        "target_tokens_per_second": round(result.target_tokens_per_second, 1),
        "stopped_by_time_budget": result.stopped_by_time_budget,
        "validation_loss": [float(x) for x in result.history.history.get("val_loss", [])],
        "machine": {**machine.machine_info(), "load_average_1min_at_start": load_at_start},
    }
    machine.write_json(pathlib.Path(result.model_dir) / TRAINING_FILE, training)
    return score_direction(run_config, direction, minutes, keep_after, overrides, curve_minutes, results_path,
                           result.model_dir, result.model, result.tokenizer, training, average)


def rescore_direction(data_dir, direction, minutes, average, overrides, output_dir, curve_minutes, results_path):
    """Scores the model directory an earlier run of the same command trained (`--rescore`)."""
    import keras

    from keras_transformer.data.tokenizer import SubwordTokenizer
    from keras_transformer.model.directory import MODEL_FILE, TOKENIZER_FILE

    run_config, keep_after = direction_config(data_dir, direction, minutes, average, overrides, output_dir,
                                              curve_minutes)
    model_dir = run_config.model_dir
    path = pathlib.Path(model_dir) / TRAINING_FILE
    if not path.is_file():
        raise SystemExit(f"--rescore needs {path}, which a run of this command writes when training ends; it is missing")
    training = json.loads(path.read_text())
    print(f"=== {direction}: scoring the run in {model_dir} again", flush=True)
    model = keras.saving.load_model(os.path.join(model_dir, MODEL_FILE), compile=False, safe_mode=True)
    tokenizer = SubwordTokenizer.load(os.path.join(model_dir, TOKENIZER_FILE))
    return score_direction(run_config, direction, minutes, keep_after, overrides, curve_minutes, results_path,
                           model_dir, model, tokenizer, training, average)


def score_direction(run_config, direction, minutes, keep_after, overrides, curve_minutes, results_path,
                    model_dir, model, tokenizer, training, average):
    """Averages and scores a trained direction; returns its JSON-ready entry."""
    import keras

    from keras_transformer.train.checkpoints import average_model_directory, prune_checkpoints
    from keras_transformer.inference.translator import Translator
    from keras_transformer.model.directory import CHECKPOINT_DIR, MODEL_FILE
    from keras_transformer.train.run import load_corpus

    source_lang, target_lang = direction.split("-")
    started = time.monotonic()
    averaged_dir, averaged_from = average_model_directory(model_dir, last=average, overwrite=True)
    averaged = keras.saving.load_model(os.path.join(averaged_dir, MODEL_FILE), compile=False, safe_mode=True)
    average_seconds = time.monotonic() - started

    test_pairs = load_corpus(run_config)["test"]
    sources = [source for source, _ in test_pairs]
    references = [target for _, target in test_pairs]
    searches = {"beam": PAPER_SEARCH, "greedy": {"beam_size": 1, "length_penalty": 0.6}}
    config_search = run_config.search_settings()
    if config_search != PAPER_SEARCH:
        searches["search"] = config_search
    scores = {}

    def score(key, decoding_model, search, inputs, targets, progress_name):
        started = time.monotonic()
        translator = Translator(decoding_model, tokenizer, **search, batch_size=run_config.eval_batch_size)
        translations = translator.translate(inputs, progress=True)
        seconds = time.monotonic() - started
        result = sacrebleu_scores(translations, targets)
        result["decode_seconds"] = round(seconds, 1)
        print(
            f"{direction} {progress_name} {key:16s} BLEU {result['bleu']:.2f}  lowercased "
            f"{result['bleu_lowercased']:.2f}  chrF {result['chrf']:.2f}  length {result['length_ratio']:.3f}  ({seconds:.0f} s)",
            flush=True,
        )
        return result, translations

    for weights, weights_model in (("last", model), ("averaged", averaged)):
        for decode, search in searches.items():
            key = f"{weights}_{decode}"
            scores[key], translations = score(key, weights_model, search, sources, references, "test2016")
            path = os.path.join(model_dir, f"test2016_{key}.{target_lang}")
            with open(path, "w", encoding="utf-8") as file:
                file.write("\n".join(translations) + "\n")
    val_pairs = load_corpus(run_config)["validation"]
    val_sources, val_references = [s for s, _ in val_pairs], [t for _, t in val_pairs]
    val = {"last_beam": score("last_beam", model, PAPER_SEARCH, val_sources, val_references, "val")[0]}
    if "search" in searches:
        val["last_search"] = score("last_search", model, config_search, val_sources, val_references, "val")[0]

    checkpoint_dir = os.path.join(model_dir, CHECKPOINT_DIR)
    curve = []
    if curve_minutes:
        curve = bleu_against_minutes(
            model_dir, tokenizer, training, checkpoint_dir, sources, references, curve_minutes,
            run_config.eval_batch_size,
        )
    prune_checkpoints(checkpoint_dir, keep_after)
    # The recipe's training curves beside the scores, where the docs show them; a trial
    # with --set leaves them as they were (its curves stay in its model directory).
    curves = pathlib.Path(model_dir) / "training_curves.png"
    if curves.is_file() and not _trial_changes(overrides):
        shutil.copyfile(curves, results_path.with_name(f"{results_path.stem}_{source_lang}_{target_lang}_curves.png"))
    return {
        "direction": direction,
        "budget_minutes": minutes,
        "train_seconds": training["train_seconds"],
        "steps": training["steps"],
        "epochs_started": training["epochs_started"],
        "epochs_trained": round(training["steps"] / max(training["steps_per_epoch"], 1), 2),
        "target_tokens_per_second": training["target_tokens_per_second"],
        "stopped_by_time_budget": training["stopped_by_time_budget"],
        "parameters": int(model.count_params()),
        "model_config": dataclasses.asdict(model.config),
        "run_config_overrides": list(overrides),
        "config": os.path.relpath(CONFIGS[direction], ROOT),
        "search": config_search,
        "averaged_checkpoints": [os.path.basename(p) for p in averaged_from],
        "average_seconds": round(average_seconds, 1),
        "validation_loss": training["validation_loss"],
        "model_dir": os.path.relpath(model_dir, ROOT),
        "test2016": scores,
        "val": val,
        "bleu_against_minutes": curve,
        "machine": training["machine"],  # the machine that trained it
    }


def bleu_against_minutes(model_dir, tokenizer, training, checkpoint_dir, sources, references, every_minutes,
                         batch_size):
    """Greedy test2016 BLEU of the run's checkpoints, about `every_minutes` apart.

    A checkpoint's minute is its update count (`step_N`, or `epoch_N` times the steps of
    an epoch) times the run's mean seconds per update (steady after the first epoch). Scored after the run into a copy
    of the model, so the budget is not spent on it and the returned model is untouched.
    """
    import keras

    from keras_transformer.inference.translator import Translator
    from keras_transformer.model.directory import MODEL_FILE
    from keras_transformer.train.checkpoints import latest_checkpoints

    paths = latest_checkpoints(checkpoint_dir, k=10**9)
    if not paths or not training["steps"]:
        return []
    seconds_per_step = training["train_seconds"] / training["steps"]
    chosen, last_minute = [], None
    for index, path in enumerate(paths):
        number = int(re.search(r"(\d+)\.weights\.h5$", path).group(1))
        step = number if os.path.basename(path).startswith("step_") else number * training["steps_per_epoch"]
        minute = step * seconds_per_step / 60.0
        if last_minute is None or minute - last_minute >= every_minutes or index == len(paths) - 1:
            chosen.append((step, minute, path))
            last_minute = minute
    model = keras.saving.load_model(os.path.join(model_dir, MODEL_FILE), compile=False, safe_mode=True)
    # One translator: its compiled decoder reads the variables, so loading new values is seen.
    translator = Translator(model, tokenizer, beam_size=1, batch_size=batch_size)
    points = []
    for step, minute, path in chosen:
        model.load_weights(path)
        score = sacrebleu_scores(translator.translate(sources), references)
        points.append({"step": step, "minutes": round(minute, 1), "greedy_bleu": round(score["bleu"], 2)})
        print(f"  step {step:>6,} ({minute:4.1f} min): greedy BLEU {score['bleu']:.2f}", flush=True)
    return points


def _machine_note(info):
    load = info.get("load_average_1min_at_start")
    return (
        f"{info['cpu_model']}, {info['usable_cores']} cores, load "
        f"{'not recorded' if load is None else load} at start; TF {info['versions'].get('tensorflow')}, Keras {info['versions'].get('keras')}"
    )


def _plot(entries, path):
    """Bars of cased sacreBLEU per direction, for each weights x decoding combination."""
    groups = [f"{entry['direction']} ({entry['budget_minutes']:g} min)" for entry in entries]
    series = {}
    for weights in ("last", "averaged"):
        for decode in DECODES:
            label = f"{weights} weights, {'beam 4' if decode == 'beam' else 'greedy'}"
            series[label] = [entry["test2016"][f"{weights}_{decode}"]["bleu"] for entry in entries]
    machine.grouped_bar_chart(
        path,
        "Multi30k test2016, sacreBLEU (cased, 13a) after a wall-clock budget of training",
        "BLEU",
        groups,
        series,
        # The directions' latest recipe runs may come from different machines: name each.
        note="; ".join(f"{entry['direction']}: {_machine_note(entry['machine'])}" for entry in entries),
    )


def _plot_minutes(payload, path, others=3):
    """Greedy test2016 BLEU against training minutes: one panel per direction, with its
    shipped recipe and the `others` runs scoring highest on val (beam 4), so that the
    best few configurations stay readable however many runs the table holds."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a benchmark machine
    import matplotlib.pyplot as plt

    panels = []
    for direction in DIRECTIONS:
        recipe = payload["directions"].get(direction)
        recipe = recipe if recipe and recipe.get("bleu_against_minutes") else None
        candidates = [
            run for run in payload["runs"]
            if run["direction"] == direction and run.get("bleu_against_minutes") and run != recipe
        ]
        candidates.sort(key=_val_bleu, reverse=True)
        shown = ([recipe] if recipe else []) + candidates[:others]
        if shown:
            panels.append((direction, recipe, shown))
    if not panels:
        return
    figure, all_axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 5.2), sharey=True, squeeze=False)
    colours = plt.get_cmap("tab10").colors
    for axes, (direction, recipe, shown) in zip(all_axes[0], panels):
        for index, run in enumerate(shown):
            points = run["bleu_against_minutes"]
            is_recipe = run is recipe
            name = "the recipe" if is_recipe else _changes(run)
            val = f"val {_val_bleu(run):.2f}" if "val" in run else "no val score"
            # Minutes buy more steps on a faster CPU: a run from another machine says so.
            if recipe and run["machine"]["cpu_model"] != recipe["machine"]["cpu_model"]:
                val += f", on {run['machine']['cpu_model']}"
            # Wrapped: a run's overrides can be longer than the panel is wide.
            label = textwrap.fill(f"{name} ({val})", 60)
            axes.plot(
                [p["minutes"] for p in points], [p["greedy_bleu"] for p in points], marker="o", label=label,
                color="black" if is_recipe else colours[index % len(colours)],
                linewidth=2.4 if is_recipe else 1.3, linestyle="-" if is_recipe else "--",
            )
        title = f"the recipe and the best {len(shown) - 1} other runs on val" if recipe else "the best runs on val"
        axes.set_title(f"{direction.replace('-', '→')}: {title}", fontsize=10)
        axes.set_xlabel("minutes of model.fit")
        axes.grid(alpha=0.3)
        # Below the axes, so that no label squeezes or covers the curves.
        axes.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.17), frameon=False)
    all_axes[0][0].set_ylabel("test2016 sacreBLEU, greedy")
    shown_runs = [run for _, _, shown in panels for run in shown]
    # The runs may come from more than one machine: name each CPU once.
    cpus = dict.fromkeys(f"{run['machine']['cpu_model']} ({run['machine']['usable_cores']} cores)" for run in shown_runs)
    versions = shown_runs[-1]["machine"]["versions"]
    note = f"{'; '.join(cpus)}; TF {versions.get('tensorflow')}, Keras {versions.get('keras')}"
    figure.text(0.01, 0.01, note, fontsize=7)
    figure.tight_layout(rect=(0, 0.03, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _val_bleu(run):
    """A run's val BLEU with beam 4 (runs from before val was scored sort last)."""
    return run["val"]["last_beam"]["bleu"] if "val" in run else float("-inf")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "data_dir", nargs="?", help="folder with Multi30k's train/val/test_2016_flickr .de/.en files (not for --markdown, --charts)"
    )
    parser.add_argument("--directions", default=",".join(DIRECTIONS), help="comma-separated, from de-en,en-de")
    parser.add_argument("--minutes", type=float, default=45.0, help="wall-clock budget of model.fit per direction")
    parser.add_argument("--average", type=int, default=5, help="newest epoch checkpoints to average")
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="override a value of the direction's config (repeatable), e.g. model.dropout=0.3",
    )
    parser.add_argument(
        "--curve-minutes", type=float, default=5.0,
        help="score a checkpoint about every this many training minutes for the BLEU-minutes chart (0: none)",
    )
    parser.add_argument("--output-dir", default=str(ROOT / "saved_models"), help="where the model directories go")
    parser.add_argument("--results", default=str(machine.RESULTS_DIR / "multi30k.json"), help="JSON to update")
    parser.add_argument("--charts", action="store_true", help="redraw the charts from --results and exit")
    parser.add_argument("--markdown", action="store_true", help="print the run table of --results and exit")
    parser.add_argument(
        "--rescore", action="store_true",
        help="do not train: score the model directories that this command trained before (their "
        f"{TRAINING_FILE}), e.g. after the decoding crashed or was stopped",
    )
    args = parser.parse_args(argv)

    directions = [d for d in args.directions.split(",") if d]
    unknown = sorted(set(directions) - set(DIRECTIONS))
    if unknown:
        parser.error(f"unknown direction(s) {unknown}; expected some of {list(DIRECTIONS)}")
    if not args.minutes > 0:
        parser.error(f"--minutes must be positive; received {args.minutes}")
    if not args.curve_minutes >= 0:
        parser.error(f"--curve-minutes must be >= 0; received {args.curve_minutes}")
    results_path = pathlib.Path(args.results)
    payload = json.loads(results_path.read_text()) if results_path.is_file() else {}
    payload.setdefault("benchmark", "multi30k")
    payload.setdefault("directions", {})
    # Every run is kept in `runs` (the table); `directions` holds the latest run of the
    # recipe as shipped per direction (the bar chart), so a trial with --set does not
    # take the recipe's place there.
    payload.setdefault("runs", list(payload["directions"].values()))
    if args.markdown:
        print(markdown_table(payload["runs"]))
        return
    if args.charts:
        _write_charts(payload, results_path)
        return
    if args.data_dir is None:
        parser.error("expected the Multi30k folder (DATA_DIR) to train on; received none")
    data_dir = pathlib.Path(args.data_dir)
    for split in ("train", "val", "test_2016_flickr"):
        for lang in ("de", "en"):
            if not (data_dir / f"{split}.{lang}").is_file():
                parser.error(f"expected {split}.{lang} in {data_dir}; it is missing")

    for direction in directions:
        entry = (rescore_direction if args.rescore else run_direction)(
            data_dir, direction, args.minutes, args.average, args.set, args.output_dir, args.curve_minutes,
            results_path,
        )
        entry["command"] = "python bench/multi30k.py " + " ".join(argv if argv is not None else sys.argv[1:])
        if args.rescore:
            entry["rescored"] = True  # trained by this command without --rescore, scored by this one
        if not _trial_changes(entry["run_config_overrides"]) or direction not in payload["directions"]:
            payload["directions"][direction] = entry
        payload["runs"].append(entry)
        machine.write_json(results_path, payload)  # after each direction: a later crash keeps it
    _write_charts(payload, results_path)
    print(markdown_table(payload["runs"]))


def _write_charts(payload, results_path):
    """The recipe's bars per direction and the BLEU-against-minutes curves of the best runs."""
    _plot(list(payload["directions"].values()), results_path.with_suffix(".png"))
    _plot_minutes(payload, results_path.with_name(results_path.stem + "_minutes.png"))


def _changes(run):
    """What a run changed from the recipe, as the table and the chart label it."""
    if run.get("recipe_note"):
        return run["recipe_note"]
    return ", ".join(_trial_changes(run["run_config_overrides"])) or "none"


def _trial_changes(overrides):
    """The overrides that change the recipe (verbosity does not)."""
    return [change for change in overrides if not change.startswith("verbose=")]


def markdown_table(runs):
    """The run table: one row per run and weights (last, averaged), every score."""
    lines = [
        "| direction | changes from the recipe | parameters | fit (min) | steps (epochs) "
        "| real target tok/s | last val loss | val BLEU | weights | beam 4: BLEU / lc / chrF | greedy: BLEU / lc / chrF "
        "| the config's search (chosen on val): BLEU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        scores = run["test2016"]
        for weights in ("last", "averaged"):
            beam, greedy = scores[f"{weights}_beam"], scores[f"{weights}_greedy"]
            first = weights == "last"
            val_loss = run["validation_loss"][-1] if run["validation_loss"] else float("nan")
            cells = [
                run["direction"] if first else "",
                _changes(run) if first else "",
                f"{run['parameters'] / 1e6:.1f}M" if first else "",
                f"{run['train_seconds'] / 60:.0f}" if first else "",
                f"{run['steps']:,} ({run['epochs_trained']})" if first else "",
                f"{run['target_tokens_per_second']:,.0f}" if first else "",
                f"{val_loss:.3f}" if first else "",
                f"{run['val']['last_beam']['bleu']:.2f}" if first and "val" in run else "",
                "last" if first else f"average of {len(run['averaged_checkpoints'])}",
                f"{beam['bleu']:.2f} / {beam['bleu_lowercased']:.2f} / {beam['chrf']:.2f}",
                f"{greedy['bleu']:.2f} / {greedy['bleu_lowercased']:.2f} / {greedy['chrf']:.2f}",
                _search_cell(run, scores.get(f"{weights}_search")),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _search_cell(run, scores):
    """The config's own search and its BLEU, for runs that scored one ("" for the others)."""
    if scores is None:
        return ""
    search = run["search"]
    alpha = f"{search['length_penalty']:g}"
    alpha += "" if "." in alpha else ".0"  # "1.0", as the configs write it
    return f"{scores['bleu']:.2f} (beam {search['beam_size']}, α {alpha})"


if __name__ == "__main__":
    main()
