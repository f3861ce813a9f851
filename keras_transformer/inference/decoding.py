"""Greedy and beam search over a cached decoder step (Vaswani et al., 2017, 6.1).

Two layers of API:

- `greedy_search` / `beam_search` drive any `step_fn(token_ids [B', 1], index, state)
  -> (logits [B', V], new_state)`, so tests can hand them a model whose next-token
  probabilities they choose. `token_search` is greedy search with the choice of each
  next token left to a function (`inference.sampling` draws it).
- `greedy_decode` / `beam_decode` run a `Transformer` through them: the encoder once,
  then the decoder one token at a time through its key/value cache (`model.encode`,
  `model.initial_cache`, `model.decode_step`: the layer objects that training built).
  `token_search_decode` does the same for `token_search`. An `inference.ensemble.Ensemble`
  offers the same methods, so every `*_decode` runs several models as one.
- Every search and decode takes optional `prefix_ids [B, P]`: forced first output
  tokens, from which the search continues (`inference.prefixes`).

Conventions shared by every function here:

- Output tokens are `int32 [B, L]` without BOS, *with* the EOS that ended the sentence,
  and 0 (PAD) after it. Every sentence ends with EOS: at its last allowed position EOS
  is forced, so a hypothesis that reaches the length limit is finished there.
- PAD and BOS are never generated: their log-probability is set to -inf without
  renormalising (fairseq does the same), so 0 in the output always means padding.
- A sentence's length limit counts generated tokens, EOS included. By default it is
  its real (non-pad) source length + `MAX_DECODE_EXTRA` (the paper's "input length +
  50", 6.1), capped so that BOS + output fits the model's `config.max_length` positions.
  A batch runs to the longest limit of its sentences; each sentence stops at its own,
  so it decodes exactly as it would alone.
- Scores are float32 `[B]`: the sum of token log-probabilities (EOS included) for
  greedy search; that sum divided by the length penalty `((5 + len) / 6) ** alpha` for
  beam search (Wu et al., 2016, eq. 14).

Shapes use B batch, K beams, L output length, V vocabulary.

Loops are `keras.ops.while_loop` over a named state (`GreedyState`, `BeamState`) with
fixed shapes (the cache holds the longest limit from the start), so they trace inside
`tf.function` (XLA included, with `None` batch and source dimensions) and `jax.jit`;
`keras_transformer.inference.compiled` gives compiled callables. Called eagerly on
PyTorch, the loop records autograd history: wrap it in `torch.no_grad()` or use
`compiled.CompiledDecoder`, which does.
"""

import typing

import keras
from keras import ops
from keras import tree

from keras_transformer import checks
from keras_transformer.inference.prefixes import check_prefix_ids, check_prefixes_fit, forced_tokens
from keras_transformer.search_defaults import BEAM_SIZE, LENGTH_PENALTY, MAX_DECODE_EXTRA  # the paper's
from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID

DECODE_METHODS = ("beam", "greedy")  # the searches a user can choose

_NEG_INF = float("-inf")

Tensor = typing.Any  # a backend tensor
Nested = typing.Any  # a nested structure (tuple, dict) of tensors


# --------------------------------------------------------------------- scoring
def length_penalty(length, alpha):
    """The GNMT length penalty `((5 + length) / 6) ** alpha` (Wu et al., 2016, eq. 14).

    Beam search divides a hypothesis' log-probability by it, so that with `alpha > 0`
    longer hypotheses are penalised less than their summed log-probability would;
    `alpha = 0` gives 1 (no penalty). The paper uses alpha = 0.6 (6.1).

    Args:
        length: int or int tensor. Number of generated tokens, EOS included.
        alpha: float >= 0.

    Example:
    >>> round(float(length_penalty(7, 0.6)), 4)  # ((5 + 7) / 6) ** 0.6
    1.5157
    """
    return ops.power((5.0 + ops.cast(length, "float32")) / 6.0, alpha)


def _next_token_log_probs(logits, forced_eos, eos_id, pad_id, bos_id, forced_ids=None):
    """float32 `[B', V]` log-probabilities with PAD/BOS removed and EOS forced where asked.

    `forced_eos` is boolean `[B', 1]`: those rows keep only EOS (with its own
    log-probability, so scores stay the model's). `forced_ids` (int32 `[B', 1]`, PAD
    where nothing is forced) keeps only a prefix's token in its rows; EOS at the length
    limit wins over it, so every sentence still ends there.
    """
    log_probs = ops.log_softmax(ops.cast(logits, "float32"), axis=-1)
    ids = ops.arange(ops.shape(log_probs)[-1], dtype="int32")[None, :]
    never = ops.logical_or(ops.equal(ids, pad_id), ops.equal(ids, bos_id))
    not_eos = ops.not_equal(ids, eos_id)
    banned = ops.logical_or(never, ops.logical_and(forced_eos, not_eos))
    if forced_ids is not None:
        forcing = ops.logical_and(ops.not_equal(forced_ids, pad_id), ops.logical_not(forced_eos))
        banned = ops.logical_or(banned, ops.logical_and(forcing, ops.not_equal(ids, forced_ids)))
    return ops.where(banned, _NEG_INF, log_probs)


