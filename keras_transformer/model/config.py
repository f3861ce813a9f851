"""`TransformerConfig`: the architecture of a model, with the paper's defaults.

It holds what rebuilds the weights and the forward pass, nothing else: the optimizer,
schedule and loss live in `keras_transformer.train.config.TrainingConfig`, batching in
the run config, decoding settings in the `Translator`'s arguments. Defaults are the base
model of Vaswani et al., 2017 (Table 3, "base"), each with the section that gives it.
Presets are overrides of these defaults, never a second copy.
"""

import dataclasses
import typing

from keras_transformer import checks
from keras_transformer.layers.residual import NORMALIZATIONS

# "fixed": a table held as non-trainable weights, for checkpoints whose position
# encodings differ from the paper's (Marian's sinusoids put every sine before every cosine).
_POSITION_ENCODINGS = ("sinusoidal", "learned", "fixed")
# FFN activations: the paper's ReLU (3.3), and the two that pretrained models use
# (GELU, and swish = SiLU in Marian / OPUS-MT); each a name `keras.activations` knows.
_ACTIVATIONS = ("relu", "gelu", "swish")

# Fields that configs of version 0.1 carried besides the architecture (training and
# decoding settings). `from_dict` drops them, so `model.keras` files written by 0.1 load.
LEGACY_FIELDS = frozenset(
    {
        "label_smoothing",
        "warmup_steps",
        "learning_rate_scale",
        "adam_beta_1",
        "adam_beta_2",
        "adam_epsilon",
        "clipnorm",
        "tokens_per_batch",
        "beam_size",
        "length_penalty",
        "max_decode_extra",
    }
)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """The architecture of a Transformer: what its weights and forward pass depend on.

    Frozen: make variants with `config.replace(**changes)` or
    `TransformerConfig.from_preset(name, **overrides)`. Every field is validated on
    construction; a bad value raises `ValueError` naming the field and the value.

    Example:
    >>> config = TransformerConfig.from_preset("tiny", vocab_size=1000)
    >>> config.d_model
    64
    """

    vocab_size: int = 37000  # shared source-target BPE vocabulary for WMT14 en-de (5.1)
    d_model: int = 512  # width of every sub-layer output (3.1)
    num_heads: int = 8  # h = 8 parallel heads of d_k = d_v = d_model / h = 64 (3.2.2)
    d_ff: int = 2048  # inner width of the feed-forward network (3.3)
    num_encoder_layers: int = 6  # N = 6 (3.1)
    num_decoder_layers: int = 6  # N = 6 (3.1)
    dropout: float = 0.1  # P_drop on sub-layer outputs and embedding sums (5.4)
    attention_dropout: float = 0.0  # not in the paper; tensor2tensor later used 0.1
    activation_dropout: float = 0.0  # not in the paper ("relu dropout" in tensor2tensor)
    source_word_dropout: float = 0.0  # not in the paper: whole source token embeddings (Marian)
    target_word_dropout: float = 0.0  # not in the paper: whole decoder-input token embeddings
    max_length: int = 256  # longest source or target sequence in tokens, BOS/EOS included
    share_embeddings: bool = True  # one matrix for both embeddings and the softmax (3.4)
    norm_first: bool = False  # the paper is post-norm (5.4); pre-norm is a departure
    position_encoding: str = "sinusoidal"  # "sinusoidal" (3.5) or "learned" (Table 3 E)
    layer_norm_epsilon: float = 1e-6  # not given in the paper; tensor2tensor's value
    normalization: str = "layer"  # the paper's LayerNorm (5.4); "scale": ScaleNorm (Nguyen and Salazar, 2019)
    fix_norm: bool = False  # not in the paper: embedding rows used at unit length (FixNorm)
    activation: str = "relu"  # the FFN's max(0, .) (3.3); "gelu" or "swish" for other models
    gated_ffn: bool = False  # not in the paper: the FFN's activations gated (GLU variants, Shazeer 2020)
    scale_embeddings: bool = True  # embeddings times sqrt(d_model) (3.4); some checkpoints don't
    output_bias: bool = False  # a bias on the tied pre-softmax projection: not in the paper
    dtype_policy: typing.Optional[str] = None  # None: Keras' global policy

    def __post_init__(self):
        checks.check_dataclass_fields(self)
        for name in (
            "vocab_size",
            "d_model",
            "num_heads",
            "d_ff",
            "num_encoder_layers",
            "num_decoder_layers",
            "max_length",
        ):
            checks.check_positive_int(name, getattr(self, name))
        for name in (
            "dropout",
            "attention_dropout",
            "activation_dropout",
            "source_word_dropout",
            "target_word_dropout",
        ):
            checks.check_rate(name, getattr(self, name))
        checks.check_positive_number("layer_norm_epsilon", self.layer_norm_epsilon)
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                "`d_model` must be divisible by `num_heads`. "
                f"Received: d_model={self.d_model}, num_heads={self.num_heads}"
            )
        checks.check_choice("position_encoding", self.position_encoding, _POSITION_ENCODINGS)
        checks.check_choice("activation", self.activation, _ACTIVATIONS)
        checks.check_choice("normalization", self.normalization, NORMALIZATIONS)
        if self.output_bias and not self.share_embeddings:
            raise ValueError(
                "`output_bias` adds a bias to the tied pre-softmax projection; with "
                "share_embeddings=False the untied `output_projection` has its own bias. "
                "Received: output_bias=True, share_embeddings=False"
            )

    @property
    def head_dim(self):
        """d_k = d_v = d_model / num_heads (3.2.2)."""
        return self.d_model // self.num_heads

    def replace(self, **changes):
        """A copy with `changes` applied and validated; unknown names raise `ValueError`."""
        _check_known_fields(changes)
        return dataclasses.replace(self, **changes)

    def to_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values):
        """Builds a config from a dict, refusing unknown keys with `ValueError`.

        The training and decoding fields of 0.1 configs (`LEGACY_FIELDS`) are dropped,
        so models saved by 0.1 load; they never changed the weights or the forward pass.
        """
        if not isinstance(values, dict):
            raise ValueError(f"Expected a dict of config values. Received: {type(values).__name__}")
        values = {key: value for key, value in values.items() if key not in LEGACY_FIELDS}
        _check_known_fields(values)
        return cls(**values)

    @classmethod
    def from_preset(cls, name, **overrides):
        """A named preset ("tiny", "small", "base", "big") with `overrides` applied."""
        if name not in PRESETS:
            raise ValueError(f"Unknown preset {name!r}. Expected one of {sorted(PRESETS)}.")
        _check_known_fields(overrides)
        return cls(**{**PRESETS[name], **overrides})


