"""`python -m training.translate`: the `kt-translate` command (see keras_transformer/cli/translate.py)."""

import sys

from keras_transformer.cli.translate import main

if __name__ == "__main__":
    sys.exit(main())
