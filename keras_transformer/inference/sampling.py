"""Sampling: a random next token at every step, from the model's filtered distribution.

For back-translation (Edunov et al., 2018: sampled synthetic sources train better models
than beam search outputs) and for diverse outputs. Each step takes the model's
next-token log-probabilities (PAD and BOS removed, EOS forced at the length limit and
prefix tokens forced, as in every search of `decoding`) and

1. divides them by the `temperature` T: T < 1 sharpens the distribution, T > 1 flattens
   it, and T -> 0 leaves only the most probable token (greedy search);
2. keeps the `top_k` most probable tokens (Fan et al., 2018): `top_k=1` is greedy search;
3. keeps the nucleus (Holtzman et al., 2020): the fewest most probable tokens whose
   probability reaches `top_p`;

then renormalises and draws one token. The order is Hugging Face `generate`'s
(temperature, then top-k, then top-p on what is left). Tokens tied with the last one
kept are kept too, so a filter may keep more than `top_k` tokens when probabilities tie.

The draw is Gumbel-max: `argmax(log_probs + G)` with `G = -log(-log(U))`, U uniform, is
an exact sample of `softmax(log_probs)`. U comes from `keras.random.uniform` with a
stateless seed, `seed + [0, step]`, computed inside the loop: a `SeedGenerator`'s state
is a variable, which `jax.lax.while_loop` cannot update, and an int seed would repeat
the same numbers at every step. So sampling runs through the cached decoder, compiled
like greedy search (XLA, `jax.jit`, eager PyTorch).

The same seed, inputs and backend give the same tokens; another backend draws other
numbers (each has its own generator), and on TensorFlow an XLA-compiled search draws
other numbers than a plain graph. Scores are the model's summed log-probabilities of
the drawn tokens (temperature 1, unfiltered), as greedy search's are.

Shapes use B batch, V vocabulary.
"""

import keras
import numpy as np
from keras import ops

from keras_transformer import checks
from keras_transformer.inference import decoding

TEMPERATURE = 1.0  # the model's own distribution
TOP_P = 1.0  # the whole distribution: no nucleus filtering

_NEG_INF = float("-inf")
# The smallest uniform draw: -log(-log(tiny)) = -4.5, so no token gets a -inf Gumbel
# noise (a forced token must win its row, whatever the draw).
_SMALLEST_UNIFORM = float(np.finfo("float32").tiny)
_STEP = (0, 1)  # the seed of step i is seed + i * _STEP


# -------------------------------------------------------------------- arguments
def check_sampling_arguments(temperature=TEMPERATURE, top_k=None, top_p=TOP_P, seed=None):
    """Raises ValueError naming the first bad sampling argument.

    `temperature` must be a finite number > 0, `top_k` None or an int >= 1, `top_p` a
    number in (0, 1], `seed` None or an int.
    """
    checks.check_positive_number("temperature", temperature)
    if top_k is not None:
        checks.check_positive_int("top_k", top_k)
    if not checks.is_number(top_p) or not 0.0 < top_p <= 1.0:
        raise ValueError(f"`top_p` must be a number in (0, 1]. Received: top_p={top_p!r}")
    if seed is not None and not checks.is_int(seed):
        raise ValueError(f"`seed` must be an integer or None. Received: seed={seed!r}")


# ---------------------------------------------------------------------- filters
def apply_temperature(log_probs, temperature):
    """Log-probabilities of `softmax(log_probs / temperature)`, float32 `[..., V]`.

    The row's maximum is subtracted first, so a tiny temperature gives -inf (or very
    negative values) to the others, never NaN.

    Example:
    >>> probs = apply_temperature(keras.ops.log([[0.6, 0.3, 0.1]]), 0.5)
    >>> np.round(keras.ops.convert_to_numpy(keras.ops.exp(probs)).astype(float), 4).tolist()  # p^2 / sum p^2
    [[0.7826, 0.1957, 0.0217]]
    """
    log_probs = ops.cast(log_probs, "float32")
    shifted = log_probs - ops.max(log_probs, axis=-1, keepdims=True)
    return ops.log_softmax(shifted / temperature, axis=-1)


