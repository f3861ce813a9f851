"""Decoding steps with one query position: attention as reductions against a batched matmul.

A decoding step attends with one query per head over the key/value cache.
`MultiHeadAttention` computes that as products summed over the head width and then over
the keys (`layers.attention.single_query_attention`), reading the cache once in the
`[B, S, N, H]` layout it is stored in. The alternative, run side by side here, is the
path every longer query takes: `keras.ops.dot_product_attention`, a batched matmul that
wants `[B, N, S, H]` (on XLA's CPU backend the whole cache is copied into that layout,
per layer, per step).

For each path it decodes one fixed batch (random source ids, seed 0) with a model of a
run config's shape (random weights, seed 0) for exactly `--length` steps
(`max_length=L`: random weights practically never end every sentence early), compiled as
users decode (`compiled.CompiledDecoder`), with beam 4 (alpha 0.6) and greedy search. It
checks that both paths give the same tokens, then times `--rounds` interleaved rounds
(the fastest counts; the first call, tracing and compiling, is reported apart). With
`--model-dir`, it also translates a Multi30k split with `Translator` (the model
directory's own search) under both paths (a first pass that compiles, then
`--task-rounds` timed ones) and counts the translations that differ.

Writes JSON (one entry per backend; a child process per backend) and a PNG bar chart.

Usage:

    .venv/bin/python bench/decode_attention.py
    .venv/bin/python bench/decode_attention.py --backends tensorflow \\
        --model-dir saved_models/multi30k_en_de --data-dir ../shared/data/multi30k
"""

import argparse
import contextlib
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(BENCH.parent))
sys.path.insert(0, str(BENCH))

import machine  # noqa: E402

BACKENDS = ("tensorflow", "jax", "torch")
PATHS = ("reduce", "matmul")  # the package's single-query path, and the batched matmul
SPLIT_FILES = {"val": "val", "test2016": "test_2016_flickr"}


@contextlib.contextmanager
def attention_path(name):
    """Runs the block with single-query attention computed by `name` (see `PATHS`)."""
    from keras_transformer.layers import attention

    shipped = attention.single_query_attention
    # "matmul": the batched matmul that every longer query takes.
    attention.single_query_attention = shipped if name == "reduce" else attention.fused_attention
    try:
        yield
    finally:
        attention.single_query_attention = shipped


def run_backend(args):
    """Times both paths on this process' backend; a JSON-ready dict."""
    import keras
    import numpy as np

    from keras_transformer.inference.compiled import CompiledDecoder
    from keras_transformer.model.transformer import build_transformer
    from keras_transformer.train.run_config import RunConfig

    run_config = RunConfig.from_toml(args.config)
    config = run_config.model_config(run_config.vocab_size)
    keras.utils.set_random_seed(0)
    model = build_transformer(config)
    rng = np.random.default_rng(0)
    sources = rng.integers(4, config.vocab_size, size=(args.batch, args.source_length)).astype("int32")
    decoders = {
        "beam4": {"method": "beam", "beam_size": 4, "alpha": 0.6},
        "greedy": {"method": "greedy"},
    }
    result = {"config": args.config, "batch": args.batch, "source_length": args.source_length}
    result["length"] = args.length
    result["decoders"] = {}
    for decoder_name, settings in decoders.items():
        settings = dict(settings)
        method = settings.pop("method")
        compiled, entry = {}, {"first_call_seconds": {}, "seconds": {path: [] for path in PATHS}}
        outputs = {}
        for path in PATHS:
            with attention_path(path):
                compiled[path] = CompiledDecoder(model, method, max_length=args.length, **settings)
                started = time.perf_counter()
                outputs[path] = keras.ops.convert_to_numpy(compiled[path](sources)[0])
                entry["first_call_seconds"][path] = round(time.perf_counter() - started, 2)
        entry["same_tokens"] = bool(np.array_equal(outputs["reduce"], outputs["matmul"]))
        entry["longest_output"] = int((outputs["reduce"] != 0).sum(axis=1).max())
        for _ in range(args.rounds):
            for path in PATHS:
                with attention_path(path):
                    started = time.perf_counter()
                    keras.ops.convert_to_numpy(compiled[path](sources)[0])
                    entry["seconds"][path].append(round(time.perf_counter() - started, 4))
        best = {path: min(entry["seconds"][path]) for path in PATHS}
        entry["best_seconds"] = best
        entry["milliseconds_per_step"] = {path: round(1000 * best[path] / args.length, 2) for path in PATHS}
        entry["matmul_over_reduce"] = round(best["matmul"] / best["reduce"], 3)
        result["decoders"][decoder_name] = entry
        print(
            f"{keras.backend.backend():10s} {decoder_name:6s} reduce {best['reduce']:.3f} s, "
            f"matmul {best['matmul']:.3f} s: {entry['matmul_over_reduce']:.2f}x; "
            f"same tokens {entry['same_tokens']}",
            flush=True,
        )
    if args.model_dir:
        result["translation"] = translate_split(args)
    result["machine"] = machine.machine_info()
    return result