def _forced_at(prefix_ids, index, pad_id):
    """The prefix tokens forced at `index` (`[B', 1]`), or None without prefixes."""
    return None if prefix_ids is None else forced_tokens(prefix_ids, index, pad_id)


def _sentence_limits(sentence_max_lengths, batch_size, max_length):
    """int32 `[B]` per-sentence limits, each in [1, max_length]."""
    if sentence_max_lengths is None:
        return ops.full((batch_size,), max_length, dtype="int32")
    limits = ops.minimum(ops.cast(sentence_max_lengths, "int32"), max_length)
    return ops.maximum(limits, 1)


def _write_column(sequences, index, values, positions):
    """Writes `values` at column `index` of the last axis (positions = arange(L))."""
    return ops.where(ops.equal(positions, index), values, sequences)


# ---------------------------------------------------------------------- greedy
class GreedyState(typing.NamedTuple):
    """The loop state of `greedy_search` and `token_search`."""

    index: Tensor  # () int32: position of the tokens fed next (BOS is position 0)
    last_tokens: Tensor  # [B, 1] int32: the tokens fed next
    tokens: Tensor  # [B, L] int32: output so far, 0 after EOS and beyond the index
    scores: Tensor  # [B] float32: summed log-probabilities of the output
    finished: Tensor  # [B] bool: the sentence produced EOS
    cache: Nested  # `step_fn`'s state, e.g. the decoder caches, every tensor [B, ...]


def greedy_search(
    step_fn,
    state,
    batch_size,
    max_length,
    *,
    sentence_max_lengths=None,
    prefix_ids=None,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    pad_id=PAD_ID,
):
    """Greedy search: the most probable next token at every step, until EOS.

    Feeds BOS at index 0, then each chosen token at the next index, until every
    sentence has produced EOS or reached its limit (where EOS is forced). Finished
    sentences are padded with 0. See the module docstring for the conventions.

    Args:
        step_fn: `step_fn(token_ids int32 [B, 1], index int32 scalar, state) ->
            (logits [B, V], new_state)`; `index` is the position of `token_ids`
            (BOS is position 0), and `new_state` has the structure and shapes of `state`.
        state: nested structure (tuple/dict) of tensors, e.g. the decoder caches.
        batch_size: int or int scalar tensor, B.
        max_length: int (or int scalar tensor in a TF graph), L: width of the output and
            the most steps taken.
        sentence_max_lengths: optional int `[B]`, each sentence's limit (capped at L).
        prefix_ids: optional int `[B, P]`, forced first tokens of each output, padded
            with 0 (`inference.prefixes`); the output starts with them.
        bos_id, eos_id, pad_id: special ids; default to `special_tokens`.

    Returns:
        `(tokens int32 [B, L], scores float32 [B])`, scores being summed log-probabilities.

    Example:
    >>> logits = keras.ops.log(keras.ops.array([[.1, .1, .1, .5, .2]]))  # EOS (3) likeliest
    >>> step_fn = lambda token_ids, index, state: (logits, state)
    >>> tokens, scores = greedy_search(step_fn, (), batch_size=1, max_length=3)
    >>> keras.ops.convert_to_numpy(tokens).tolist()
    [[3, 0, 0]]
    >>> round(float(scores[0]), 4)  # log(0.5)
    -0.6931
    >>> tokens, _ = greedy_search(step_fn, (), 1, 3, prefix_ids=keras.ops.array([[4]]))
    >>> keras.ops.convert_to_numpy(tokens).tolist()  # 4 forced, then EOS
    [[4, 3, 0]]
    """
    return token_search(
        step_fn,
        state,
        batch_size,
        max_length,
        _most_probable,
        sentence_max_lengths=sentence_max_lengths,
        prefix_ids=prefix_ids,
        bos_id=bos_id,
        eos_id=eos_id,
        pad_id=pad_id,
    )


def _most_probable(log_probs, index):
    del index
    return ops.cast(ops.argmax(log_probs, axis=-1), "int32")


