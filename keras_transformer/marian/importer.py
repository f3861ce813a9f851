"""`import_marian`: a Hugging Face Marian / OPUS-MT directory in, a model directory out.

The model directory it writes is like a trained run's (`keras_transformer.model.directory`):
`model.keras`, the tokenizer's files (`source.spm`, `target.spm`, `vocab.json`,
`marian_tokenizer.json` in place of `tokenizer.model`) and `manifest.json`, which names
the tokenizer's kind and fingerprint. So `Translator`, `evaluate`, `export_saved_model`,
the `kt-*` commands and `model.fit` use it unchanged, on any backend.
"""

import os

from keras_transformer.atomic import write_directory_atomically
from keras_transformer.marian import checkpoint
from keras_transformer.marian.tokenizer import MarianTokenizer
from keras_transformer.marian.vocabulary import MarianVocabulary
from keras_transformer.marian.weights import load_marian_weights
from keras_transformer.model import directory as model_directory
from keras_transformer.model.transformer import Transformer


def load_marian(hf_dir):
    """`(Transformer, MarianTokenizer)` of a Hugging Face `MarianMTModel` directory.

    The model computes Marian's logits, its vocabulary rows permuted into our ids (see
    `keras_transformer.marian.vocabulary`), in float32 under the current backend.

    Raises:
        FileNotFoundError: the directory, or one of its files, is missing (named).
        ValueError: the model has something this package cannot represent (named).
        ImportError: the `marian` extra is not installed.
    """
    hf_dir = checkpoint.check_marian_directory(hf_dir)
    marian_config = checkpoint.read_marian_config(hf_dir)
    source_spm, target_spm, pieces, unk_piece = checkpoint.read_tokenizer_files(hf_dir)
    if unk_piece not in pieces:
        raise ValueError(f"{hf_dir}/vocab.json has no unknown-token piece {unk_piece!r}.")
    vocabulary = MarianVocabulary(
        pieces,
        marian_config.vocab_size,
        pad_id=marian_config.pad_token_id,
        eos_id=_single_id(marian_config.eos_token_id, "eos_token_id"),
        unk_id=pieces[unk_piece],
        decoder_start_id=marian_config.decoder_start_token_id,
    )
    config = checkpoint.transformer_config(marian_config, vocabulary.vocab_size)
    tokenizer = MarianTokenizer(source_spm, target_spm, vocabulary, source=hf_dir)
    model = Transformer(config)
    load_marian_weights(model, checkpoint.read_weights(hf_dir), vocabulary)
    return model, tokenizer


def import_marian(hf_dir, output_dir, *, overwrite=False):
    """Writes the model directory of a Hugging Face Marian model; returns `output_dir`.

    Args:
        hf_dir: a directory as `MarianMTModel.save_pretrained` writes it (config.json,
            model.safetensors or pytorch_model.bin, source.spm, target.spm,
            vocab.json, tokenizer_config.json): a downloaded OPUS-MT model.
        output_dir: the model directory to write.
        overwrite: replace an existing `output_dir`.

    Written beside `output_dir` and renamed into place when whole: a crash leaves no
    half-written directory.

    Raises:
        FileNotFoundError: `hf_dir` or one of its files is missing (named).
        FileExistsError: `output_dir` exists and `overwrite` is False.
        ValueError: the model has something this package cannot represent (named).
        ImportError: the `marian` extra is not installed.

    Example:

    ```python
    import_marian("opus-mt-de-en", "saved_models/opus-mt-de-en")
    kt.Translator("saved_models/opus-mt-de-en").translate(["Guten Morgen!"])
    ```
    """
    output_dir = os.fspath(output_dir)
    if os.path.exists(output_dir) and not overwrite:
        raise FileExistsError(
            f"{output_dir} already exists; pass overwrite=True (--overwrite) to replace it."
        )
    model, tokenizer = load_marian(hf_dir)

    def write(directory):
        os.makedirs(directory)
        model.save(os.path.join(directory, model_directory.MODEL_FILE))
        tokenizer.save(directory)
        model_directory.write_manifest(directory, tokenizer)

    write_directory_atomically(output_dir, write, overwrite=overwrite)
    return output_dir


def _single_id(value, name):
    if isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ValueError(f"Expected one {name}. Received: {name}={value!r}")
        value = value[0]
    return value


__all__ = ["import_marian", "load_marian"]
