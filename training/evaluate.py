"""`python -m training.evaluate`: the `kt-evaluate` command (see keras_transformer/cli/evaluate.py)."""

import sys

from keras_transformer.cli.evaluate import main

if __name__ == "__main__":
    sys.exit(main())
