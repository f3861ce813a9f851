"""`kt-build-memory`: a translation memory of parallel text, for `--memory` (kNN-MT).

Teacher-forces the model of `--model-dir` over the pairs of `--source` and `--target`
(one sentence per line, line N of one the translation of line N of the other) and writes
its final decoder state at every target token, with the token that followed, to
`--output` (`keras_transformer.inference.memory`). kt-translate and kt-evaluate read it
with the same `--model-dir` and `--memory FILE`.

Example:
    kt-build-memory --model-dir saved_models/demo --source train.en --target train.de --output train.memory.npz
    kt-translate --model-dir saved_models/demo --memory train.memory.npz "on May 29, 2048"
"""

import argparse
import sys

from keras_transformer.cli import common


def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    parser = argparse.ArgumentParser(
        prog="kt-build-memory",
        description="Write a translation memory (kNN-MT) of parallel text: the model's final decoder state "
        "at every target token, and the token that followed.",
    )
    parser.add_argument("--model-dir", required=True, help="the model directory that will read the memory")
    parser.add_argument("--source", required=True, help="source sentences, one per line")
    parser.add_argument("--target", required=True, help="their translations, one per line")
    parser.add_argument("--output", required=True, help="the memory file to write (.npz)")
    parser.add_argument("--batch-size", type=int, default=64, help="pairs a forward pass (default 64)")
    args = parser.parse_args(argv)

    from keras_transformer.inference.evaluation import read_lines
    from keras_transformer.inference.memory import build_translation_memory
    from keras_transformer.model.directory import load_model_and_tokenizer

    try:
        if not args.output.endswith(".npz"):
            raise ValueError(f"--output is written as .npz. Received: {args.output!r}")
        sources, targets = read_lines(args.source), read_lines(args.target)
        model, tokenizer = load_model_and_tokenizer(args.model_dir)
        memory = build_translation_memory(
            model, tokenizer, sources, targets, batch_size=args.batch_size, progress=True
        )
        memory.save(args.output)
    except common.COMMAND_ERRORS as error:
        common.fail(parser, error)
    print(
        f"{len(memory):,} keys of width {memory.keys.shape[1]} from {len(sources) - memory.skipped:,} pairs "
        f"({memory.skipped:,} too long for the model, skipped): {args.output}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