def token_search(
    step_fn,
    state,
    batch_size,
    max_length,
    pick_tokens,
    *,
    sentence_max_lengths=None,
    prefix_ids=None,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    pad_id=PAD_ID,
):
    """One hypothesis per sentence, extended by `pick_tokens` at every step, until EOS.

    `greedy_search` is this with the most probable token; sampling
    (`inference.sampling.sample_search`) draws it. `pick_tokens(log_probs float32
    [B, V], index) -> int32 [B]` sees the model's log-probabilities with PAD and BOS
    removed, and only EOS left in rows at their length limit (and only the prefix's
    token in rows a prefix forces): it must pick a token of finite log-probability.
    Scores sum the model's log-probabilities of the picked tokens, whatever the picker
    did with them. Arguments and results as for `greedy_search`.
    """
    positions = ops.arange(max_length, dtype="int32")[None, :]
    limits = _sentence_limits(sentence_max_lengths, batch_size, max_length)
    initial = GreedyState(
        index=ops.convert_to_tensor(0, "int32"),
        last_tokens=ops.full((batch_size, 1), bos_id, dtype="int32"),
        tokens=ops.zeros((batch_size, max_length), "int32"),
        scores=ops.zeros((batch_size,), "float32"),
        finished=ops.zeros((batch_size,), "bool"),
        cache=state,
    )

    def cond(s):
        return ops.logical_and(ops.less(s.index, max_length), ops.logical_not(ops.all(s.finished)))

    def body(s):
        forced_ids = _forced_at(prefix_ids, s.index, pad_id)
        return (_greedy_step(step_fn, pick_tokens, s, limits, positions, forced_ids, eos_id, pad_id, bos_id),)

    # The state travels as a 1-tuple: `while_loop` unpacks a tuple into arguments.
    (final,) = ops.while_loop(cond, body, (initial,))
    return final.tokens, final.scores


def _greedy_step(step_fn, pick_tokens, state, limits, positions, forced_ids, eos_id, pad_id, bos_id):
    """One step of `token_search`: feed the last tokens, append the picked next ones."""
    logits, cache = step_fn(state.last_tokens, state.index, state.cache)
    forced_eos = ops.greater_equal(state.index, limits - 1)[:, None]  # [B, 1]
    log_probs = _next_token_log_probs(logits, forced_eos, eos_id, pad_id, bos_id, forced_ids)
    next_ids = ops.cast(pick_tokens(log_probs, state.index), "int32")  # [B]
    next_log_probs = ops.take_along_axis(log_probs, next_ids[:, None], axis=-1)[:, 0]
    next_ids = ops.where(state.finished, ops.cast(pad_id, "int32"), next_ids)
    return GreedyState(
        index=state.index + 1,
        last_tokens=next_ids[:, None],
        tokens=_write_column(state.tokens, state.index, next_ids[:, None], positions),
        scores=state.scores + ops.where(state.finished, 0.0, next_log_probs),
        finished=ops.logical_or(state.finished, ops.equal(next_ids, eos_id)),
        cache=cache,
    )


# ------------------------------------------------------------------------ beam
class BeamState(typing.NamedTuple):
    """The loop state of `beam_search`: tensor2tensor's alive and finished sets.

    Beams are laid out sentence-major: row `b * K + k` of a `[B*K, ...]` tensor is beam
    `k` of sentence `b` (`tile_beams`).
    """

    index: Tensor  # () int32: position of the tokens fed next (BOS is position 0)
    last_tokens: Tensor  # [B*K, 1] int32: the tokens fed next, one per alive beam
    alive_seq: Tensor  # [B, K, L] int32: alive hypotheses, most probable first
    alive_log_probs: Tensor  # [B, K] float32: their summed log-probabilities
    finished_seq: Tensor  # [B, K, L] int32: the best finished hypotheses, best first
    finished_scores: Tensor  # [B, K] float32: their penalised scores, -inf in empty slots
    done: Tensor  # [B] bool: the sentence stopped; later steps leave its results alone
    top_ended: Tensor  # [B] bool: at some step the most probable extension was EOS
    cache: Nested  # `step_fn`'s state, every tensor [B*K, ...], following its beam


class _Candidates(typing.NamedTuple):
    """The 2K most probable one-token extensions of each sentence's alive beams."""

    log_probs: Tensor  # [B, 2K] float32: summed log-probabilities, best first
    tokens: Tensor  # [B, 2K] int32: the token each one appends
    origins: Tensor  # [B, 2K] int32: the alive beam (0..K-1) each one extends
    seq: Tensor  # [B, 2K, L] int32: the extended hypotheses
    ends: Tensor  # [B, 2K] bool: the token is EOS


class _BeamSettings(typing.NamedTuple):
    """What stays fixed during one `beam_search`."""

    beam_size: int  # K
    alpha: float  # length penalty exponent
    limits: Tensor  # [B] int32: each sentence's length limit
    limits_per_beam: Tensor  # [B*K, 1] int32: the same, for each beam's row
    prefix_ids: typing.Optional[Tensor]  # [B*K, P] int32: each beam's forced prefix, or None
    positions: Tensor  # [1, 1, L] int32: arange(L), to write a column
    eos_id: int
    pad_id: int
    bos_id: int
    early_stopping: bool  # also stop once K have finished after the top extension ended


def tile_beams(structure, beam_size):
    """Repeats every tensor of a nested structure `beam_size` times along axis 0.

    `[B, ...]` becomes `[B * beam_size, ...]`, sentence-major (row `b * beam_size + k`
    is beam `k` of sentence `b`), the layout `beam_search` uses for its state.

    Example:
    >>> tiled = tile_beams({"x": keras.ops.array([[1], [2]])}, 2)
    >>> keras.ops.convert_to_numpy(tiled["x"]).tolist()
    [[1], [1], [2], [2]]
    """
    return tree.map_structure(lambda x: ops.repeat(x, beam_size, axis=0), structure)


