"""`TransformerConfig`: every hyper-parameter of a model, with the paper's defaults.

Defaults are the base model of Vaswani et al., 2017 (Table 3, "base"), each with the
section that gives it. Presets are overrides of these defaults, never a second copy.
"""

import dataclasses
import typing

from keras_transformer.train.losses import LABEL_SMOOTHING
from keras_transformer.train.schedules import WARMUP_STEPS

_POSITION_ENCODINGS = ("sinusoidal", "learned")


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of a Transformer, its training and its decoding.

    Frozen: make variants with `config.replace(**changes)` or
    `TransformerConfig.from_preset(name, **overrides)`. Every field is validated on
    construction; a bad value raises `ValueError` naming the field and the value.

    Example:
    >>> config = TransformerConfig.from_preset("tiny", vocab_size=1000)
    >>> config.d_model
    64
    """

    # Architecture (section 3, Table 3 "base").
    vocab_size: int = 37000  # shared source-target BPE vocabulary for WMT14 en-de (5.1)
    d_model: int = 512  # width of every sub-layer output (3.1)
    num_heads: int = 8  # h = 8 parallel heads of d_k = d_v = d_model / h = 64 (3.2.2)
    d_ff: int = 2048  # inner width of the feed-forward network (3.3)
    num_encoder_layers: int = 6  # N = 6 (3.1)
    num_decoder_layers: int = 6  # N = 6 (3.1)
    dropout: float = 0.1  # P_drop on sub-layer outputs and embedding sums (5.4)
    attention_dropout: float = 0.0  # not in the paper; tensor2tensor later used 0.1
    activation_dropout: float = 0.0  # not in the paper ("relu dropout" in tensor2tensor)
    max_length: int = 256  # longest source or target sequence in tokens, BOS/EOS included
    share_embeddings: bool = True  # one matrix for both embeddings and the softmax (3.4)
    norm_first: bool = False  # the paper is post-norm (5.4); pre-norm is a departure
    position_encoding: str = "sinusoidal"  # "sinusoidal" (3.5) or "learned" (Table 3 E)
    layer_norm_epsilon: float = 1e-6  # not given in the paper; tensor2tensor's value

    # Training (section 5).
    label_smoothing: float = LABEL_SMOOTHING  # epsilon_ls = 0.1 (5.4)
    warmup_steps: int = WARMUP_STEPS  # 4000 (5.3)
    learning_rate_scale: float = 1.0  # multiplies the schedule; 1.0 is the paper's formula
    adam_beta_1: float = 0.9  # (5.3)
    adam_beta_2: float = 0.98  # (5.3)
    adam_epsilon: float = 1e-9  # (5.3)
    clipnorm: typing.Optional[float] = None  # not in the paper; None disables clipping
    tokens_per_batch: int = 25000  # ~25k source + 25k target tokens per batch (5.1)
    dtype_policy: typing.Optional[str] = None  # None: Keras' global policy

    # Decoding (section 6.1).
    beam_size: int = 4  # beam of 4 (6.1)
    length_penalty: float = 0.6  # alpha = 0.6 in ((5 + len) / 6) ** alpha (6.1)
    max_decode_extra: int = 50  # maximum output length = input length + 50 (6.1)

    def __post_init__(self):
        for field in dataclasses.fields(self):
            check_type(field.name, getattr(self, field.name), field.type)
        for name in (
            "vocab_size",
            "d_model",
            "num_heads",
            "d_ff",
            "num_encoder_layers",
            "num_decoder_layers",
            "max_length",
            "warmup_steps",
            "tokens_per_batch",
            "beam_size",
        ):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"`{name}` must be a positive integer. Received: {name}={value!r}")
        if self.max_decode_extra < 0:
            raise ValueError(
                f"`max_decode_extra` must be >= 0. Received: max_decode_extra={self.max_decode_extra!r}"
            )
        for name in ("dropout", "attention_dropout", "activation_dropout", "label_smoothing"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={value!r}")
        for name in ("adam_beta_1", "adam_beta_2"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"`{name}` must be in [0, 1). Received: {name}={value!r}")
        for name in ("adam_epsilon", "layer_norm_epsilon", "learning_rate_scale"):
            value = getattr(self, name)
            if value <= 0:
                raise ValueError(f"`{name}` must be > 0. Received: {name}={value!r}")
        if self.clipnorm is not None and self.clipnorm <= 0:
            raise ValueError(f"`clipnorm` must be > 0 or None. Received: clipnorm={self.clipnorm!r}")
        if self.length_penalty < 0:
            raise ValueError(
                f"`length_penalty` must be >= 0. Received: length_penalty={self.length_penalty!r}"
            )
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                "`d_model` must be divisible by `num_heads`. "
                f"Received: d_model={self.d_model}, num_heads={self.num_heads}"
            )
        if self.position_encoding not in _POSITION_ENCODINGS:
            raise ValueError(
                f"`position_encoding` must be one of {_POSITION_ENCODINGS}. "
                f"Received: position_encoding={self.position_encoding!r}"
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
        """Builds a config from a dict, refusing unknown keys with `ValueError`."""
        if not isinstance(values, dict):
            raise ValueError(f"Expected a dict of config values. Received: {type(values).__name__}")
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
        "warmup_steps": 400,
        "tokens_per_batch": 2048,
    },
}


def _check_known_fields(values):
    known = {field.name for field in dataclasses.fields(TransformerConfig)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ValueError(
            f"Unknown TransformerConfig field(s): {unknown}. Expected some of: {sorted(known)}"
        )


def check_type(name, value, annotation):
    """Strict types: ints are not floats' stand-ins for bools, bools are not ints.

    Shared with `RunConfig`: `annotation` is bool, int, float, str, dict or
    `Optional` of one of them.
    """
    optional = typing.get_origin(annotation) is typing.Union
    if optional:
        if value is None:
            return
        annotation = next(arg for arg in typing.get_args(annotation) if arg is not type(None))
    if annotation is dict:
        ok = isinstance(value, dict)
    elif annotation is bool:
        ok = isinstance(value, bool)
    elif annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif annotation is str:
        ok = isinstance(value, str)
    else:  # pragma: no cover - every field has one of the types above
        ok = True
    if not ok:
        expected = annotation.__name__ + (" or None" if optional else "")
        raise ValueError(
            f"`{name}` must be of type {expected}. Received: {name}={value!r} "
            f"(type {type(value).__name__})"
        )
