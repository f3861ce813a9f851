"""A translation memory searched while decoding: nearest-neighbour machine translation.

kNN-MT (Khandelwal et al., 2021, "Nearest Neighbor Machine Translation"): teacher-force
the model over parallel text it may or may not have been trained on and keep, for every
target position, the decoder's final state (the vector the output projection reads) as a
key and the token that followed as its value. While decoding, each step's state looks up
its `k` nearest keys by squared L2 distance `d`; the memory's next-token distribution is
`p_mem(y) = sum over neighbours with value y of softmax(-d / temperature)`, and the search
reads `log(weight * p_mem + (1 - weight) * p_model)`.

It needs no training: the memory of the training set lets a model trained for a short
budget copy what it has seen but not yet learned, and a memory of in-domain pairs adapts
a model to that domain without retraining. The search is exact (every key, one matmul a
step, in `keras.ops` on every backend), so a step costs about `2 * N * D` more FLOPs for
`N` keys of width `D`: ~60 MFLOP a hypothesis for Multi30k's 457k training positions.

Example:

```python
memory = build_translation_memory(model, tokenizer, train_sources, train_targets)
memory.save("train.memory.npz")
translator = Translator(MemoryModel(model, memory), tokenizer=tokenizer)
```
"""

import math
import os

import keras
import numpy as np
from keras import ops

from keras_transformer import atomic, checks
from keras_transformer.special_tokens import BOS_ID, EOS_ID

_FORMAT = "keras_transformer.translation_memory/1"


class TranslationMemory:
    """Keys (final decoder states) and values (the tokens that followed them).

    Args:
        keys: float array `[N, D]`, one decoder state per stored target position.
        values: integer array `[N]`, the token id that followed each key.
        vocab_size: the vocabulary the values index (the model's `config.vocab_size`).

    Attributes:
        keys: float32 numpy array `[N, D]`.
        values: int32 numpy array `[N]`.
        vocab_size: int.
        skipped: pairs left out when it was built (too long for the model), or 0.

    Raises:
        ValueError: keys that are not 2-D and finite, values not one per key, or a value
            outside `[0, vocab_size)`.
    """

    def __init__(self, keys, values, vocab_size, skipped=0):
        keys = np.asarray(keys, dtype=np.float32)
        values = np.asarray(values)
        checks.check_positive_int("vocab_size", vocab_size)
        if keys.ndim != 2 or keys.shape[0] == 0 or keys.shape[1] == 0:
            raise ValueError(
                f"A TranslationMemory's keys must be a non-empty 2-D array [N, D]. Received: shape {keys.shape}"
            )
        if values.shape != (keys.shape[0],) or not np.issubdtype(values.dtype, np.integer):
            raise ValueError(
                "A TranslationMemory needs one integer value (a token id) per key. Received: "
                f"values of shape {values.shape} and dtype {values.dtype} for {keys.shape[0]} keys"
            )
        if values.min() < 0 or values.max() >= vocab_size:
            raise ValueError(
                f"A TranslationMemory's values are token ids in [0, {vocab_size}). Received: "
                f"values from {values.min()} to {values.max()}"
            )
        if not np.isfinite(keys).all():
            raise ValueError("A TranslationMemory's keys must be finite. Received: NaN or inf in the keys")
        self.keys = keys
        self.values = values.astype(np.int32)
        self.vocab_size = int(vocab_size)
        self.skipped = int(skipped)

    def __len__(self):
        return self.keys.shape[0]

    def __repr__(self):
        return f"TranslationMemory({len(self)} keys of width {self.keys.shape[1]}, vocab_size={self.vocab_size})"

    def save(self, path):
        """Writes the memory to `path` (`.npz`), atomically; returns `path`."""
        path = os.fspath(path)
        if not path.endswith(".npz"):
            raise ValueError(f"A TranslationMemory is saved as .npz. Received: {path!r}")
        with atomic.atomic_path(path) as temporary:
            with open(temporary, "wb") as handle:
                np.savez(
                    handle,
                    format=np.array(_FORMAT),
                    keys=self.keys,
                    values=self.values,
                    vocab_size=np.array(self.vocab_size),
                    skipped=np.array(self.skipped),
                )
        return path

    @classmethod
    def load(cls, path):
        """Reads a memory written by `save`.

        Raises:
            ValueError: a file that is not a saved TranslationMemory.
        """
        with np.load(os.fspath(path), allow_pickle=False) as data:
            if "format" not in data or str(data["format"]) != _FORMAT:
                raise ValueError(
                    f"{os.fspath(path)!r} is not a TranslationMemory written by TranslationMemory.save "
                    f"(expected format {_FORMAT!r})."
                )
            return cls(data["keys"], data["values"], int(data["vocab_size"]), int(data["skipped"]))