def _beam_rows(beam_indices, beam_size):
    """Rows of a `[B * K, ...]` tensor that hold beams `beam_indices [B, M]` of each sentence."""
    offsets = ops.arange(ops.shape(beam_indices)[0], dtype="int32")[:, None] * beam_size
    return ops.cast(beam_indices, "int32") + offsets


def _gather_beams(x, beam_indices, beam_size):
    """Picks beams of `x [B * K, ...]` by `beam_indices [B, M]`: returns `[B, M, ...]`."""
    return ops.take(x, _beam_rows(beam_indices, beam_size), axis=0)


def _flatten_beams(x):
    """`[B, K, ...]` -> `[B * K, ...]`."""
    return ops.reshape(x, (-1,) + tuple(ops.shape(x)[2:]))


def _check_beam_arguments(beam_size, alpha):
    checks.check_positive_int("beam_size", beam_size)
    checks.check_non_negative_number("alpha", alpha)


def _initial_beam_state(cache, batch_size, max_length, beam_size, bos_id, tile=True):
    """Beam 0 of each sentence alive at log-probability 0 after BOS; nothing finished.

    `cache` is `[B, ...]`, tiled here to the beams, or `[B * K, ...]` already with `tile=False`.
    """
    k = beam_size
    # Only beam 0 starts alive, so the first step does not pick K copies of one token.
    first_beam_only = ops.where(ops.equal(ops.arange(k), 0), 0.0, _NEG_INF)[None, :]
    return BeamState(
        index=ops.convert_to_tensor(0, "int32"),
        last_tokens=ops.full((batch_size * k, 1), bos_id, dtype="int32"),
        alive_seq=ops.zeros((batch_size, k, max_length), "int32"),
        alive_log_probs=ops.zeros((batch_size, k), "float32") + first_beam_only,
        finished_seq=ops.zeros((batch_size, k, max_length), "int32"),
        finished_scores=ops.full((batch_size, k), _NEG_INF, dtype="float32"),
        done=ops.zeros((batch_size,), "bool"),
        top_ended=ops.zeros((batch_size,), "bool"),
        cache=tile_beams(cache, k) if tile else cache,
    )


def _extend_beams(state, log_probs, settings):
    """The 2K best extensions of the alive beams by the next-token `log_probs [B*K, V]`.

    Taking 2K, not K, keeps K that do not end with EOS even if the other K all do.
    """
    k = settings.beam_size
    vocab = ops.shape(log_probs)[-1]
    # [B, K, V] -> [B, K * V]: every extension of every alive beam of a sentence.
    candidates = state.alive_log_probs[:, :, None] + ops.reshape(log_probs, (-1, k, vocab))
    candidates = ops.reshape(candidates, (-1, k * vocab))
    top_log_probs, top_ids = ops.top_k(candidates, k=2 * k)
    top_ids = ops.cast(top_ids, "int32")
    origins = top_ids // vocab
    tokens = top_ids - origins * vocab
    seq = _gather_beams(_flatten_beams(state.alive_seq), origins, k)
    seq = _write_column(seq, state.index, tokens[:, :, None], settings.positions)
    return _Candidates(top_log_probs, tokens, origins, seq, ops.equal(tokens, settings.eos_id))


def _pick_alive(candidates, cache, beam_size):
    """The K most probable candidates that did not end, and the cache of their origins.

    Returns `(alive_seq [B, K, L], alive_log_probs [B, K], alive_tokens [B, K], cache)`.
    """
    k = beam_size
    unfinished = ops.where(candidates.ends, _NEG_INF, candidates.log_probs)
    alive_log_probs, picked = ops.top_k(unfinished, k=k)
    picked = ops.cast(picked, "int32")
    alive_seq = _gather_beams(_flatten_beams(candidates.seq), picked, 2 * k)
    alive_tokens = ops.take_along_axis(candidates.tokens, picked, axis=1)
    alive_origins = ops.take_along_axis(candidates.origins, picked, axis=1)
    origin_rows = ops.reshape(_beam_rows(alive_origins, k), (-1,))
    cache = tree.map_structure(lambda x: ops.take(x, origin_rows, axis=0), cache)
    return alive_seq, alive_log_probs, alive_tokens, cache


def _update_finished(state, candidates, settings):
    """The K best length-penalised hypotheses so far: `(finished_seq, finished_scores)`.

    Old ones come first, so that a tie keeps the earlier, shorter one. Candidates are
    the EOS extensions among the K best, those a beam of K keeps (as fairseq and Hugging
    Face do; tensor2tensor takes all 2K): so a beam of 1 with alpha = 0 is greedy search.
    A stopped sentence keeps its results.
    """
    k = settings.beam_size
    within_k_best = ops.less(ops.arange(2 * k), k)[None, :]  # [1, 2K]
    finishes = ops.logical_and(candidates.ends, within_k_best)
    penalty = length_penalty(state.index + 1, settings.alpha)
    new_scores = ops.where(finishes, candidates.log_probs / penalty, _NEG_INF)
    all_scores = ops.concatenate([state.finished_scores, new_scores], axis=1)  # [B, 3K]
    all_seq = ops.concatenate([state.finished_seq, candidates.seq], axis=1)  # [B, 3K, L]
    best_scores, best = ops.top_k(all_scores, k=k)
    best_seq = _gather_beams(_flatten_beams(all_seq), ops.cast(best, "int32"), 3 * k)
    finished_scores = ops.where(state.done[:, None], state.finished_scores, best_scores)
    finished_seq = ops.where(state.done[:, None, None], state.finished_seq, best_seq)
    return finished_seq, finished_scores


