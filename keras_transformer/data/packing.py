"""Sequence packing: several sentence pairs share one row, so batches carry little padding.

Token-budget batches of bucketed pairs still pad each pair to its bucket boundary; on
Multi30k about a fifth of the tokens a model computes on are padding. Packing puts
several pairs end to end in one row of `length` tokens (both sides), and says which
pair each token belongs to:

- `encoder_segment_ids` / `decoder_segment_ids`: 1, 2, 3, ... per pair in the row, 0
  on padding. The model lets a token attend only to tokens of its own pair (encoder
  self-attention, causal decoder self-attention and cross-attention alike).
- `encoder_positions` / `decoder_positions`: positions restart at 0 for each pair, so
  a pair gets the position encodings it would get alone.

The labels are each pair's `target + EOS` end to end, so the loss counts every real
token once. This is how flax's WMT example packs (`input_pipeline.pack_dataset`); the
difference is that rows are made once, from one seeded shuffle, and cached: the number
of batches is then known before training (Keras sizes epochs and progress bars by it),
and each epoch reshuffles the rows.

Greedy first fit over a few open rows, written with `tf.data.Dataset.scan`, so it
streams: a pair goes into the first open row with room on both sides; when none has
room, the fullest row is emitted and the pair starts a new one.
"""

import tensorflow as tf

from keras_transformer.input_names import MODEL_INPUTS, PACKING_INPUTS

# The functions the data modules hand to tf.data are written in TensorFlow ops with no
# Python branch on a tensor, so AutoGraph has nothing to rewrite in them; left to it, it
# would still parse and transform each one, and the tokenizers of tensorflow-text below
# them, once a process: ~1.5 s of a first `make_dataset` on a 2-core AMD EPYC.
graph_function = tf.autograph.experimental.do_not_convert

PACKED_FEATURES = MODEL_INPUTS + PACKING_INPUTS
"""The input keys of a packed batch, in the model's input dict."""

# Rows kept open at once: more rows fill better, each costs a little per pair.
DEFAULT_OPEN_ROWS = 8

_ROW_KEYS = PACKED_FEATURES + ("labels",)
_SIDES = {
    "encoder_inputs": ("source", "encoder_segment_ids", "encoder_positions"),
    "decoder_inputs": ("target", "decoder_segment_ids", "decoder_positions"),
}


def pack_examples(examples, length, open_rows=DEFAULT_OPEN_ROWS):
    """Packs `to_model_inputs` examples into rows of `length` tokens on both sides.

    Args:
        examples: `tf.data.Dataset` of `({"encoder_inputs": [S], "decoder_inputs": [T]},
            labels [T])`, int32, each no longer than `length` on either side.
        length: int, the tokens of a row on each side.
        open_rows: int >= 1, rows filled at once.

    Returns:
        `tf.data.Dataset` of `(inputs, labels)`: `inputs` holds the `PACKED_FEATURES`,
        each an int32 `[length]` vector; labels `[length]`. Padding is 0 everywhere.

    Example:
    >>> pairs = tf.data.Dataset.from_tensors(({"encoder_inputs": [7, 3], "decoder_inputs": [2, 8]}, [8, 3]))
    >>> inputs, labels = next(iter(pack_examples(pairs.repeat(2), length=5)))
    >>> inputs["encoder_inputs"].numpy().tolist(), inputs["encoder_segment_ids"].numpy().tolist()
    ([7, 3, 7, 3, 0], [1, 1, 2, 2, 0])
    >>> inputs["decoder_positions"].numpy().tolist(), labels.numpy().tolist()
    ([0, 1, 0, 1, 0], [8, 3, 8, 3, 0])
    """
    if not isinstance(open_rows, int) or isinstance(open_rows, bool) or open_rows < 1:
        raise ValueError(f"`open_rows` must be an integer >= 1. Received: open_rows={open_rows!r}")

    @graph_function
    def as_model_inputs(valid, row):
        del valid
        return {key: row[key] for key in PACKED_FEATURES}, row["labels"]

    return (
        _marked_stream(examples, open_rows)
        .scan(_empty_rows(open_rows, length), _packing_step(length))
        .filter(graph_function(lambda valid, row: valid))
        .map(as_model_inputs)
    )


