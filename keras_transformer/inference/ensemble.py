"""Ensemble decoding: several models searched as one model.

Every MT toolkit decodes with an ensemble (fairseq's `EnsembleModel`, Marian's
`--models`, OpenNMT's `-model a.pt b.pt`): at each step the members' next-token
distributions are combined, and the search (greedy, beam, sampling, prefixes, n-best)
runs over the combination. Members must share one vocabulary (the same tokenizer);
they may differ in everything else (width, depth, heads, training run).

`Ensemble` offers what the searches of `inference.decoding` call on a `Transformer`
(`config`, `encode`, `initial_cache`, `decode_step`, `decode`, `variables`), each
taking and returning one entry per member, so `beam_decode(ensemble, ...)`,
`CompiledDecoder(ensemble)` and `Translator(ensemble, tokenizer=...)` run it as they
run one model, compiled the same way on each backend. Its search state is the tuple of
the members' key/value caches.

Two ways to combine, per step, with weights w_i summing to 1:

- `"probs"` (the default; fairseq's): the mean of the members' probabilities,
  log p(y) = log sum_i w_i p_i(y). A proper distribution, so scores stay
  log-probabilities.
- `"log_probs"` (OpenNMT-py's, Marian's): the mean of their log-probabilities,
  renormalised by the search (a product of experts): log p(y) = sum_i w_i log p_i(y) -
  log Z.

`load_ensemble` loads model directories. (An ensemble of one run's last checkpoints
tied with their average, `kt-average-checkpoints`, at 4.6x the decoding time on
Multi30k, so 0.4 removed it: average them.)
"""

import math
import os

import keras
from keras import ops

from keras_transformer import checks

COMBINE_METHODS = ("probs", "log_probs")


