"""Decoding speed and quality of the demo model: greedy against beam 4, cache against none.

Translates the demo corpus' test split (read back from the model directory's
`config.toml`) with a `Translator` per decoding method, on each Keras backend:

- `greedy`: greedy search through the key/value cache (`decoding.greedy_decode`);
- `greedy_uncached`: greedy search that reruns the whole decoder over the prefix at
  every step (`decoding.greedy_decode_uncached`), the no-cache baseline;
- `beam4`: beam search, beam 4, length penalty 0.6 (the paper's, section 6.1), cached.

Each method first translates the sentences once untimed (tracing and compiling every
batch shape), then once timed. It reports sentences/s and output tokens/s (the pieces
of each translation plus its EOS), and BLEU / chrF / exact match of each method on the
test split, so the greedy-vs-beam difference is measured on the same sentences.

Usage (a subprocess per backend: KERAS_BACKEND is fixed when Keras is imported):

    .venv/bin/python bench/decode_demo.py --model-dir saved_models/demo
    .venv/bin/python bench/decode_demo.py --backends tensorflow --limit 200

Writes bench/results/decode_demo.json and decode_demo.png (sentences/s).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402

BACKENDS = ("tensorflow", "jax", "torch")
METHODS = ("greedy", "greedy_uncached", "beam4")


def run_backend(model_dir, methods, limit, batch_size):
    """In a process whose backend is set: time and score each method. Returns a dict."""
    import keras

    from keras_transformer.model import directory as model_directory
    from keras_transformer.inference.compiled import CompiledDecoder
    from keras_transformer.inference.evaluation import score_translations
    from keras_transformer.train.run import load_corpus
    from keras_transformer.train.run_config import RunConfig
    from keras_transformer.inference.translator import Translator
    from keras_transformer.model.directory import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(model_dir)
    run_config = RunConfig.from_toml(os.path.join(model_dir, model_directory.CONFIG_FILE))
    pairs = load_corpus(run_config)["test"][:limit]
    sources = [source for source, _ in pairs]
    references = [reference for _, reference in pairs]
    results = {}
    for method in methods:
        translator = Translator(model, tokenizer, beam_size=4 if method == "beam4" else 1, batch_size=batch_size)
        if method == "greedy_uncached":
            # The Translator's batching and padding, with the no-cache decoder inside.
            translator.decoder = CompiledDecoder(model, "greedy_uncached")
        started = time.perf_counter()
        translator.translate(sources)  # traces and compiles every batch shape
        warmup = time.perf_counter() - started
        started = time.perf_counter()
        translations = translator.translate(sources)
        seconds = time.perf_counter() - started
        tokens = sum(len(ids) + 1 for ids in tokenizer.encode(translations))
        results[method] = {
            "sentences": len(sources),
            "seconds": round(seconds, 3),
            "warmup_seconds": round(warmup, 3),
            "sentences_per_second": round(len(sources) / seconds, 1),
            "tokens_per_second": round(tokens / seconds, 1),
            "output_tokens": tokens,
            **{key: round(value, 4) for key, value in score_translations(translations, references).items()},
        }
        print(f"[{keras.backend.backend()}] {method}: {results[method]}", file=sys.stderr)
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-dir", default="saved_models/demo")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=BACKENDS)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--limit", type=int, default=None, help="first N test pairs (default: all)")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.child:
        print(json.dumps(run_backend(args.model_dir, args.methods, args.limit, args.batch_size)))
        return 0

    info = machine.machine_info()
    results = {}
    for backend in args.backends:
        command = [sys.executable, __file__, "--child", "--model-dir", args.model_dir, "--batch-size",
                   str(args.batch_size), "--methods", *args.methods]
        if args.limit:
            command += ["--limit", str(args.limit)]
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "2"}
        completed = subprocess.run(command, env=env, capture_output=True, text=True)
        sys.stderr.write(completed.stderr[-2000:])
        if completed.returncode != 0:
            results[backend] = {"error": completed.stderr.strip().splitlines()[-1:]}
            continue
        results[backend] = json.loads(completed.stdout.strip().splitlines()[-1])

    payload = {
        "machine": info,
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "model_dir": args.model_dir,
        "batch_size": args.batch_size,
        "limit": args.limit,
        "results": results,
    }
    path = machine.write_json(machine.RESULTS_DIR / "decode_demo.json", payload)
    groups = [backend for backend in args.backends if "error" not in results[backend]]
    machine.grouped_bar_chart(
        machine.RESULTS_DIR / "decode_demo.png",
        "Demo model: translation speed on the test split",
        "sentences / s",
        groups,
        {method: [results[b][method]["sentences_per_second"] for b in groups] for method in args.methods},
        note=f"{info['cpu_model']}, {info['usable_cores']} cores, load {info['load_average_1min']}",
    )
    print(json.dumps(results, indent=2))
    print(f"written {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