def build_translation_memory(model, tokenizer, sources, targets, *, batch_size=64, progress=False):
    """Teacher-forces `model` over parallel text and keeps every target position's state.

    Pairs are run in batches of similar length (inference mode: no dropout). A pair
    whose source plus EOS, or BOS plus target, is longer than `model.config.max_length`
    is left out and counted in the memory's `skipped`.

    Args:
        model: a `keras_transformer.Transformer`.
        tokenizer: its `SubwordTokenizer`.
        sources, targets: lists of str, one target per source.
        batch_size: pairs a forward pass.
        progress: show Keras' progress bar.

    Returns:
        A `TranslationMemory` with one key per target token (EOS included).

    Raises:
        ValueError: lists of different lengths, or no pair that fits the model.
    """
    from keras_transformer.model.transformer import Transformer

    if not isinstance(model, Transformer):
        raise TypeError(
            f"build_translation_memory needs a keras_transformer.Transformer. Received: {type(model).__name__}"
        )
    sources, targets = list(sources), list(targets)
    if len(sources) != len(targets):
        raise ValueError(
            f"`sources` and `targets` must be pairs, one target per source. Received: {len(sources)} "
            f"sources and {len(targets)} targets"
        )
    checks.check_positive_int("batch_size", batch_size)
    limit = model.config.max_length
    source_ids, target_ids = tokenizer.encode(sources), tokenizer.encode(targets)
    fits = [i for i in range(len(sources)) if len(source_ids[i]) < limit and len(target_ids[i]) < limit]
    if not fits:
        raise ValueError(
            f"No pair fits the model's max_length {limit} (source + EOS and BOS + target). "
            f"Received: {len(sources)} pairs"
        )
    fits.sort(key=lambda i: (len(target_ids[i]), len(source_ids[i])))
    bar = keras.utils.Progbar(len(fits), unit_name="pair") if progress else None
    keys, values = [], []
    for start in range(0, len(fits), batch_size):
        rows = fits[start : start + batch_size]
        source_len = max(len(source_ids[i]) for i in rows) + 1
        target_len = max(len(target_ids[i]) for i in rows) + 1
        encoder_inputs = np.zeros((len(rows), source_len), np.int32)
        decoder_inputs = np.zeros((len(rows), target_len), np.int32)
        next_tokens = np.zeros((len(rows), target_len), np.int32)
        for row, i in enumerate(rows):
            encoder_inputs[row, : len(source_ids[i]) + 1] = source_ids[i] + [EOS_ID]
            decoder_inputs[row, : len(target_ids[i]) + 1] = [BOS_ID] + target_ids[i]
            next_tokens[row, : len(target_ids[i]) + 1] = target_ids[i] + [EOS_ID]
        states = _decoder_states(model, encoder_inputs, decoder_inputs)
        real = next_tokens != 0
        keys.append(states[real])
        values.append(next_tokens[real])
        if bar is not None:
            bar.add(len(rows))
    return TranslationMemory(
        np.concatenate(keys), np.concatenate(values), model.config.vocab_size, skipped=len(sources) - len(fits)
    )