class Ensemble:
    """Transformers sharing one vocabulary, decoded as one model.

    Pass it wherever the searches take a model: `decoding.beam_decode`,
    `decoding.greedy_decode`, `sampling.sample_decode`, `CompiledDecoder`, or
    `Translator(ensemble, tokenizer=...)`. It is a decoding object, not a Keras model:
    it has no weights of its own, is not saved (save or export its members), and
    `export_saved_model` refuses it (average the checkpoints into one model to serve:
    `kt-average-checkpoints`).

    Args:
        models: a list of `keras_transformer.Transformer`s with the same
            `config.vocab_size` (one member decodes exactly as that model alone).
        weights: optional list of positive numbers, one per model: each member's
            share of the combination, normalised to sum to 1. Default: equal shares.
        combine: "probs" (default: the weighted mean of the members' probabilities)
            or "log_probs" (the weighted mean of their log-probabilities, renormalised).

    Attributes:
        models: tuple of the members.
        weights: tuple of floats summing to 1.
        combine: str.
        config: the first member's `TransformerConfig` with the smallest `max_length`
            of all members: what the searches read (`vocab_size`, `max_length`).

    Raises:
        TypeError: a member that is not a `Transformer`.
        ValueError: no members, vocabularies of different sizes, weights that are not
            one positive number per member, or an unknown `combine`.

    Example:

    ```python
    ensemble = Ensemble([model_a, model_b])
    tokens, scores = beam_decode(ensemble, keras.ops.array([[5, 6, 7, 3]]))
    ```
    """

    def __init__(self, models, weights=None, combine="probs"):
        from keras_transformer.model.transformer import Transformer

        models = tuple(
            _non_empty_list(
                "models",
                models,
                "a list of keras_transformer.Transformer models (load_ensemble loads model directories)",
                "at least one Transformer",
            )
        )
        for index, model in enumerate(models):
            if not isinstance(model, Transformer):
                raise TypeError(
                    f"Every member of an Ensemble must be a keras_transformer.Transformer. "
                    f"Received: models[{index}] of type {type(model).__name__}"
                )
        sizes = [model.config.vocab_size for model in models]
        if len(set(sizes)) > 1:
            raise ValueError(
                "The members of an Ensemble must share one vocabulary (one tokenizer): their "
                f"next-token distributions are combined id by id. Received: vocab_size {sizes}"
            )
        checks.check_choice("combine", combine, COMBINE_METHODS)
        self.models = models
        self.weights = _normalised_weights(weights, len(models))
        self.combine = combine
        shortest = min(model.config.max_length for model in models)
        self.config = models[0].config.replace(max_length=shortest)

    def __len__(self):
        return len(self.models)

    def __repr__(self):
        weights = ", ".join(f"{weight:.3g}" for weight in self.weights)
        return f"Ensemble({len(self.models)} models, weights=({weights}), combine={self.combine!r})"

    @property
    def variables(self):
        """Every member's variables, member after member (what a compiled search reads)."""
        return [variable for model in self.models for variable in model.variables]

    # ------------------------------------------------- the searches' model interface
    def encode(self, encoder_inputs, training=False):
        """Each member's encoder: `(tuple of outputs [B, S, D_i], padding_mask [B, S])`.

        The padding mask depends on the input alone, so it is computed once.
        """
        results = [model.encode(encoder_inputs, training=training) for model in self.models]
        return tuple(outputs for outputs, _ in results), results[0][1]

    def initial_cache(self, encoder_outputs, max_target_length):
        """`(self_caches, cross_caches)`: tuples of each member's, as `Transformer.initial_cache`."""
        caches = [
            model.initial_cache(outputs, max_target_length)
            for model, outputs in zip(self.models, encoder_outputs)
        ]
        return tuple(own for own, _ in caches), tuple(cross for _, cross in caches)

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_padding_mask):
        """One step of every member: `(combined log-probabilities [B, V], self_caches)`."""
        log_probs, new_caches = [], []
        for model, own, cross in zip(self.models, self_caches, cross_caches):
            logits, own = model.decode_step(token_ids, index, own, cross, encoder_padding_mask)
            log_probs.append(ops.log_softmax(ops.cast(logits, "float32"), axis=-1))
            new_caches.append(own)
        return self.combine_log_probs(log_probs), tuple(new_caches)

    def decode(self, decoder_inputs, encoder_outputs, encoder_padding_mask, training=False):
        """Teacher-forced pass of every member: combined log-probabilities `[B, T, V]`."""
        log_probs = [
            ops.log_softmax(
                ops.cast(model.decode(decoder_inputs, outputs, encoder_padding_mask, training=training), "float32"),
                axis=-1,
            )
            for model, outputs in zip(self.models, encoder_outputs)
        ]
        return self.combine_log_probs(log_probs)

    def combine_log_probs(self, log_probs):
        """The members' log-probabilities (a list of float32 `[..., V]`) combined.

        "probs": `log sum_i w_i exp(l_i)`, computed as a log-sum-exp (no underflow).
        "log_probs": `sum_i w_i l_i`, left for the search's log-softmax to renormalise.

        Example:
        >>> import numpy as np
        >>> uniform = keras.ops.log(keras.ops.array([[0.5, 0.5]]))
        >>> sure = keras.ops.log(keras.ops.array([[1.0, 1e-30]]))
        >>> combined = Ensemble.__new__(Ensemble)
        >>> combined.weights, combined.combine = (0.5, 0.5), "probs"
        >>> np.round(np.exp(keras.ops.convert_to_numpy(combined.combine_log_probs([uniform, sure]))), 3)
        array([[0.75, 0.25]], dtype=float32)
        """
        if len(log_probs) == 1:
            return log_probs[0]
        if self.combine == "probs":
            shifted = [values + math.log(weight) for values, weight in zip(log_probs, self.weights)]
            return ops.logsumexp(ops.stack(shifted, axis=0), axis=0)
        total = log_probs[0] * self.weights[0]
        for values, weight in zip(log_probs[1:], self.weights[1:]):
            total = total + values * weight
        return total