def top_k_filter(log_probs, k):
    """Log-probabilities renormalised over the `k` most probable tokens of each row; -inf elsewhere.

    Example:
    >>> probs = top_k_filter(keras.ops.log([[0.5, 0.3, 0.15, 0.05]]), 2)
    >>> np.round(keras.ops.convert_to_numpy(keras.ops.exp(probs)).astype(float), 4).tolist()
    [[0.625, 0.375, 0.0, 0.0]]
    """
    log_probs = ops.cast(log_probs, "float32")
    if k >= log_probs.shape[-1]:
        return ops.log_softmax(log_probs, axis=-1)
    kth_best = ops.top_k(log_probs, k=k)[0][..., -1:]
    kept = ops.where(ops.greater_equal(log_probs, kth_best), log_probs, _NEG_INF)
    return ops.log_softmax(kept, axis=-1)


def top_p_filter(log_probs, p):
    """Log-probabilities renormalised over the nucleus of each row; -inf elsewhere.

    The nucleus is the fewest most probable tokens whose probabilities sum to `p` or
    more (Holtzman et al., 2020): a token is kept when the tokens more probable than it
    sum to less than `p`, so the most probable one always is.

    Example:
    >>> log_probs = keras.ops.log([[0.5, 0.3, 0.15, 0.05]])
    >>> np.round(keras.ops.convert_to_numpy(keras.ops.exp(top_p_filter(log_probs, 0.75))).astype(float), 4).tolist()
    [[0.625, 0.375, 0.0, 0.0]]
    >>> np.round(keras.ops.convert_to_numpy(keras.ops.exp(top_p_filter(log_probs, 0.85))).astype(float), 4).tolist()
    [[0.5263, 0.3158, 0.1579, 0.0]]
    """
    log_probs = ops.cast(log_probs, "float32")
    if p >= 1.0:
        return ops.log_softmax(log_probs, axis=-1)
    probs = ops.softmax(log_probs, axis=-1)
    descending = ops.top_k(probs, k=log_probs.shape[-1])[0]
    mass_before = ops.cumsum(descending, axis=-1) - descending
    in_nucleus = ops.less(mass_before, p)
    smallest_kept = ops.min(ops.where(in_nucleus, descending, 2.0), axis=-1, keepdims=True)
    kept = ops.where(ops.greater_equal(probs, smallest_kept), log_probs, _NEG_INF)
    return ops.log_softmax(kept, axis=-1)


def sampling_log_probs(log_probs, temperature=TEMPERATURE, top_k=None, top_p=TOP_P):
    """The distribution a token is drawn from: temperature, then top-k, then top-p.

    Filters at their neutral value (temperature 1, no `top_k`, `top_p` 1) are skipped,
    so plain sampling costs one log-softmax.

    Example:
    >>> log_probs = keras.ops.log([[0.5, 0.3, 0.15, 0.05]])
    >>> filtered = sampling_log_probs(log_probs, temperature=0.5, top_k=3, top_p=0.9)
    >>> np.round(keras.ops.convert_to_numpy(keras.ops.exp(filtered)).astype(float), 4).tolist()  # p^2 of the top 2
    [[0.7353, 0.2647, 0.0, 0.0]]
    """
    log_probs = ops.cast(log_probs, "float32")
    if temperature != 1.0:
        log_probs = apply_temperature(log_probs, temperature)
    if top_k is not None:
        log_probs = top_k_filter(log_probs, top_k)
    if top_p < 1.0:
        log_probs = top_p_filter(log_probs, top_p)
    return log_probs


# ------------------------------------------------------------------------ draws
class _StatelessSeed(keras.random.SeedGenerator):
    """A `[2]` seed tensor handed to `keras.random` where it expects a `SeedGenerator`.

    `keras.random` takes an int (a constant) or a `SeedGenerator` (whose state variable a
    compiled loop cannot update); this stands for a generator whose next seed is the
    tensor computed in the loop. It holds no variable, so nothing is created or assigned
    inside a trace.
    """

    def __init__(self, seed):  # noqa: D107  (no super().__init__: no state variable)
        self._seed = seed

    def next(self, ordered=True):
        del ordered
        if keras.backend.backend() == "jax":  # JAX keys are uint32; values are < 2**31
            return ops.cast(self._seed, "uint32")
        return self._seed


def seed_tensor(seed):
    """int32 `[2]` seed from an int (`[seed mod 2**31, 0]`) or a `[2]` integer tensor."""
    if checks.is_int(seed):
        return ops.convert_to_tensor([int(seed) % 2**31, 0], "int32")
    seed = ops.cast(ops.convert_to_tensor(seed), "int32")
    if tuple(seed.shape) != (2,):
        raise ValueError(
            f"`seed` must be an integer or an integer tensor of shape [2]. Received: shape={tuple(seed.shape)}"
        )
    return seed