# Overrides of the (base) defaults above.
PRESETS = {
    # The paper's base model (Table 3): the defaults, about 63M parameters at 37k vocab.
    "base": {},
    # The paper's big model (Table 3): d_model 1024, d_ff 4096, 16 heads, P_drop 0.3.
    "big": {"d_model": 1024, "d_ff": 4096, "num_heads": 16, "dropout": 0.3},
    # A model for small corpora (Multi30k-sized) and benchmarks on a CPU.
    "small": {
        "vocab_size": 8000,
        "d_model": 256,
        "d_ff": 1024,
        "num_heads": 8,
        "num_encoder_layers": 3,
        "num_decoder_layers": 3,
    },
    # Seconds to train on a CPU: smoke runs, the demo, and tests shrink this further.
    "tiny": {
        "vocab_size": 1000,
        "d_model": 64,
        "d_ff": 256,
        "num_heads": 4,
        "num_encoder_layers": 2,
        "num_decoder_layers": 2,
        "max_length": 64,
    },
}


def _check_known_fields(values):
    unknown = set(values) & LEGACY_FIELDS
    if unknown:
        raise ValueError(
            f"{sorted(unknown)} are not architecture settings: the optimizer, schedule and "
            "loss are set in TrainingConfig (the run config's [training] table), batching "
            "in the run config, decoding in the Translator's arguments."
        )
    checks.check_known_keys("TransformerConfig field", values, TransformerConfig)


__all__ = ["TransformerConfig", "PRESETS", "LEGACY_FIELDS"]