def _sentences_done(state, alive_log_probs, finished_scores, top_ended, settings):
    """`[B]` bool: stopped before, at its limit, or no alive beam can beat the K-th finished.

    Log-probabilities only fall and, for alpha >= 0, the penalty only grows with length,
    so `alive_log_prob / length_penalty(limit)` bounds an alive beam's future scores.
    With `early_stopping`, a sentence also stops once K hypotheses have finished, if at
    some step its most probable extension was EOS (`top_ended`): OpenNMT's and
    CTranslate2's rule. Without that condition (fairseq's rule, and Hugging Face's with
    `early_stopping=True`), K unlikely hypotheses that end early can stop a sentence
    whose likely ones are still growing: on 200 sentences of the demo corpus (beam 4,
    alpha 0.6) that rule changed 6 translations of the demo model and cost 1.9 BLEU,
    where this one changed none (docs/fast_inference.md).
    """
    best_alive_bound = alive_log_probs[:, 0] / length_penalty(settings.limits, settings.alpha)
    stop = ops.less(best_alive_bound, finished_scores[:, -1])
    if settings.early_stopping:
        beam_full = ops.greater(finished_scores[:, -1], _NEG_INF)
        stop = ops.logical_or(stop, ops.logical_and(top_ended, beam_full))
    at_limit = ops.greater_equal(state.index + 1, settings.limits)
    return ops.logical_or(state.done, ops.logical_or(at_limit, stop))


def _beam_step(step_fn, state, settings):
    """One step of beam search: feed the alive beams' tokens, extend, select."""
    logits, cache = step_fn(state.last_tokens, state.index, state.cache)
    forced_eos = ops.greater_equal(state.index, settings.limits_per_beam - 1)  # [B*K, 1]
    forced_ids = _forced_at(settings.prefix_ids, state.index, settings.pad_id)
    log_probs = _next_token_log_probs(
        logits, forced_eos, settings.eos_id, settings.pad_id, settings.bos_id, forced_ids
    )
    candidates = _extend_beams(state, log_probs, settings)
    alive_seq, alive_log_probs, alive_tokens, cache = _pick_alive(
        candidates, cache, settings.beam_size
    )
    finished_seq, finished_scores = _update_finished(state, candidates, settings)
    top_ended = ops.logical_or(state.top_ended, candidates.ends[:, 0])
    return BeamState(
        index=state.index + 1,
        last_tokens=ops.reshape(alive_tokens, (-1, 1)),
        alive_seq=alive_seq,
        alive_log_probs=alive_log_probs,
        finished_seq=finished_seq,
        finished_scores=finished_scores,
        done=_sentences_done(state, alive_log_probs, finished_scores, top_ended, settings),
        top_ended=top_ended,
        cache=cache,
    )


