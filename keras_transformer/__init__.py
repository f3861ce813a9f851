"""keras-transformer: the Transformer of "Attention Is All You Need" for Keras 3.

Runs on TensorFlow, JAX and PyTorch (`KERAS_BACKEND`). The model, its layers, the
schedule, loss, metrics and decoding use `keras.ops` only and are imported eagerly;
pieces that are TensorFlow by nature (tokenizer, tf.data pipeline, SavedModel export,
the `Translator` that uses the tokenizer) are imported on first use, so that
`import keras_transformer` stays light on the JAX and PyTorch backends.
"""

import importlib

from keras_transformer import layers
from keras_transformer.config import PRESETS, TransformerConfig
from keras_transformer.model import Transformer, build_transformer
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID

__version__ = "0.1.0"

# name -> module that defines it; imported when first accessed.
_LAZY = {
    "TransformerSchedule": "keras_transformer.schedules",
    "LabelSmoothedCrossEntropy": "keras_transformer.losses",
    "MaskedAccuracy": "keras_transformer.metrics",
    "Perplexity": "keras_transformer.metrics",
    "compile_transformer": "keras_transformer.training",
    "greedy_search": "keras_transformer.decoding",
    "beam_search": "keras_transformer.decoding",
    "greedy_decode": "keras_transformer.decoding",
    "beam_decode": "keras_transformer.decoding",
    "compile_decoder": "keras_transformer.compiled",
    "CompiledDecoder": "keras_transformer.compiled",
    "Translator": "keras_transformer.translator",
    "SubwordTokenizer": "keras_transformer.tokenizer",
    "train_tokenizer": "keras_transformer.tokenizer",
    "export_saved_model": "keras_transformer.export",
    "average_checkpoints": "keras_transformer.checkpoints",
    "distribution_scope": "keras_transformer.distribute",
}


def __getattr__(name):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'keras_transformer' has no attribute {name!r}")


__all__ = [
    "layers",
    "PRESETS",
    "TransformerConfig",
    "Transformer",
    "build_transformer",
    "PAD_ID",
    "UNK_ID",
    "BOS_ID",
    "EOS_ID",
    *_LAZY,
]
