"""Backend-agnostic Transformer layers (keras and keras.ops only)."""

from keras_transformer.layers import masks
from keras_transformer.layers.attention import MultiHeadAttention
from keras_transformer.layers.decoder import DecoderBlock
from keras_transformer.layers.embedding import (
    FixedPositionEmbedding,
    LearnedPositionEmbedding,
    SinusoidalPositionEncoding,
    TokenEmbedding,
    sinusoidal_table,
)
from keras_transformer.layers.encoder import EncoderBlock
from keras_transformer.layers.feed_forward import PositionwiseFeedForward
from keras_transformer.layers.residual import ResidualBlock
from keras_transformer.layers.scale_norm import ScaleNorm
from keras_transformer.layers.word_dropout import WordDropout

__all__ = [
    "masks",
    "MultiHeadAttention",
    "PositionwiseFeedForward",
    "TokenEmbedding",
    "SinusoidalPositionEncoding",
    "LearnedPositionEmbedding",
    "FixedPositionEmbedding",
    "sinusoidal_table",
    "ResidualBlock",
    "ScaleNorm",
    "EncoderBlock",
    "DecoderBlock",
    "WordDropout",
]
