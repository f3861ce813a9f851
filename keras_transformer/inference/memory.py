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
a model to that domain without retraining. Two searches, both in `keras.ops` on every
backend:

- every key (the default): exact, one matmul a step, so a step costs about `2 * N * D`
  more FLOPs for `N` keys of width `D` (~60 MFLOP a hypothesis for Multi30k's 457k
  training positions);
- the keys of the `pairs` stored pairs whose sources are nearest the sentence being
  translated (`MemoryModel(..., pairs=64)`): the memory also keeps each pair's source
  pieces; each sentence looks up its nearest pairs once, by the TF-IDF cosine of the
  pieces (exact, in `keras.ops`: one gather and one segment sum over the stored
  sources' pieces), and every step then reads only their keys, so a step costs the same
  whatever the memory's size. Retrieving sentences first and searching their tokens
  follows SK-MT (Dai et al., 2023), which retrieves with BM25.

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
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID

_FORMAT = "keras_transformer.translation_memory/1"


class TranslationMemory:
    """Keys (final decoder states) and values (the tokens that followed them).

    Args:
        keys: float array `[N, D]`, one decoder state per stored target position.
        values: integer array `[N]`, the token id that followed each key.
        vocab_size: the vocabulary the values index (the model's `config.vocab_size`).
        skipped: pairs left out when it was built (too long for the model).
        pair_lengths: optional integer array `[P]`: the keys each stored pair holds, in
            the order of `keys` (pair `p`'s keys follow pair `p - 1`'s); with
            `pair_sources`, what `MemoryModel(..., pairs=M)` searches by.
        pair_sources: optional list of `P` sequences of source token ids, one per pair
            in the same order (no EOS).

    Attributes:
        keys, values, vocab_size, skipped: as given (float32, int32, int, int).
        pair_lengths: int32 `[P]` or None; pair_starts: int32 `[P]` (each pair's first
            key) or None; pair_sources: list of `P` int32 arrays, or None.

    Raises:
        ValueError: keys that are not 2-D and finite, values not one per key, a value
            outside `[0, vocab_size)`, or a pair index that does not cover the keys.
    """

    def __init__(self, keys, values, vocab_size, skipped=0, pair_lengths=None, pair_sources=None):
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
        self.pair_lengths, self.pair_starts, self.pair_sources = _pair_index(
            pair_lengths, pair_sources, keys.shape[0], self.vocab_size
        )

    @property
    def has_pairs(self):
        """Whether it holds the pair index that `MemoryModel(..., pairs=M)` needs."""
        return self.pair_lengths is not None

    def __len__(self):
        return self.keys.shape[0]

    def __repr__(self):
        pairs = f", {len(self.pair_lengths)} pairs" if self.has_pairs else ""
        return (
            f"TranslationMemory({len(self)} keys of width {self.keys.shape[1]}{pairs}, "
            f"vocab_size={self.vocab_size})"
        )

    def save(self, path):
        """Writes the memory to `path` (`.npz`), atomically; returns `path`."""
        path = os.fspath(path)
        if not path.endswith(".npz"):
            raise ValueError(f"A TranslationMemory is saved as .npz. Received: {path!r}")
        arrays = {
            "format": np.array(_FORMAT),
            "keys": self.keys,
            "values": self.values,
            "vocab_size": np.array(self.vocab_size),
            "skipped": np.array(self.skipped),
        }
        if self.has_pairs:
            arrays.update(
                pair_lengths=self.pair_lengths,
                source_ids=np.concatenate(self.pair_sources),
                source_lengths=np.array([len(ids) for ids in self.pair_sources], np.int64),
            )
        with atomic.atomic_path(path) as temporary:
            with open(temporary, "wb") as handle:
                np.savez(handle, **arrays)
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
            pairs = {}
            index = ("pair_lengths", "source_ids", "source_lengths")
            present = [name for name in index if name in data]
            if present and len(present) < len(index):
                raise ValueError(
                    f"{os.fspath(path)!r} holds part of a pair index ({', '.join(present)}) but not "
                    f"{', '.join(name for name in index if name not in data)}: expected all of {index} or "
                    "none; rebuild the memory with build_translation_memory."
                )
            if present:
                cuts = np.cumsum(data["source_lengths"])[:-1]
                pairs = {"pair_lengths": data["pair_lengths"], "pair_sources": np.split(data["source_ids"], cuts)}
            return cls(data["keys"], data["values"], int(data["vocab_size"]), int(data["skipped"]), **pairs)


def _pair_index(pair_lengths, pair_sources, key_count, vocab_size):
    """Checks the optional pair index: `(lengths, starts, sources)` or three Nones."""
    if pair_lengths is None and pair_sources is None:
        return None, None, None
    if pair_lengths is None or pair_sources is None:
        raise ValueError(
            "A TranslationMemory's pair index needs both `pair_lengths` and `pair_sources`. Received: "
            f"pair_lengths={'None' if pair_lengths is None else 'given'}, "
            f"pair_sources={'None' if pair_sources is None else 'given'}"
        )
    lengths = np.asarray(pair_lengths)
    if lengths.ndim != 1 or not np.issubdtype(lengths.dtype, np.integer) or lengths.size == 0 or lengths.min() < 1:
        raise ValueError(
            "`pair_lengths` must be a 1-D integer array of positive key counts, one per pair. Received: "
            f"shape {lengths.shape}, dtype {lengths.dtype}"
        )
    if int(lengths.sum()) != key_count:
        raise ValueError(
            f"`pair_lengths` must cover the keys exactly: they sum to {int(lengths.sum())} for {key_count} keys"
        )
    sources = [np.asarray(ids, dtype=np.int64).reshape(-1) for ids in pair_sources]
    if len(sources) != lengths.size:
        raise ValueError(f"`pair_sources` needs one source per pair: {lengths.size}. Received: {len(sources)}")
    if any(ids.size and (ids.min() < 0 or ids.max() >= vocab_size) for ids in sources):
        raise ValueError(f"`pair_sources` holds token ids in [0, {vocab_size}). Received: an id outside it")
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int32)
    return lengths.astype(np.int32), starts, [ids.astype(np.int32) for ids in sources]


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
        A `TranslationMemory` with one key per target token (EOS included) and the pair
        index (each pair's key count and source ids) that `MemoryModel(..., pairs=M)`
        searches by.

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
    fits, batches = teacher_forced_batches(tokenizer, sources, targets, model.config.max_length, batch_size)
    bar = keras.utils.Progbar(len(fits), unit_name="pair") if progress else None
    keys, values, lengths, pair_sources = [], [], [], []
    for row_sources, encoder_inputs, decoder_inputs, next_tokens in batches:
        states = _decoder_states(model, encoder_inputs, decoder_inputs)
        real = next_tokens != 0
        keys.append(states[real])  # row-major: each pair's keys in a run, in `rows` order
        values.append(next_tokens[real])
        lengths.append(real.sum(axis=1))
        pair_sources.extend(row_sources)
        if bar is not None:
            bar.add(len(row_sources))
    return TranslationMemory(
        np.concatenate(keys),
        np.concatenate(values),
        model.config.vocab_size,
        skipped=len(sources) - len(fits),
        pair_lengths=np.concatenate(lengths),
        pair_sources=pair_sources,
    )


def teacher_forced_batches(tokenizer, sources, targets, max_length, batch_size):
    """Parallel text as teacher-forced arrays, in batches of pairs of similar length.

    A pair whose source plus EOS, or BOS plus target, is longer than `max_length` is left
    out. Shared by the memory's build and the likelihood of a reference
    (`bench/memory_likelihood.py`), so both read the same positions.

    Returns:
        `(fits, batches)`: the indices of the pairs kept, in batch order, and an iterator
        of `(source ids of the batch's pairs, encoder_inputs [B, S], decoder_inputs [B, T],
        next_tokens [B, T])`, int32 and 0-padded; `next_tokens` is the target plus EOS.

    Raises:
        ValueError: no pair fits `max_length`.
    """
    source_ids, target_ids = tokenizer.encode(sources), tokenizer.encode(targets)
    fits = [i for i in range(len(sources)) if len(source_ids[i]) < max_length and len(target_ids[i]) < max_length]
    if not fits:
        raise ValueError(
            f"No pair fits the model's max_length {max_length} (source + EOS and BOS + target). "
            f"Received: {len(sources)} pairs"
        )
    fits.sort(key=lambda i: (len(target_ids[i]), len(source_ids[i])))

    def batches():
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
            yield [source_ids[i] for i in rows], encoder_inputs, decoder_inputs, next_tokens

    return fits, batches()


def _decoder_states(model, encoder_inputs, decoder_inputs):
    """The final decoder states `[B, T, D]`, numpy float32."""
    encoder_outputs, padding_mask = model.encode(ops.convert_to_tensor(encoder_inputs))
    _, states = model.decode(ops.convert_to_tensor(decoder_inputs), encoder_outputs, padding_mask, return_states=True)
    return ops.convert_to_numpy(ops.cast(states, "float32"))


def piece_idf(pair_sources, vocab_size):
    """Each piece's inverse document frequency over the stored sources: float32 `[V]`.

    The smoothed `log((1 + P) / (1 + df)) + 1` of scikit-learn's TfidfVectorizer; PAD,
    BOS and EOS weigh 0 (every source has them, they tell nothing).
    """
    document_frequency = np.zeros(vocab_size)
    for ids in pair_sources:
        document_frequency[np.unique(ids)] += 1
    idf = np.log((1.0 + len(pair_sources)) / (1.0 + document_frequency)) + 1.0
    idf[[PAD_ID, BOS_ID, EOS_ID]] = 0.0
    return idf.astype(np.float32)


def _pair_piece_weights(pair_sources, idf):
    """`(flat ids [n], owning pair [n], idf / |pair's TF-IDF vector| [n])` of every stored piece.

    With the query's unit TF-IDF vector `q`, `sum over a pair's pieces of q[id] * weight`
    is the cosine of the two TF-IDF vectors.
    """
    flat = np.concatenate([np.asarray(ids, np.int64) for ids in pair_sources])
    owner = np.repeat(np.arange(len(pair_sources)), [len(ids) for ids in pair_sources])
    distinct, counts = np.unique(owner * idf.size + flat, return_counts=True)
    tfidf = counts * idf[distinct % idf.size]
    norms = np.sqrt(np.bincount(distinct // idf.size, weights=tfidf**2, minlength=len(pair_sources)))
    weights = np.where(norms[owner] > 0, idf[flat] / np.maximum(norms[owner], 1e-12), 0.0)
    return flat.astype(np.int32), owner.astype(np.int32), weights.astype(np.float32)


def search_keys(keys):
    """`[2 k, -|k|^2]` per key, `[N, D + 1]` float32: what `nearest_neighbor_log_probs` searches.

    With the query written `[q, 1]`, one matmul gives `2 q.k - |k|^2 = |q|^2 - |q - k|^2`:
    the largest values are the nearest keys, with no pass over `[B, N]` to add the norms.
    """
    keys = np.asarray(keys, dtype=np.float32)
    return np.concatenate([2.0 * keys, -np.square(keys).sum(axis=1, keepdims=True)], axis=1)


def nearest_neighbor_log_probs(states, keys, values, vocab_size, neighbors, temperature, return_distance=False):
    """The memory's next-token log-distribution of each state: `[B, vocab_size]`.

    Args:
        states: float `[B, D]`, the decoder's final states.
        keys: float32 `[N, D + 1]`, the memory's keys as `search_keys` writes them, read
            by every row; or `[B, C, D + 1]`, each row's own candidates (the pair search).
        values: int32 `[N]` (or `[B, C]`), the token each key holds.
        vocab_size: int; neighbors: `k`; temperature: the softmax temperature over the
            negative squared distances.
        return_distance: also return each state's squared distance to its nearest key.

    Returns:
        float32 `[B, vocab_size]`: `log sum_{j in kNN, values_j = y} softmax(-d / T)_j`,
        `-inf` for tokens no neighbour holds; with `return_distance`, also float32 `[B]`.

    Example:
    >>> import numpy as np
    >>> keys = search_keys(np.array([[0.0, 0.0], [1.0, 0.0], [3.0, 0.0]]))
    >>> log_p = nearest_neighbor_log_probs(keras.ops.array([[0.0, 0.0]]), keys, np.array([1, 1, 2], "int32"), 3, 2, 1.0)
    >>> np.round(np.exp(keras.ops.convert_to_numpy(log_p)), 3)  # 1 holds both neighbours: e^0 + e^-1
    array([[0., 1., 0.]], dtype=float32)
    """
    states = ops.cast(states, "float32")
    if len(keys.shape) == 3:
        log_probs, nearest = _candidate_log_probs(states[:, None, :], keys, values, vocab_size, neighbors, temperature)
    else:
        # |q|^2 - d, largest first: |q|^2 is the same for every key of a row, so it
        # cancels in the softmax and is only added for the nearest distance.
        scores, indices = ops.top_k(ops.matmul(_queries(states), ops.transpose(keys)), neighbors)
        log_probs = _neighbor_log_probs(scores, ops.take(values, indices), vocab_size, temperature)
        # max, not scores[:, 0]: slicing top_k's values made XLA on CPU sort all N keys
        # of every row (a step ~20x slower, measured); the max keeps its top-k path.
        nearest = _squared_norm(states) - ops.max(scores, axis=-1)
    return (log_probs, nearest) if return_distance else log_probs


def _squared_norm(states):
    return ops.sum(ops.square(states), axis=-1)


def _queries(states):
    """`[q, 1]`: with keys `[2 k, -|k|^2]`, a dot product is `|q|^2 - |q - k|^2`."""
    return ops.concatenate([states, ops.ones_like(states[..., :1])], axis=-1)


def _candidate_log_probs(states, keys, values, vocab_size, neighbors, temperature):
    """Each row's states `[B, T, D]` against its own keys `[B, C, D + 1]`.

    Returns `(log-probabilities [B * T, V], nearest squared distances [B * T])`.
    """
    scores = ops.matmul(_queries(states), ops.transpose(keys, (0, 2, 1)))  # [B, T, C]
    batch, length, candidates = ops.shape(scores)
    scores, indices = ops.top_k(ops.reshape(scores, (batch * length, candidates)), neighbors)
    # The row's values, read from the flattened [B * C] by `row * C + index`.
    row_starts = (ops.arange(batch * length, dtype="int32") // length) * candidates
    tokens = ops.take(ops.reshape(values, (-1,)), row_starts[:, None] + ops.cast(indices, "int32"))
    nearest = ops.reshape(_squared_norm(states), (-1,)) - ops.max(scores, axis=-1)
    return _neighbor_log_probs(scores, tokens, vocab_size, temperature), nearest


def _neighbor_log_probs(scores, tokens, vocab_size, temperature):
    """`log sum softmax(scores / T)` per token: scores and tokens `[R, k]` -> `[R, V]`."""
    rows_count, neighbors = ops.shape(scores)
    # softmax written out: Keras warns on a softmax over one neighbour, a valid k here.
    scaled = scores / temperature
    weights = ops.exp(scaled - ops.max(scaled, axis=-1, keepdims=True))
    weights = weights / ops.sum(weights, axis=-1, keepdims=True)
    rows = ops.repeat(ops.arange(rows_count)[:, None], neighbors, axis=1)
    scatter_at = ops.stack([ops.reshape(rows, (-1,)), ops.reshape(ops.cast(tokens, rows.dtype), (-1,))], axis=-1)
    probs = ops.scatter(scatter_at, ops.reshape(weights, (-1,)), (rows_count, vocab_size))  # duplicates add up
    return ops.log(probs)


# An empty candidate slot: a key no query can be near (its dot product is -1e30).
_FAR = -1e30


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
        distance_scale: None (default) mixes every step with `weight`. A number `s` makes
            the share `weight * exp(-d0 / s)`, `d0` the squared distance of the step's
            nearest key: a step whose state is far from everything stored leans on the
            model (the distance-aware share of SK-MT and adaptive kNN-MT).
        pairs: None (default) searches every key at every step. An int `M` searches only
            the keys of the `M` stored pairs whose sources are nearest each sentence's
            (TF-IDF cosine of the source pieces, `piece_idf`, looked up once a sentence):
            a step then costs the same whatever the memory's size. Needs a memory with the
            pair index (`build_translation_memory` writes it). The nearest pairs' keys
            fill `slots = min(M * longest, max(longest, ceil(2 * M * mean)))` candidates,
            nearest pair first (`longest` and `mean`: keys a pair holds in the memory).

    Raises:
        TypeError: a model that is not a Transformer, or a memory that is not a TranslationMemory.
        ValueError: a memory of another width or vocabulary, a non-positive temperature,
            a weight outside [0, 1), a non-positive `distance_scale`, or `pairs` with a
            memory that has no pair index.
    """

    def __init__(
        self, model, memory, *, neighbors=16, temperature=30.0, weight=0.5, distance_scale=None, pairs=None
    ):
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
        self.temperature = float(temperature)
        self.weight = float(weight)
        if distance_scale is not None:
            checks.check_positive_number("distance_scale", distance_scale)
            distance_scale = float(distance_scale)
        self.distance_scale = distance_scale
        self.config = model.config
        # Variables, so that a compiled search reads them as it reads the weights.
        self._keys = keras.Variable(search_keys(memory.keys), trainable=False, name="memory_keys")
        self._values = keras.Variable(memory.values, trainable=False, dtype="int32", name="memory_values")
        self._pair_variables = []
        self.pairs = self.slots = None
        if pairs is None:
            self.neighbors = min(int(neighbors), len(memory))
            return
        checks.check_positive_int("pairs", pairs)
        if not memory.has_pairs:
            raise ValueError(
                "`pairs` searches the keys of the pairs nearest each sentence, which needs the memory's pair "
                "index; this memory has none (built before it was kept). Rebuild it with "
                "build_translation_memory (or kt-build-memory), or pass pairs=None to search every key."
            )
        lengths = memory.pair_lengths
        self.pairs = min(int(pairs), len(lengths))
        self._span = int(lengths.max())
        self.slots = min(self.pairs * self._span, max(self._span, math.ceil(2 * self.pairs * float(lengths.mean()))))
        self.neighbors = min(int(neighbors), self.slots)
        idf = piece_idf(memory.pair_sources, memory.vocab_size)
        flat, owner, weights = _pair_piece_weights(memory.pair_sources, idf)
        self._pair_variables = [
            keras.Variable(idf, trainable=False, name="memory_piece_idf"),
            keras.Variable(flat, trainable=False, dtype="int32", name="memory_source_ids"),
            keras.Variable(owner, trainable=False, dtype="int32", name="memory_source_pairs"),
            keras.Variable(weights, trainable=False, name="memory_source_weights"),
            keras.Variable(memory.pair_starts, trainable=False, dtype="int32", name="memory_pair_starts"),
            keras.Variable(lengths, trainable=False, dtype="int32", name="memory_pair_lengths"),
        ]

    def __repr__(self):
        scale = "" if self.distance_scale is None else f", distance_scale={self.distance_scale:g}"
        pairs = "" if self.pairs is None else f", pairs={self.pairs}"
        return (
            f"MemoryModel({self.memory!r}, neighbors={self.neighbors}, temperature={self.temperature:g}, "
            f"weight={self.weight:g}{scale}{pairs})"
        )

    @property
    def _reads_pairs(self):
        """Whether the search carries each sentence's candidates (pairs, a weight > 0)."""
        return self.pairs is not None and self.weight > 0

    @property
    def variables(self):
        """The model's variables, then the memory's (what a compiled search reads)."""
        return list(self.model.variables) + [self._keys, self._values] + self._pair_variables

    # ------------------------------------------------- the searches' model interface
    def encode(self, encoder_inputs, training=False):
        """The model's `(encoder outputs, padding_mask)`.

        With `pairs`, the outputs are `(outputs [B, S, D], candidate keys [B, C, D + 1],
        candidate values [B, C])`: each sentence's nearest pairs' keys, which
        `initial_cache` passes on in the cross-attention caches (tiled to the beams).
        """
        encoder_outputs, padding_mask = self.model.encode(encoder_inputs, training=training)
        if not self._reads_pairs:
            return encoder_outputs, padding_mask
        return (encoder_outputs, *self.candidates(encoder_inputs)), padding_mask

    def candidates(self, encoder_inputs):
        """The keys of each sentence's `pairs` nearest stored pairs: `([B, C, D + 1], [B, C])`.

        Nearest by the TF-IDF cosine of the source pieces (`piece_idf`). Slots past the
        pairs' keys hold a key no state is near, with value 0.
        """
        idf, source_ids, source_pairs, source_weights, pair_starts, pair_lengths = self._pair_variables
        ids = ops.cast(encoder_inputs, "int32")
        batch, length = ops.shape(ids)
        rows = ops.repeat(ops.arange(batch, dtype="int32")[:, None], length, axis=1)
        at = ops.stack([ops.reshape(rows, (-1,)), ops.reshape(ids, (-1,))], axis=-1)
        query = ops.scatter(at, ops.reshape(ops.take(idf, ids), (-1,)), (batch, self.config.vocab_size))  # tf * idf
        query = query / ops.maximum(ops.norm(query, axis=-1, keepdims=True), 1e-6)
        # cosine[p, b] = sum over pair p's pieces of query[b, id] * weight: a gather of the
        # stored pieces' query entries, summed per pair.
        per_piece = ops.take(ops.transpose(query), source_ids, axis=0) * source_weights[:, None]  # [n, B]
        cosine = ops.segment_sum(per_piece, source_pairs, num_segments=len(self.memory.pair_lengths))
        _, nearest = ops.top_k(ops.transpose(cosine), self.pairs)  # [B, M]
        offsets = ops.arange(self._span, dtype="int32")
        positions = ops.reshape(ops.take(pair_starts, nearest)[:, :, None] + offsets, (batch, -1))
        valid = ops.reshape(offsets < ops.take(pair_lengths, nearest)[:, :, None], (batch, -1))
        # The first `slots` real positions, nearest pair first: the largest of -position
        # among the real ones (every padding slot ranks below).
        order = ops.cast(ops.arange(self.pairs * self._span), "float32")
        _, chosen = ops.top_k(ops.where(valid, -order, -order - self.pairs * self._span), self.slots)
        positions = ops.take_along_axis(positions, chosen, axis=1)
        valid = ops.take_along_axis(valid, chosen, axis=1)
        positions = ops.where(valid, positions, 0)
        far = ops.concatenate([ops.zeros((self.config.d_model,)), ops.array([_FAR])], axis=0)
        keys = ops.where(valid[:, :, None], ops.take(self._keys, positions, axis=0), far)
        values = ops.where(valid, ops.take(self._values, positions), 0)
        return keys, values

    def initial_cache(self, encoder_outputs, max_target_length):
        if not self._reads_pairs:
            return self.model.initial_cache(encoder_outputs, max_target_length)
        outputs, keys, values = encoder_outputs
        self_caches, cross_caches = self.model.initial_cache(outputs, max_target_length)
        return self_caches, (cross_caches, keys, values)

    def decode_step(self, token_ids, index, self_caches, cross_caches, encoder_padding_mask):
        """One step: `(log-probabilities [B, V] with the memory mixed in, self_caches)`."""
        candidates = None
        if self._reads_pairs:
            cross_caches, *candidates = cross_caches
        logits, caches, states = self.model.decode_step(
            token_ids, index, self_caches, cross_caches, encoder_padding_mask, return_states=True
        )
        return self.mix(logits, states, candidates), caches

    def decode(self, decoder_inputs, encoder_outputs, encoder_padding_mask, training=False):
        """Teacher-forced: the mixed log-probabilities `[B, T, V]`."""
        candidates = None
        if self._reads_pairs:
            encoder_outputs, *candidates = encoder_outputs
        logits, states = self.model.decode(
            decoder_inputs, encoder_outputs, encoder_padding_mask, training=training, return_states=True
        )
        batch, length = ops.shape(states)[0], ops.shape(states)[1]
        log_probs = ops.log_softmax(ops.cast(ops.reshape(logits, (batch * length, -1)), "float32"), axis=-1)
        if self.weight == 0:
            return ops.reshape(log_probs, (batch, length, -1))
        if candidates is None:
            memory_log_probs, nearest = self._search_every_key(ops.reshape(states, (batch * length, -1)))
        else:
            memory_log_probs, nearest = _candidate_log_probs(
                ops.cast(states, "float32"), *candidates, self.config.vocab_size, self.neighbors, self.temperature
            )
        return ops.reshape(self._interpolate(memory_log_probs, log_probs, nearest), (batch, length, -1))

    def mix(self, logits, states, candidates=None):
        """`log(weight * p_memory + (1 - weight) * softmax(logits))` for states `[B, D]`.

        `candidates`: None searches every key; `(keys [B, C, D + 1], values [B, C])`
        searches each row's own (what `candidates` returns, tiled to the rows).
        """
        log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
        if self.weight == 0:
            return log_probs
        if candidates is None:
            memory_log_probs, nearest = self._search_every_key(states)
        else:
            memory_log_probs, nearest = nearest_neighbor_log_probs(
                states, *candidates, self.config.vocab_size, self.neighbors, self.temperature, return_distance=True
            )
        return self._interpolate(memory_log_probs, log_probs, nearest)

    def _search_every_key(self, states):
        """`(memory log-probabilities, nearest squared distances or None)` of states `[R, D]`.

        The distance is asked for only where the share reads it: a fixed share skips its
        norm and max over every step's rows.
        """
        reads_distance = self.distance_scale is not None
        result = nearest_neighbor_log_probs(
            states, self._keys, self._values, self.config.vocab_size, self.neighbors, self.temperature,
            return_distance=reads_distance,
        )
        return result if reads_distance else (result, None)

    def _interpolate(self, memory_log_probs, log_probs, nearest):
        """`log(share * p_memory + (1 - share) * p_model)`, the share per row `[R]`."""
        if self.distance_scale is None:
            return ops.logaddexp(memory_log_probs + math.log(self.weight), log_probs + math.log(1.0 - self.weight))
        # log share = log weight - d0 / s, d0 >= 0 (rounding can make it slightly negative).
        log_share = math.log(self.weight) - ops.maximum(nearest, 0.0)[:, None] / self.distance_scale
        return ops.logaddexp(memory_log_probs + log_share, log_probs + ops.log1p(-ops.exp(log_share)))