def beam_search(
    step_fn,
    state,
    batch_size,
    max_length,
    *,
    beam_size=BEAM_SIZE,
    alpha=LENGTH_PENALTY,
    sentence_max_lengths=None,
    prefix_ids=None,
    bos_id=BOS_ID,
    eos_id=EOS_ID,
    pad_id=PAD_ID,
    return_all_beams=False,
    early_stopping=False,
    first_step_fn=None,
):
    """Beam search with the GNMT length penalty (Wu et al., 2016; Vaswani et al., 2017, 6.1).

    The tensor2tensor formulation: each sentence keeps `beam_size` alive hypotheses
    (ranked by log-probability) and, separately, the `beam_size` best finished ones
    (ranked by `log_prob / length_penalty(len, alpha)`). At each step the `2 * beam_size`
    best extensions of the alive beams are taken, so that `beam_size` of them survive
    even if the others end with EOS: those that do not end fill the alive set, and those
    ending with EOS within the `beam_size` best compete for the finished set. A sentence
    stops when its limit is reached (EOS is forced at its last position) or when no
    alive beam can still beat its worst finished hypothesis (or, with `early_stopping`,
    once `beam_size` hypotheses have finished after its most probable extension ended
    with EOS). Later steps leave a stopped sentence's results unchanged, so a sentence
    decodes in a batch exactly as alone.
    With `alpha = 0` and `beam_size = 1` this is greedy search; with `alpha > 0` a beam
    of 1 keeps going past the EOS greedy takes while a longer hypothesis could still
    score better, and returns the best scoring one. With `prefix_ids`, every beam of a
    sentence follows its prefix (one alive beam until the prefix ends), then the search
    branches as it does after BOS.

    `state` is tiled to `[B * beam_size, ...]` (`tile_beams`) and re-gathered by each
    surviving beam's origin after every step (`BeamState.cache`). With `first_step_fn`,
    the first step (BOS, where the K beams of a sentence are one) runs on the `[B, ...]`
    state before it is tiled, as CTranslate2 does: 1/K of that step's work, the same
    results.

    Args:
        step_fn: `step_fn(token_ids int32 [B*K, 1], index int32 scalar, state) ->
            (logits [B*K, V], new_state)`, as for `greedy_search`.
        state: nested structure of `[B, ...]` tensors.
        batch_size: int or int scalar tensor, B.
        max_length: int (or int scalar tensor in a TF graph), L.
        beam_size: int, K. Defaults to `BEAM_SIZE` (4, section 6.1).
        alpha: float >= 0, length penalty exponent. Defaults to `LENGTH_PENALTY` (0.6).
        sentence_max_lengths: optional int `[B]`, each sentence's limit (capped at L).
        prefix_ids: optional int `[B, P]`, forced first tokens, as for `greedy_search`.
        bos_id, eos_id, pad_id: special ids; default to `special_tokens`.
        return_all_beams: bool. Return all K finished hypotheses, best first, instead of
            the best one. Slots no hypothesis reached have score -inf and tokens 0.
        early_stopping: bool. Also stop a sentence once K of its hypotheses have
            finished, if at some step its most probable extension was EOS (OpenNMT's
            and CTranslate2's rule): fewer steps where the length penalty favours long
            hypotheses, but a longer one that would score better can be missed.
            Defaults to False, the exact rule above.
        first_step_fn: optional `step_fn` over the untiled `[B, ...]` state (token ids
            `[B, 1]`, logits `[B, V]`): it runs the first step, before the state is
            tiled to the beams; `step_fn` runs the others.

    Returns:
        `(tokens int32 [B, L], scores float32 [B])`, or `[B, K, L]` and `[B, K]` with
        `return_all_beams`.

    Example:
    >>> logits = keras.ops.log(keras.ops.array([[.1, .1, .1, .5, .2]] * 2))  # EOS (3) likeliest
    >>> step_fn = lambda token_ids, index, state: (logits, state)
    >>> tokens, scores = beam_search(step_fn, (), batch_size=1, max_length=3, beam_size=2)
    >>> keras.ops.convert_to_numpy(tokens).tolist()
    [[3, 0, 0]]
    """
    _check_beam_arguments(beam_size, alpha)
    checks.check_bool("early_stopping", early_stopping)
    limits = _sentence_limits(sentence_max_lengths, batch_size, max_length)
    settings = _BeamSettings(
        beam_size=beam_size,
        alpha=alpha,
        limits=limits,
        limits_per_beam=ops.repeat(limits, beam_size, axis=0)[:, None],
        prefix_ids=None if prefix_ids is None else tile_beams(ops.cast(prefix_ids, "int32"), beam_size),
        positions=ops.arange(max_length, dtype="int32")[None, None, :],
        eos_id=eos_id,
        pad_id=pad_id,
        bos_id=bos_id,
        early_stopping=early_stopping,
    )

    def cond(s):
        return ops.logical_and(ops.less(s.index, max_length), ops.logical_not(ops.all(s.done)))

    def body(s):
        return (_beam_step(step_fn, s, settings),)

    if first_step_fn is None:
        initial = _initial_beam_state(state, batch_size, max_length, beam_size, bos_id)
    else:
        # The K beams of a sentence are one until the first step has run: run it on B rows,
        # then tile its logits and state, and take the step as the loop would have.
        first_tokens = ops.full((batch_size, 1), bos_id, dtype="int32")
        logits, state = first_step_fn(first_tokens, ops.convert_to_tensor(0, "int32"), state)
        tiled = tile_beams((logits, state), beam_size)
        start = _initial_beam_state(tiled[1], batch_size, max_length, beam_size, bos_id, tile=False)
        initial = _beam_step(lambda token_ids, index, cache: tiled, start, settings)
    # The state travels as a 1-tuple: `while_loop` unpacks a tuple into arguments.
    (final,) = ops.while_loop(cond, body, (initial,))
    reached = ops.greater(final.finished_scores, _NEG_INF)
    finished_seq = ops.where(reached[:, :, None], final.finished_seq, 0)
    if return_all_beams:
        return finished_seq, final.finished_scores
    return finished_seq[:, 0], final.finished_scores[:, 0]


