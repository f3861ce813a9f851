"""`python -m training.train`: the `kt-train` command (see keras_transformer/cli/train.py)."""

import sys

from keras_transformer.cli.train import main

if __name__ == "__main__":
    sys.exit(main())