def sample_tokens(log_probs, seed, temperature=TEMPERATURE, top_k=None, top_p=TOP_P):
    """int32 `[B]`: one token per row of `log_probs [B, V]`, drawn after the filters.

    Args:
        log_probs: float `[B, V]`; -inf entries are never drawn.
        seed: int32 `[2]` tensor (`seed_tensor`); the same seed gives the same tokens.
        temperature, top_k, top_p: as for `sampling_log_probs`.
    """
    filtered = sampling_log_probs(log_probs, temperature, top_k, top_p)
    uniform = keras.random.uniform(
        ops.shape(filtered), minval=_SMALLEST_UNIFORM, maxval=1.0, seed=_StatelessSeed(seed)
    )
    gumbel = -ops.log(-ops.log(uniform))
    return ops.cast(ops.argmax(filtered + gumbel, axis=-1), "int32")


def _token_sampler(seed, temperature, top_k, top_p):
    """`pick_tokens(log_probs, index)` for `decoding.token_search`: a fresh seed per step."""
    seed = seed_tensor(seed)
    step = ops.convert_to_tensor(_STEP, "int32")

    def pick_tokens(log_probs, index):
        return sample_tokens(log_probs, seed + step * index, temperature, top_k, top_p)

    return pick_tokens


# ---------------------------------------------------------------------- searches
def sample_search(
    step_fn,
    state,
    batch_size,
    max_length,
    seed,
    *,
    temperature=TEMPERATURE,
    top_k=None,
    top_p=TOP_P,
    sentence_max_lengths=None,
    prefix_ids=None,
):
    """`decoding.token_search` drawing each next token (module docstring).

    Args:
        step_fn, state, batch_size, max_length, sentence_max_lengths, prefix_ids: as for
            `decoding.greedy_search`.
        seed: int, or int32 `[2]` tensor (so a compiled search can take it as an input).
        temperature: float > 0. Defaults to 1.
        top_k: optional int >= 1.
        top_p: float in (0, 1]. Defaults to 1 (no nucleus filtering).

    Returns:
        `(tokens int32 [B, L], scores float32 [B])`, scores being the model's summed
        log-probabilities of the drawn tokens.

    Example:
    >>> logits = keras.ops.log(keras.ops.array([[.0, .1, .0, .5, .4]]))
    >>> step_fn = lambda token_ids, index, state: (logits, state)
    >>> tokens, _ = sample_search(step_fn, (), 1, 3, seed=0, top_k=1)  # top_k=1: greedy
    >>> keras.ops.convert_to_numpy(tokens).tolist()
    [[3, 0, 0]]
    """
    check_sampling_arguments(temperature, top_k, top_p)
    return decoding.token_search(
        step_fn,
        state,
        batch_size,
        max_length,
        _token_sampler(seed, temperature, top_k, top_p),
        sentence_max_lengths=sentence_max_lengths,
        prefix_ids=prefix_ids,
    )


def sample_decode(
    model,
    encoder_inputs,
    seed,
    max_length=None,
    *,
    temperature=TEMPERATURE,
    top_k=None,
    top_p=TOP_P,
    max_extra=decoding.MAX_DECODE_EXTRA,
    prefix_ids=None,
):
    """Sampling decoding of a `Transformer` through its key/value cache.

    `decoding.greedy_decode` with each next token drawn (module docstring); lengths
    and prefixes as there.

    Args:
        model: a `keras_transformer.Transformer`.
        encoder_inputs: int `[B, S]` source ids, padded with 0.
        seed: int, or int32 `[2]` tensor.
        max_length, max_extra, prefix_ids: as for `decoding.greedy_decode`.
        temperature, top_k, top_p: as for `sample_search`.

    Returns:
        `(tokens int32 [B, L], scores float32 [B])`.

    Example:

    ```python
    tokens, scores = sample_decode(model, keras.ops.array([[5, 6, 7, 0]]), seed=1, top_p=0.9)
    ```
    """
    check_sampling_arguments(temperature, top_k, top_p)
    return decoding.token_search_decode(
        model,
        encoder_inputs,
        _token_sampler(seed, temperature, top_k, top_p),
        max_length,
        max_extra=max_extra,
        prefix_ids=prefix_ids,
    )


__all__ = [
    "TEMPERATURE",
    "TOP_P",
    "check_sampling_arguments",
    "apply_temperature",
    "top_k_filter",
    "top_p_filter",
    "sampling_log_probs",
    "seed_tensor",
    "sample_tokens",
    "sample_search",
    "sample_decode",
]
