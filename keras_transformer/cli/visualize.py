"""`kt-visualize`: draw the attention maps of a sentence pair as heat maps in a PNG.

Encoder self-attention, decoder self-attention and cross-attention, one heat map per
layer and head, with the tokens on the axes. Without `--target`, the model's own
(greedy) translation of the source is used.

Example:
    kt-visualize --model-dir saved_models/demo \
        --source "on May 29, 2048" --target "am 29. Mai 2048" --output attention.png
"""

import argparse
import sys

from keras_transformer.cli import common, interrupt


@interrupt.exits_on_interrupt()
def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    parser = argparse.ArgumentParser(
        prog="kt-visualize",
        description="Write the encoder, decoder and cross-attention maps of a sentence "
        "pair, per layer and head, to a PNG.",
    )
    parser.add_argument("--model-dir", required=True, help="directory with model.keras and tokenizer.model")
    parser.add_argument("--source", required=True, help="the source sentence")
    parser.add_argument("--target", help="the target sentence (default: the model's greedy translation)")
    parser.add_argument("--output", default="attention.png", help="PNG to write (default: attention.png)")
    parser.add_argument("--dpi", type=int, default=100, help="resolution (default 100)")
    args = parser.parse_args(argv)

    from keras_transformer.inference.attention_maps import attention_maps, plot_attention_maps
    from keras_transformer.model.directory import load_model_and_tokenizer

    try:
        model, tokenizer = load_model_and_tokenizer(args.model_dir)
        maps = attention_maps(model, tokenizer, args.source, args.target)
    except common.COMMAND_ERRORS as error:
        common.fail(parser, error)
    try:
        path = plot_attention_maps(maps, args.output, dpi=args.dpi)
    except OSError as error:  # an output path that cannot be written
        common.fail(parser, error)
    print(
        f"Attention maps of {len(maps.source_tokens)} source and {len(maps.target_tokens)} "
        f"target tokens written to {path}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