# ------------------------------------------------------------- model wrappers
def decode_lengths(model, encoder_inputs, max_length=None, max_extra=MAX_DECODE_EXTRA):
    """The output width L and the per-sentence limits `[B]` for decoding `encoder_inputs`.

    Without `max_length`: a sentence may produce its real (non-pad) source length +
    `max_extra` tokens (default `MAX_DECODE_EXTRA`, 50 in the paper, 6.1), and L is the
    padded source length + `max_extra`; both are capped at `config.max_length - 1` (BOS
    takes one of the model's positions). With `max_length`, every sentence's limit and L
    are `max_length`.

    Returns:
        `(width, limits)`: a Python int (a scalar tensor when the source length is
        dynamic, inside a TF graph) and int32 `[B]`.
    """
    model_length = model.config.max_length
    cap = model_length - 1
    if max_length is not None:
        if not checks.is_int(max_length) or not 1 <= max_length <= cap:
            raise ValueError(
                f"`max_length` must be an integer in [1, {cap}] (the model's max_length "
                f"{model_length} minus one position for BOS). Received: max_length={max_length!r}"
            )
        return max_length, ops.full((ops.shape(encoder_inputs)[0],), max_length, dtype="int32")
    checks.check_non_negative_int("max_extra", max_extra)
    source_length = ops.shape(encoder_inputs)[1]
    if isinstance(source_length, int):
        width = max(1, min(source_length + max_extra, cap))
    else:  # dynamic in a TF graph: stays a tensor that XLA resolves from the input shape
        width = ops.maximum(ops.minimum(source_length + max_extra, cap), 1)
    real_lengths = ops.sum(ops.cast(ops.not_equal(encoder_inputs, PAD_ID), "int32"), axis=1)
    limits = ops.clip(real_lengths + max_extra, 1, cap)
    return width, limits


def _check_encoder_inputs(encoder_inputs):
    encoder_inputs = ops.convert_to_tensor(encoder_inputs)
    if len(encoder_inputs.shape) != 2:
        raise ValueError(
            "`encoder_inputs` must be token ids of shape [batch, source_length]. "
            f"Received: shape={tuple(encoder_inputs.shape)}"
        )
    dtype = keras.backend.standardize_dtype(encoder_inputs.dtype)
    if "int" not in dtype:
        raise ValueError(f"`encoder_inputs` must be integer token ids. Received: dtype={dtype}")
    return ops.cast(encoder_inputs, "int32")


def _cached_step_fn(model, cross_caches, encoder_padding_mask):
    def step_fn(token_ids, index, self_caches):
        return model.decode_step(token_ids, index, self_caches, cross_caches, encoder_padding_mask)

    return step_fn


def _prepared_prefix_ids(model, prefix_ids, encoder_inputs, limits):
    """`prefix_ids` checked against the batch, the vocabulary and the limits; None stays None."""
    if prefix_ids is None:
        return None
    prefix_ids = check_prefix_ids(prefix_ids, ops.shape(encoder_inputs)[0], model.config.vocab_size)
    check_prefixes_fit(prefix_ids, limits)
    return prefix_ids


def token_search_decode(
    model, encoder_inputs, pick_tokens, max_length=None, *, max_extra=MAX_DECODE_EXTRA, prefix_ids=None
):
    """`token_search` over a `Transformer` through its key/value cache.

    Runs the encoder once, then `model.decode_step` one token at a time, each next
    token chosen by `pick_tokens(log_probs [B, V], index) -> int32 [B]` (see
    `token_search`). `greedy_decode` is this with the most probable token,
    `inference.sampling.sample_decode` with a random one. Arguments and results as for
    `greedy_decode`.
    """
    encoder_inputs = _check_encoder_inputs(encoder_inputs)
    width, limits = decode_lengths(model, encoder_inputs, max_length, max_extra)
    prefix_ids = _prepared_prefix_ids(model, prefix_ids, encoder_inputs, limits)
    encoder_outputs, encoder_padding_mask = model.encode(encoder_inputs)
    self_caches, cross_caches = model.initial_cache(encoder_outputs, width)
    return token_search(
        _cached_step_fn(model, cross_caches, encoder_padding_mask),
        self_caches,
        ops.shape(encoder_inputs)[0],
        width,
        pick_tokens,
        sentence_max_lengths=limits,
        prefix_ids=prefix_ids,
    )


def greedy_decode(model, encoder_inputs, max_length=None, *, max_extra=MAX_DECODE_EXTRA, prefix_ids=None):
    """Greedy decoding of a `Transformer` through its key/value cache.

    Runs the encoder once, then `model.decode_step` one token at a time
    (`greedy_search`). Lengths follow `decode_lengths`.

    Args:
        model: a `keras_transformer.Transformer`.
        encoder_inputs: int `[B, S]` source ids, padded with 0.
        max_length: optional int, a fixed limit for every sentence instead of the
            paper's source length + `max_extra`.
        max_extra: int >= 0. Defaults to `MAX_DECODE_EXTRA` (50, section 6.1).
        prefix_ids: optional int `[B, P]`, forced first output tokens padded with 0
            (`inference.prefixes`). Checked when eager: ids in the vocabulary, no BOS,
            and each prefix shorter than its sentence's limit (`ValueError` naming both
            lengths otherwise).

    Returns:
        `(tokens int32 [B, L], scores float32 [B])`: tokens end with EOS, then 0;
        scores are summed log-probabilities.

    Example:

    ```python
    tokens, scores = greedy_decode(model, keras.ops.array([[5, 6, 7, 0]]))
    ```
    """
    return token_search_decode(
        model, encoder_inputs, _most_probable, max_length, max_extra=max_extra, prefix_ids=prefix_ids
    )


