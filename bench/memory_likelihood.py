"""A translation memory's settings (kNN-MT) read by the likelihood of Multi30k's `val`.

For each setting of the grid, teacher-forces the model over `val`'s references through
`MemoryModel.decode`, the mixture the searches read, and reports the mean negative
log-likelihood of a reference token (EOS included) and its perplexity. A setting costs
one forward pass and one key search over `val`, under a minute on 2 cores, where
decoding `val` with it takes several (bench/memory_settings.py): the likelihood ranks a
wide grid, and BLEU then decides among its best few. A weight of 0 is the model alone.

Usage:

    .venv/bin/python bench/memory_likelihood.py ../shared/data/multi30k \\
        --model-dir saved_models/multi30k_en_de --direction en-de \\
        --settings 16,30,0 --settings 16,30,0.7,scale=400 --settings 32,30,0.7,scale=400 \\
        --memory /tmp/en_de_train.memory.npz

Settings are written as in bench/memory_settings.py (`K,T,WEIGHT[,scale=S]`; `pairs`
and `alpha` belong to decoding and are refused). Adds each setting's row to
`bench/results/memory_likelihood.json` (one entry per model directory) as it is scored
and prints the grid as a markdown table, best first.
"""

import math
import os
import pathlib
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402
from bench.memory_settings import add_row, memory_grid_parser, parse_setting  # noqa: E402
from bench.search_settings import read_split  # noqa: E402


def reference_nll(decoding_model, tokenizer, sources, references, batch_size=16):
    """`(mean negative log-likelihood per reference token, tokens, pairs skipped)`.

    Teacher-forced in batches of similar length; EOS counts as a token. `decoding_model`
    is a `MemoryModel` (or anything with its `encode` and `decode`: log-probabilities
    `[B, T, V]`). Pairs longer than the model's `max_length` are skipped, as the
    memory's build skips them.
    """
    import numpy as np
    from keras import ops

    from keras_transformer.inference.memory import teacher_forced_batches

    fits, batches = teacher_forced_batches(
        tokenizer, sources, references, decoding_model.config.max_length, batch_size
    )
    total, tokens = 0.0, 0
    for _, encoder_inputs, decoder_inputs, next_tokens in batches:
        encoder_outputs, padding_mask = decoding_model.encode(ops.convert_to_tensor(encoder_inputs))
        log_probs = decoding_model.decode(ops.convert_to_tensor(decoder_inputs), encoder_outputs, padding_mask)
        gold = np.take_along_axis(ops.convert_to_numpy(log_probs), next_tokens[..., None], axis=-1)[..., 0]
        real = next_tokens != 0
        total -= float(gold[real].astype(np.float64).sum())
        tokens += int(real.sum())
    return total / tokens, tokens, len(sources) - len(fits)


def main(argv=None):
    parser = memory_grid_parser(__doc__.split("\n\n")[0], "K,T,WEIGHT[,scale=S]")
    parser.add_argument("--batch-size", type=int, default=16,
                        help="val pairs a pass: each of their tokens scores every key, [rows, keys] float32")
    parser.add_argument("--results", default=str(machine.RESULTS_DIR / "memory_likelihood.json"))
    args = parser.parse_args(argv)
    settings = [parse_setting(text) for text in args.settings]
    for setting in settings:
        if setting["pairs"] is not None or setting["alpha"] is not None:
            raise SystemExit(
                "pairs= and alpha= are decoding settings (bench/memory_settings.py); the likelihood reads "
                f"every key of the reference. Received: {setting}"
            )

    from keras_transformer.inference.memory import MemoryModel, TranslationMemory, build_translation_memory
    from keras_transformer.model.directory import load_model_and_tokenizer

    data_dir = pathlib.Path(args.data_dir)
    source_lang, target_lang = args.direction.split("-")
    model, tokenizer = load_model_and_tokenizer(args.model_dir)
    if args.memory and os.path.isfile(args.memory):
        memory = TranslationMemory.load(args.memory)
    else:
        train_sources, train_targets = read_split(data_dir, "train", source_lang, target_lang)
        memory = build_translation_memory(model, tokenizer, train_sources, train_targets, progress=True)
        if args.memory:
            memory.save(args.memory)
    print(repr(memory), flush=True)
    val_sources, val_references = read_split(data_dir, "val", source_lang, target_lang)
    info = {"direction": args.direction, "memory_keys": len(memory), "machine": machine.machine_info()}
    for setting in settings:
        started = time.monotonic()
        decoding_model = MemoryModel(model, memory, neighbors=setting["neighbors"],
                                     temperature=setting["temperature"], weight=setting["weight"],
                                     distance_scale=setting["scale"])
        nll, tokens, skipped = reference_nll(decoding_model, tokenizer, val_sources, val_references,
                                             args.batch_size)
        row = {
            "neighbors": setting["neighbors"], "temperature": setting["temperature"],
            "weight": setting["weight"], "scale": setting["scale"],
            "nll": round(nll, 4), "perplexity": round(math.exp(nll), 3), "tokens": tokens, "skipped": skipped,
            "seconds": round(time.monotonic() - started, 1),
        }
        print(f"val k {row['neighbors']} T {row['temperature']:g} weight {row['weight']:g} "
              f"scale {row['scale'] or '-'}: NLL {nll:.4f} ({row['seconds']:.0f} s)", flush=True)
        entry = add_row(args.results, args.model_dir, info, row, benchmark="memory_likelihood")
    print("| k | T | weight | distance scale | val NLL a token | perplexity |\n|---|---|---|---|---|---|")
    for row in sorted(entry["val_grid"], key=lambda row: row["nll"]):
        print(f"| {row['neighbors']} | {row['temperature']:g} | {row['weight']:g} | {row.get('scale') or '-'} "
              f"| {row['nll']:.4f} | {row['perplexity']:.3f} |")


if __name__ == "__main__":
    main()