def _marked_stream(examples, rows):
    """`(source, target, labels, flush)` per pair (flush -1), then one flush marker per row.

    The scan cannot see the end of its input, so one marker per open row follows the
    pairs and makes the scan emit that row: its `flush` is the row's index.
    """

    @graph_function
    def as_parts(inputs, labels):
        return inputs["encoder_inputs"], inputs["decoder_inputs"], labels, tf.constant(-1, tf.int32)

    @graph_function
    def flush_marker(index):
        empty = tf.zeros([0], tf.int32)
        return empty, empty, empty, tf.cast(index, tf.int32)

    return examples.map(as_parts).concatenate(tf.data.Dataset.range(rows).map(flush_marker))


def _empty_rows(rows, length):
    """The scan's first state: `rows` open rows of `length` zeros, nothing used."""
    state = {key: tf.zeros([rows, length], tf.int32) for key in _ROW_KEYS}
    state.update(
        source_used=tf.zeros([rows], tf.int32),
        target_used=tf.zeros([rows], tf.int32),
        pairs=tf.zeros([rows], tf.int32),
    )
    return state


def _packing_step(length):
    """The scan step: place a pair in the first open row with room, or emit a row.

    Returns `step(state, element) -> (state, (emitted_valid, emitted_row))`; a row is
    emitted when no open row has room for the pair (the fullest) or at a flush marker
    (the row it names), and the emitted row is valid when it holds a pair.
    """

    @graph_function
    def step(state, element):
        source, target, labels, flush = element
        source_length, target_length = tf.size(source), tf.size(target)
        fits = tf.logical_and(
            state["source_used"] + source_length <= length,
            state["target_used"] + target_length <= length,
        )
        is_flush = flush >= 0
        emit = tf.logical_or(is_flush, tf.logical_not(tf.reduce_any(fits)))
        fullest = tf.argmax(state["source_used"] + state["target_used"], output_type=tf.int32)
        first_fit = tf.argmax(tf.cast(fits, tf.int32), output_type=tf.int32)
        row = tf.where(is_flush, flush, tf.where(emit, fullest, first_fit))

        emitted = {key: state[key][row] for key in _ROW_KEYS}
        emitted_valid = tf.logical_and(emit, state["pairs"][row] > 0)
        state = {key: tf.where(emit, cleared, state[key]) for key, cleared in _cleared(state, row).items()}
        state = _placed(state, row, source, target, labels, length)
        return state, (emitted_valid, emitted)

    return step


def _cleared(state, row):
    """The state with row `row` emptied (every buffer zero there, nothing used)."""
    cleared = {}
    for key, value in state.items():
        zero = tf.zeros_like(value[row])
        cleared[key] = tf.tensor_scatter_nd_update(value, [[row]], zero[None])
    return cleared


def _placed(state, row, source, target, labels, length):
    """The state with a pair appended to row `row` (an empty flush marker adds nothing)."""
    is_pair = tf.size(target) > 0
    segment = state["pairs"][row] + 1
    placed = dict(state)

    def append(key, values, offset):
        size = tf.size(values)
        padded = tf.pad(values, [[offset, length - offset - size]])
        placed[key] = tf.tensor_scatter_nd_add(placed[key], [[row]], padded[None])

    for key, (side, segment_key, position_key) in _SIDES.items():
        values = source if side == "source" else target
        offset = state[f"{side}_used"][row]
        append(key, values, offset)
        append(segment_key, tf.fill(tf.shape(values), segment), offset)
        append(position_key, tf.range(tf.size(values), dtype=tf.int32), offset)
        if side == "target":
            append("labels", labels, offset)
        used = f"{side}_used"
        placed[used] = tf.tensor_scatter_nd_add(state[used], [[row]], [tf.size(values)])
    placed["pairs"] = tf.tensor_scatter_nd_add(state["pairs"], [[row]], [tf.cast(is_pair, tf.int32)])
    return placed


__all__ = ["PACKED_FEATURES", "DEFAULT_OPEN_ROWS", "pack_examples"]
