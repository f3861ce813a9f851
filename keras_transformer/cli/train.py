"""`kt-train`: train a Transformer from a TOML run config.

Example:
    kt-train --config training/configs/multi30k.toml \
        --set max_train_seconds=300 --set model.d_model=128
"""

import argparse
import sys

from keras_transformer.cli import common, interrupt


@interrupt.exits_on_interrupt(interrupt.RESUMABLE)
def main(argv=None):
    common.setup_environment()  # before anything imports TensorFlow
    parser = argparse.ArgumentParser(
        prog="kt-train",
        description="Train a Transformer as described by a TOML run config; writes the "
        "model, tokenizer, config, CSV/TensorBoard logs and a training-curve PNG into "
        "<output_dir>/<name>/, whole when the run ends (until then it is written in "
        "<output_dir>/.<name>.staging/). A killed run started again resumes where it "
        "stopped; a finished one is replaced only with --set overwrite=true.",
    )
    common.add_config_arguments(parser)
    args = parser.parse_args(argv)
    config = common.read_run_config(parser, args)

    from keras_transformer.train.run import run_training

    try:
        run_training(config)  # prints where it writes, and what it trained
    except common.TRAINING_ERRORS as error:  # a finished run in the way, a bad corpus, ...
        common.fail(parser, error)
    return 0


if __name__ == "__main__":
    sys.exit(main())