def _decoder_states(model, encoder_inputs, decoder_inputs):
    encoder_outputs, padding_mask = model.encode(ops.convert_to_tensor(encoder_inputs))
    _, states = model.decode(ops.convert_to_tensor(decoder_inputs), encoder_outputs, padding_mask, return_states=True)
    return ops.convert_to_numpy(ops.cast(states, "float32"))


def search_keys(keys):
    """`[2 k, -|k|^2]` per key, `[N, D + 1]` float32: what `nearest_neighbor_log_probs` searches.

    With the query written `[q, 1]`, one matmul gives `2 q.k - |k|^2 = |q|^2 - |q - k|^2`:
    the largest values are the nearest keys, with no pass over `[B, N]` to add the norms.
    """
    keys = np.asarray(keys, dtype=np.float32)
    return np.concatenate([2.0 * keys, -np.square(keys).sum(axis=1, keepdims=True)], axis=1)


def nearest_neighbor_log_probs(states, keys, values, vocab_size, neighbors, temperature):
    """The memory's next-token log-distribution of each state: `[B, vocab_size]`.

    Args:
        states: float `[B, D]`, the decoder's final states.
        keys: float32 `[N, D + 1]`, the memory's keys as `search_keys` writes them.
        values: int32 `[N]`.
        vocab_size: int; neighbors: `k`; temperature: the softmax temperature over the
            negative squared distances.

    Returns:
        float32 `[B, vocab_size]`: `log sum_{j in kNN, values_j = y} softmax(-d / T)_j`,
        `-inf` for tokens no neighbour holds.

    Example:
    >>> import numpy as np
    >>> keys = search_keys(np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]]))
    >>> log_p = nearest_neighbor_log_probs(keras.ops.array([[0.0, 0.0]]), keys, np.array([1, 1, 2], "int32"), 3, 2, 1.0)
    >>> np.round(np.exp(keras.ops.convert_to_numpy(log_p)), 3)  # 1 holds both neighbours: e^0 + e^-1
    array([[0., 1., 0.]], dtype=float32)
    """
    states = ops.cast(states, "float32")
    batch = ops.shape(states)[0]
    queries = ops.concatenate([states, ops.ones((batch, 1), "float32")], axis=-1)
    # |q|^2 - d, largest first: |q|^2 is the same for every key of a row, so it cancels
    # in the softmax below and is never added.
    scores, indices = ops.top_k(ops.matmul(queries, ops.transpose(keys)), neighbors)
    # softmax written out: Keras warns on a softmax over one neighbour, a valid k here.
    scaled = scores / temperature
    weights = ops.exp(scaled - ops.max(scaled, axis=-1, keepdims=True))
    weights = weights / ops.sum(weights, axis=-1, keepdims=True)
    tokens = ops.take(values, indices)  # [B, k]
    rows = ops.repeat(ops.arange(batch)[:, None], neighbors, axis=1)
    scatter_at = ops.stack([ops.reshape(rows, (-1,)), ops.reshape(ops.cast(tokens, rows.dtype), (-1,))], axis=-1)
    probs = ops.scatter(scatter_at, ops.reshape(weights, (-1,)), (batch, vocab_size))  # duplicates add up
    return ops.log(probs)