def _non_empty_list(name, value, expected, at_least):
    """`value` as a list: TypeError for a lone path or a non-iterable, ValueError if empty."""
    if isinstance(value, (str, os.PathLike)) or not hasattr(value, "__iter__"):
        raise TypeError(f"`{name}` must be {expected}. Received: {type(value).__name__}")
    value = list(value)
    if not value:
        raise ValueError(f"`{name}` must hold {at_least}. Received: []")
    return value


def _normalised_weights(weights, count):
    """`weights` as a tuple of floats summing to 1 (equal shares when None)."""
    if weights is None:
        return (1.0 / count,) * count
    weights = list(weights) if hasattr(weights, "__iter__") and not isinstance(weights, str) else None
    if weights is None or len(weights) != count:
        raise ValueError(
            f"`weights` must hold one positive number per model ({count}). "
            f"Received: {weights!r}"
        )
    for index, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight) or weight <= 0:
            raise ValueError(
                f"`weights` must be positive finite numbers. Received: weights[{index}]={weight!r}"
            )
    total = float(sum(weights))
    return tuple(float(weight) / total for weight in weights)


def load_ensemble(sources, tokenizer=None, *, weights=None, combine="probs"):
    """An `Ensemble` of model directories (or models) and the tokenizer they share.

    Each directory is loaded and checked as `load_model_and_tokenizer` checks one (its
    `model.keras` whole, its tokenizer the one its manifest records); then every
    member's tokenizer must be the first one's (the same sha256 fingerprint): models
    trained with different vocabularies give ids different meanings and cannot be
    combined, whatever their vocabulary sizes.

    Args:
        sources: a list of model directories (str or path-like) and/or `Transformer`s.
        tokenizer: the shared tokenizer, or a path to it; required when no member is
            a directory. Default: the first directory's.
        weights, combine: as for `Ensemble`.

    Returns:
        `(ensemble, tokenizer)`.

    Raises:
        FileNotFoundError, ValueError, TypeError: as `load_model_and_tokenizer` for a
            member; ValueError naming the two directories whose tokenizers differ.

    Example:

    ```python
    ensemble, tokenizer = load_ensemble(["saved_models/run_a", "saved_models/run_b"])
    ```
    """
    from keras_transformer.model.directory import load_model_and_tokenizer

    sources = _non_empty_list(
        "sources", sources, "a list of model directories or Transformers", "at least one model directory or model"
    )
    directories = [source for source in sources if isinstance(source, (str, os.PathLike))]
    if tokenizer is None and not directories:
        raise ValueError(
            "An ensemble of model objects needs its tokenizer: pass `tokenizer=` (a "
            "SubwordTokenizer or the path of its tokenizer.model)."
        )
    if tokenizer is None:
        tokenizer = directories[0]
    models, first = [], None
    for source in sources:
        # A directory's own tokenizer checks it against its manifest; a model object is
        # checked against the shared one.
        own = None if isinstance(source, (str, os.PathLike)) else tokenizer
        model, member_tokenizer = load_model_and_tokenizer(source, own)
        if first is None:
            first = (source, member_tokenizer)
        elif member_tokenizer.fingerprint != first[1].fingerprint:
            raise ValueError(
                f"{_describe(source)} and {_describe(first[0])} were trained with different "
                "tokenizers (their sha256 fingerprints differ): an ensemble combines the "
                "members' distributions id by id, so they must share one vocabulary."
            )
        models.append(model)
    if isinstance(tokenizer, (str, os.PathLike)):
        tokenizer = first[1]
    elif tokenizer.fingerprint != first[1].fingerprint:
        raise ValueError(
            f"The tokenizer given is not the one {_describe(first[0])} was trained with "
            "(their sha256 fingerprints differ)."
        )
    return Ensemble(models, weights=weights, combine=combine), tokenizer


def _describe(source):
    return os.fspath(source) if isinstance(source, (str, os.PathLike)) else f"the model {source.name!r}"


__all__ = ["COMBINE_METHODS", "Ensemble", "load_ensemble"]