def translate_split(args):
    """Seconds to translate a Multi30k split with `Translator` on each path, and what changed."""
    from keras_transformer.inference.evaluation import score_translations
    from keras_transformer.inference.translator import Translator
    from keras_transformer.model.directory import CONFIG_FILE
    from keras_transformer.train.run_config import RunConfig

    run_config = RunConfig.from_toml(os.path.join(args.model_dir, CONFIG_FILE))
    stem = pathlib.Path(args.data_dir) / SPLIT_FILES[args.split]
    sources = stem.with_suffix("." + run_config.source_lang).read_text(encoding="utf-8").splitlines()
    references = stem.with_suffix("." + run_config.target_lang).read_text(encoding="utf-8").splitlines()
    entry = {"model_dir": args.model_dir, "split": args.split, "sentences": len(sources), "paths": {}}
    translators, outputs = {}, {}
    for path in PATHS:
        with attention_path(path):
            translators[path] = Translator(args.model_dir)
            started = time.perf_counter()
            outputs[path] = translators[path].translate(sources)
            entry["paths"][path] = {"first_pass_seconds": round(time.perf_counter() - started, 2), "seconds": []}
    for _ in range(args.task_rounds):
        for path in PATHS:
            with attention_path(path):
                started = time.perf_counter()
                translators[path].translate(sources)
                entry["paths"][path]["seconds"].append(round(time.perf_counter() - started, 2))
    for path in PATHS:
        part = entry["paths"][path]
        part["best_seconds"] = min(part["seconds"])
        part["bleu"] = round(score_translations(outputs[path], references)["bleu"], 2)
    entry["search"] = {"beam_size": translators["reduce"].beam_size, "length_penalty": translators["reduce"].length_penalty}
    entry["translations_changed"] = sum(a != b for a, b in zip(outputs["reduce"], outputs["matmul"]))
    entry["matmul_over_reduce"] = round(
        entry["paths"]["matmul"]["best_seconds"] / entry["paths"]["reduce"]["best_seconds"], 3
    )
    print(
        f"{args.split}: reduce {entry['paths']['reduce']['best_seconds']} s, matmul "
        f"{entry['paths']['matmul']['best_seconds']} s ({entry['matmul_over_reduce']:.2f}x); "
        f"{entry['translations_changed']} of {len(sources)} translations differ",
        flush=True,
    )
    return entry


def chart(path, payload):
    groups, series = [], {path_name: [] for path_name in PATHS}
    for backend, part in payload["backends"].items():
        for decoder_name, entry in part["decoders"].items():
            groups.append(f"{decoder_name} / {backend}")
            for path_name in PATHS:
                series[path_name].append(entry["milliseconds_per_step"][path_name])
    info = next(iter(payload["backends"].values()))["machine"]
    machine.grouped_bar_chart(
        path,
        f"Decoding step, batch {payload['batch']} x beams, {payload['length']} cache positions: "
        "attention as reductions vs batched matmul",
        "milliseconds per step (best round)",
        groups,
        {"reductions (shipped)" if name == "reduce" else "batched matmul": values for name, values in series.items()},
        note=f"{info['cpu_model']}, {info['usable_cores']} cores; model of {payload['config']}, random weights",
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backends", default=",".join(BACKENDS), help="comma-separated Keras backends")
    parser.add_argument("--config", default="training/configs/multi30k_en_de.toml", help="the model's shape")
    parser.add_argument("--batch", type=int, default=64, help="sentences decoded together")
    parser.add_argument("--source-length", type=int, default=16)
    parser.add_argument("--length", type=int, default=63, help="decoding steps (max_length)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds; the fastest counts")
    parser.add_argument("--model-dir", help="also translate a Multi30k split with this trained model")
    parser.add_argument("--data-dir", default="../shared/data/multi30k")
    parser.add_argument("--split", default="val", choices=tuple(SPLIT_FILES))
    parser.add_argument("--task-rounds", type=int, default=1, help="timed passes over the split per path")
    parser.add_argument("--output", default=str(BENCH / "results" / "decode_attention.json"))
    parser.add_argument("--part-output", help=argparse.SUPPRESS)  # set by run_per_backend
    args = parser.parse_args(argv)
    backends = [b for b in args.backends.split(",") if b]
    if args.part_output:  # a child: one backend
        machine.write_json(args.part_output, run_backend(args))
        return
    unknown = sorted(set(backends) - set(BACKENDS))
    if unknown:
        parser.error(f"unknown backend(s) {unknown}; expected some of {BACKENDS}")
    forwarded = [
        "--config", args.config, "--batch", str(args.batch), "--source-length", str(args.source_length),
        "--length", str(args.length), "--rounds", str(args.rounds), "--data-dir", args.data_dir,
        "--split", args.split, "--task-rounds", str(args.task_rounds),
    ]  # fmt: skip
    if args.model_dir:
        forwarded += ["--model-dir", args.model_dir]
    parts, failures = machine.run_per_backend(pathlib.Path(__file__), backends, forwarded)
    payload = {
        "benchmark": "decode_attention",
        "command": "python bench/decode_attention.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "config": args.config,
        "batch": args.batch,
        "length": args.length,
        "backends": parts,
        "failed_backends": failures,
    }
    path = machine.write_json(args.output, payload)
    if parts:
        chart(pathlib.Path(args.output).with_suffix(".png"), payload)
    print(path)
    if failures:
        sys.exit(1)


if __name__ == "__main__":
    main()
