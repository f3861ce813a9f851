"""`kt-import-marian`: a Hugging Face Marian / OPUS-MT directory in, a model directory out.

The output directory is used as any trained one is: `kt-translate`, `kt-evaluate`,
`kt-export`, `kt.Translator`, `model.fit` (see docs/pretrained.md). Needs the `marian`
extra: `pip install 'keras-transformer[marian]'`.

Example:
    huggingface-cli download Helsinki-NLP/opus-mt-de-en --local-dir opus-mt-de-en
    kt-import-marian --hf-dir opus-mt-de-en --output-dir saved_models/opus-mt-de-en
"""

import argparse
import sys

from keras_transformer.cli import common, interrupt


@interrupt.exits_on_interrupt()
def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    parser = argparse.ArgumentParser(
        prog="kt-import-marian",
        description="Import a Hugging Face MarianMTModel directory (an OPUS-MT model, as "
        "save_pretrained or huggingface-cli download writes it) as a model directory.",
    )
    parser.add_argument("--hf-dir", required=True, help="the Hugging Face model directory (config.json, weights, *.spm, vocab.json)")
    parser.add_argument("--output-dir", required=True, help="the model directory to write")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing output directory")
    args = parser.parse_args(argv)

    from keras_transformer.marian.importer import import_marian

    try:
        path = import_marian(args.hf_dir, args.output_dir, overwrite=args.overwrite)
    except (*common.COMMAND_ERRORS, ImportError) as error:
        common.fail(parser, error)
    print(f"Model directory written to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