def greedy_decode_uncached(
    model, encoder_inputs, max_length=None, *, max_extra=MAX_DECODE_EXTRA, prefix_ids=None
):
    """Greedy decoding that reruns the whole decoder over the output so far at every step.

    The reference for `greedy_decode` (same arguments and results) and the no-cache
    baseline of the benchmarks: the encoder runs once, but each step decodes the full
    `[B, L]` buffer teacher-forced (`model.decode`; the causal mask hides what follows
    the step) and keeps the logits at the step's position.
    """
    encoder_inputs = _check_encoder_inputs(encoder_inputs)
    width, limits = decode_lengths(model, encoder_inputs, max_length, max_extra)
    prefix_ids = _prepared_prefix_ids(model, prefix_ids, encoder_inputs, limits)
    encoder_outputs, encoder_padding_mask = model.encode(encoder_inputs)
    batch = ops.shape(encoder_inputs)[0]
    positions = ops.arange(width, dtype="int32")[None, :]

    def step_fn(token_ids, index, buffer):
        buffer = _write_column(buffer, index, token_ids, positions)
        logits = model.decode(buffer, encoder_outputs, encoder_padding_mask)
        return ops.take(logits, index, axis=1), buffer

    return greedy_search(
        step_fn,
        ops.zeros((batch, width), "int32"),
        batch,
        width,
        sentence_max_lengths=limits,
        prefix_ids=prefix_ids,
    )


def beam_decode(
    model,
    encoder_inputs,
    beam_size=BEAM_SIZE,
    alpha=LENGTH_PENALTY,
    max_length=None,
    *,
    max_extra=MAX_DECODE_EXTRA,
    return_all_beams=False,
    prefix_ids=None,
    early_stopping=False,
):
    """Beam search decoding of a `Transformer` through its key/value cache (6.1).

    Runs the encoder once, projects its output once per decoder layer for
    cross-attention, and calls `beam_search` with `model.decode_step`: the first step on
    one row per sentence, the others on the rows of the beams (the encoder's output and
    caches tiled to them); the self-attention caches are the search state, re-gathered
    by beam origin each step. Lengths follow `decode_lengths`.

    Args:
        model: a `keras_transformer.Transformer`.
        encoder_inputs: int `[B, S]` source ids, padded with 0.
        beam_size: int, K. Defaults to `BEAM_SIZE` (4, section 6.1).
        alpha: float >= 0. Defaults to `LENGTH_PENALTY` (0.6, section 6.1).
        max_length: optional int, a fixed limit for every sentence.
        max_extra: int >= 0. Defaults to `MAX_DECODE_EXTRA` (50, section 6.1).
        return_all_beams: bool, return all `beam_size` hypotheses, best first (the
            n-best list).
        prefix_ids: optional int `[B, P]`, forced first output tokens, as for
            `greedy_decode`.
        early_stopping: bool, stop a sentence once `beam_size` hypotheses have
            finished after its most probable extension ended (see `beam_search`).
            Defaults to False.

    Returns:
        `(tokens int32 [B, L], scores float32 [B])` (or `[B, K, L]`, `[B, K]`); scores
        are log-probabilities divided by `((5 + len) / 6) ** alpha`.

    Example:

    ```python
    tokens, scores = beam_decode(model, keras.ops.array([[5, 6, 7, 0]]))
    ```
    """
    _check_beam_arguments(beam_size, alpha)
    encoder_inputs = _check_encoder_inputs(encoder_inputs)
    width, limits = decode_lengths(model, encoder_inputs, max_length, max_extra)
    prefix_ids = _prepared_prefix_ids(model, prefix_ids, encoder_inputs, limits)
    encoder_outputs, encoder_padding_mask = model.encode(encoder_inputs)
    self_caches, cross_caches = model.initial_cache(encoder_outputs, width)
    step_fn = _cached_step_fn(
        model, tile_beams(cross_caches, beam_size), tile_beams(encoder_padding_mask, beam_size)
    )
    return beam_search(
        step_fn,
        self_caches,
        ops.shape(encoder_inputs)[0],
        width,
        beam_size=beam_size,
        alpha=alpha,
        sentence_max_lengths=limits,
        prefix_ids=prefix_ids,
        return_all_beams=return_all_beams,
        early_stopping=early_stopping,
        first_step_fn=_cached_step_fn(model, cross_caches, encoder_padding_mask),
    )


__all__ = [
    "BEAM_SIZE",
    "LENGTH_PENALTY",
    "MAX_DECODE_EXTRA",
    "DECODE_METHODS",
    "GreedyState",
    "BeamState",
    "length_penalty",
    "greedy_search",
    "token_search",
    "beam_search",
    "tile_beams",
    "decode_lengths",
    "token_search_decode",
    "greedy_decode",
    "greedy_decode_uncached",
    "beam_decode",
]
