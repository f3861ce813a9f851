"""The model: its config (architecture only) and the functional Transformer built from it."""

from keras_transformer.model.config import PRESETS, TransformerConfig
from keras_transformer.model.transformer import Transformer, build_transformer

__all__ = ["PRESETS", "TransformerConfig", "Transformer", "build_transformer"]
