"""Pretrained translators: Marian / OPUS-MT checkpoints imported into this package.

`import_marian(hf_dir, output_dir)` turns a Hugging Face `MarianMTModel` directory into a
model directory that `Translator`, `evaluate`, `export_saved_model` and `model.fit` use
unchanged (see docs/pretrained.md). Modules:

- `vocabulary`: Marian's token ids mapped onto ours by permuting rows.
- `tokenizer`: `MarianTokenizer`, source.spm / vocab.json / target.spm in Python and TF graphs.
- `checkpoint`: reading the Hugging Face directory; its config as a `TransformerConfig`.
- `weights`: Marian's weight names mapped onto our layers.
- `importer`: `load_marian` and `import_marian`.

TensorFlow is imported with the tokenizer, as for `keras_transformer.data`.
"""

from keras_transformer.marian.importer import import_marian, load_marian
from keras_transformer.marian.tokenizer import MarianTokenizer
from keras_transformer.marian.vocabulary import MarianVocabulary

__all__ = ["import_marian", "load_marian", "MarianTokenizer", "MarianVocabulary"]