class MemoryModel:
    """A Transformer whose searches also read a `TranslationMemory` (kNN-MT).

    Pass it wherever the searches take a model: `decoding.beam_decode`,
    `decoding.greedy_decode`, `CompiledDecoder`, or `Translator(memory_model,
    tokenizer=...)`. Like `Ensemble`, it is a decoding object, not a Keras model: it is
    not saved (save the model and `memory.save`) and cannot be exported for serving.

    Args:
        model: a `keras_transformer.Transformer`.
        memory: a `TranslationMemory` built with this model (its keys are this model's
            states; another model's states mean nothing to it).
        neighbors: `k`, the keys each step reads (16); a memory of fewer keys is read whole.
        temperature: of the softmax over negative squared distances (30.0: Multi30k's
            en->de states lie ~100 apart; tune it on held-out data with the weight).
        weight: the memory's share of the next-token distribution, in [0, 1) (0.5, with
            the two above the best of a grid on Multi30k en->de val); 0 decodes exactly
            as `model` alone.

    Raises:
        TypeError: a model that is not a Transformer, or a memory that is not a TranslationMemory.
        ValueError: a memory of another width or vocabulary, a non-positive temperature,
            or a weight outside [0, 1).
    """

    def __init__(self, model, memory, *, neighbors=16, temperature=30.0, weight=0.5):
        from keras_transformer.model.transformer import Transformer

        if not isinstance(model, Transformer):
            raise TypeError(f"MemoryModel needs a keras_transformer.Transformer. Received: {type(model).__name__}")
        if not isinstance(memory, TranslationMemory):
            raise TypeError(
                "MemoryModel needs a TranslationMemory (build_translation_memory or TranslationMemory.load). "
                f"Received: {type(memory).__name__}"
            )
        if memory.keys.shape[1] != model.config.d_model or memory.vocab_size != model.config.vocab_size:
            raise ValueError(
                "The memory must come from this model: keys of width d_model and values in its vocabulary. "
                f"Received: keys of width {memory.keys.shape[1]} and vocab_size {memory.vocab_size} for a model "
                f"of d_model {model.config.d_model} and vocab_size {model.config.vocab_size}"
            )
        checks.check_positive_int("neighbors", neighbors)
        checks.check_positive_number("temperature", temperature)
        if not (isinstance(weight, (int, float)) and 0 <= weight < 1):
            raise ValueError(f"`weight` is the memory's share, in [0, 1). Received: {weight!r}")
        self.model = model
        self.memory = memory
        self.neighbors = min(int(neighbors), len(memory))
        self.temperature = float(temperature)
        self.weight = float(weight)
        self.config = model.config
        # Variables, so that a compiled search reads them as it reads the weights.
        self._keys = keras.Variable(search_keys(memory.keys), trainable=False, name="memory_keys")
        self._values = keras.Variable(memory.values, trainable=False, dtype="int32", name="memory_values")

    def __repr__(self):
        return (
            f"MemoryModel({self.memory!r}, neighbors={self.neighbors}, temperature={self.temperature:g}, "
            f"weight={self.weight:g})"
        )

    @property
    def variables(self):
        """The model's variables, then the memory's (what a compiled search reads)."""
        return list(self.model.variables) + [self._keys, self._values]

    # ------------------------------------------------- the searches' model interface
    def encode(self, encoder_inputs, training=False):
        return self.model.encode(encoder_inputs, training=training)

    def initial_cache(self, encoder_outputs, max_target_length):
        return self.model.initial_cache(encoder_outputs, max_target_length)

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_padding_mask):
        """One step: `(log-probabilities [B, V] with the memory mixed in, self_caches)`."""
        logits, caches, states = self.model.decode_step(
            token_ids, index, self_caches, cross_caches, encoder_padding_mask, return_states=True
        )
        return self.mix(logits, states), caches

    def decode(self, decoder_inputs, encoder_outputs, encoder_padding_mask, training=False):
        """Teacher-forced: the mixed log-probabilities `[B, T, V]`."""
        logits, states = self.model.decode(
            decoder_inputs, encoder_outputs, encoder_padding_mask, training=training, return_states=True
        )
        batch, length = ops.shape(states)[0], ops.shape(states)[1]
        flat = self.mix(ops.reshape(logits, (batch * length, -1)), ops.reshape(states, (batch * length, -1)))
        return ops.reshape(flat, (batch, length, -1))

    def mix(self, logits, states):
        """`log(weight * p_memory + (1 - weight) * softmax(logits))` for states `[B, D]`."""
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        if self.weight == 0:
            return log_probs
        memory_log_probs = nearest_neighbor_log_probs(
            states, self._keys, self._values, self.config.vocab_size, self.neighbors, self.temperature
        )
        return ops.logaddexp(memory_log_probs + math.log(self.weight), log_probs + math.log(1.0 - self.weight))
