"""`python -m training.import_marian`: the `kt-import-marian` command (see keras_transformer/cli/import_marian.py)."""

import sys

from keras_transformer.cli.import_marian import main

if __name__ == "__main__":
    sys.exit(main())
