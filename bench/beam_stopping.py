"""When beam search stops a sentence: the exact rule against early stopping, on a trained model.

`Translator` stops a sentence's beam search when no alive hypothesis can still beat its
finished ones (tensor2tensor's rule, `early_stopping=False`), or, with
`early_stopping=True`, also once its most probable extension was EOS and `beam_size`
hypotheses have finished (OpenNMT's and CTranslate2's rule). With a large length penalty
the exact rule keeps long-shot hypotheses alive to the length limit. This translates
Multi30k splits with a trained model directory both ways, and with CTranslate2 (float32,
the same weights; its only rule is the early one) beside them as the peer, and reports per
split: seconds (compilation excluded and reported apart; best of `--rounds` interleaved
rounds), sacreBLEU, how many translations the rule changed, and the decoder loop steps each
rule ran (counted in a separate eager pass on the same batches). Writes JSON and a PNG bar
chart.

Usage:

    .venv/bin/python bench/beam_stopping.py --model-dir saved_models/multi30k_en_de \\
        --data-dir ../shared/data/multi30k
"""

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import machine  # noqa: E402
from keras_transformer.inference import decoding  # noqa: E402
from keras_transformer.inference.evaluation import score_translations  # noqa: E402
from keras_transformer.inference.translator import Translator, pad_batch  # noqa: E402
from keras_transformer.model.directory import CONFIG_FILE  # noqa: E402
from keras_transformer.train.run_config import RunConfig  # noqa: E402

RULES = {"exact": False, "early": True}
SPLIT_FILES = {"val": "val", "test2016": "test_2016_flickr"}


def loop_steps(translator, sources):
    """Decoder steps of each batch of `sources` as `translator` batches them, eagerly counted.

    Eager, so the step function runs once per loop iteration on TensorFlow and PyTorch
    (under `jax.jit` it would be traced once): a count, not a timing.
    """
    model = translator.model
    ids = [row for row in translator._source_ids(sources) if row]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))  # longest first, as `translate`
    calls = [0]
    step = model.decode_step

    def counting(*args, **kwargs):
        calls[0] += 1
        return step(*args, **kwargs)

    model.decode_step = counting
    try:
        steps = []
        for start in range(0, len(order), translator.batch_size):
            batch = [ids[i] for i in order[start : start + translator.batch_size]]
            calls[0] = 0
            decoding.beam_decode(
                model,
                pad_batch(batch, model.config.max_length, translator.batch_size),
                translator.beam_size,
                translator.length_penalty,
                max_extra=translator.max_extra,
                early_stopping=translator.early_stopping,
            )
            steps.append(calls[0])
    finally:
        del model.decode_step  # the instance attribute: the method shows again
    return steps


def timed(translate, sources):
    started = time.perf_counter()
    outputs = translate(sources)
    return outputs, time.perf_counter() - started


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", required=True, help="a trained Multi30k model directory")
    parser.add_argument("--data-dir", default="../shared/data/multi30k", help="Multi30k raw text files")
    parser.add_argument("--splits", default="val,test2016", help=f"comma-separated, from {tuple(SPLIT_FILES)}")
    parser.add_argument("--beam-size", type=int, help="default: the model directory's search")
    parser.add_argument("--length-penalty", type=float, help="default: the model directory's search")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds; the fastest counts")
    parser.add_argument("--no-ctranslate2", action="store_true", help="leave the CTranslate2 peer out")
    parser.add_argument("--no-steps", action="store_true", help="skip the eager count of loop steps")
    parser.add_argument("--output", default=str(BENCH / "results" / "beam_stopping.json"))
    args = parser.parse_args(argv)

    run_config = RunConfig.from_toml(os.path.join(args.model_dir, CONFIG_FILE))
    source_lang, target_lang = run_config.source_lang, run_config.target_lang
    translators = {
        rule: Translator(
            args.model_dir, beam_size=args.beam_size, length_penalty=args.length_penalty, early_stopping=early
        )
        for rule, early in RULES.items()
    }
    search = {"beam_size": translators["exact"].beam_size, "length_penalty": translators["exact"].length_penalty}
    engines = dict(translators)
    if not args.no_ctranslate2:
        from keras_transformer.inference.ctranslate2_translator import CTranslate2Translator

        engines["ctranslate2"] = CTranslate2Translator(args.model_dir, **search, intra_threads=machine.usable_cores())
    print(f"{args.model_dir} ({source_lang}->{target_lang}), beam {search['beam_size']}, alpha {search['length_penalty']}")

    info = machine.machine_info()
    payload = {
        "benchmark": "beam_stopping",
        "model_dir": str(args.model_dir),
        "direction": f"{source_lang}-{target_lang}",
        "search": search,
        "backend": keras.backend.backend(),
        "rounds": args.rounds,
        "splits": {},
        "machine": info,
    }
    results = payload["splits"]
    for split in args.splits.split(","):
        stem = pathlib.Path(args.data_dir) / SPLIT_FILES[split]
        sources = stem.with_suffix("." + source_lang).read_text(encoding="utf-8").splitlines()
        references = stem.with_suffix("." + target_lang).read_text(encoding="utf-8").splitlines()
        part = {"sentences": len(sources), "engines": {}}
        outputs = {}
        for name, engine in engines.items():  # the first pass compiles (XLA) or warms up
            outputs[name], seconds = timed(engine.translate, sources)
            part["engines"][name] = {"first_pass_seconds": round(seconds, 2), "seconds": []}
        for _ in range(args.rounds):
            for name, engine in engines.items():
                again, seconds = timed(engine.translate, sources)
                assert again == outputs[name], f"{name} translated differently on a second pass"
                part["engines"][name]["seconds"].append(round(seconds, 3))
        for name, entry in part["engines"].items():
            entry["best_seconds"] = min(entry["seconds"])
            entry["sentences_per_second"] = round(len(sources) / entry["best_seconds"], 1)
            scores = score_translations(outputs[name], references)
            entry["bleu"], entry["chrf"] = round(scores["bleu"], 2), round(scores["chrf"], 2)
            entry["changed_from_exact"] = sum(a != b for a, b in zip(outputs[name], outputs["exact"]))
        if not args.no_steps:
            for rule, translator in translators.items():
                steps = loop_steps(translator, sources)
                part["engines"][rule]["loop_steps"] = {"total": int(np.sum(steps)), "per_batch": steps}
        results[split] = part
        path = machine.write_json(args.output, payload)  # after each split: a stopped run keeps it
        for name, entry in part["engines"].items():
            steps = entry.get("loop_steps", {}).get("total")
            print(
                f"{split:9s} {name:12s} {entry['best_seconds']:7.2f} s (first pass {entry['first_pass_seconds']:6.2f} s)"
                f"  BLEU {entry['bleu']:.2f}  changed {entry['changed_from_exact']:4d}"
                + (f"  loop steps {steps}" if steps is not None else ""),
                flush=True,
            )

    groups = list(results)
    series = {name: [results[split]["engines"][name]["best_seconds"] for split in groups] for name in engines}
    machine.grouped_bar_chart(
        pathlib.Path(args.output).with_suffix(".png"),
        f"Beam {search['beam_size']}, alpha {search['length_penalty']}: seconds to translate each split "
        "(compilation excluded)",
        "seconds (best round)",
        groups,
        series,
        note=f"{info['cpu_model']}, {info['usable_cores']} cores, {keras.backend.backend()} backend; "
        + "; ".join(
            f"{split} BLEU " + ", ".join(f"{name} {results[split]['engines'][name]['bleu']:.2f}" for name in engines)
            for split in groups
        ),
    )
    print(path)


if __name__ == "__main__":
    main()
