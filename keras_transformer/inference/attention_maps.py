"""Attention weights of a sentence pair, per layer and head, with the tokens they join.

`attention_maps` runs the model teacher-forced on one (source, target) pair and keeps
every attention probability matrix: the encoder's self-attention, the decoder's masked
self-attention and its attention over the encoder (Vaswani et al., 2017, 3.2.3), from
the same layer objects that training built (`Transformer.encode` / `decode` with
`return_attention_scores=True`). `plot_attention_maps`
draws them as one PNG.
"""

import dataclasses
import os

import keras
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from keras_transformer.special_tokens import BOS_ID, EOS_ID


@dataclasses.dataclass(frozen=True)
class AttentionMaps:
    """Attention probabilities of one sentence pair.

    Queries are rows, keys columns; each row sums to 1 over the keys it may see.

    Args:
        source_tokens: list of str, the encoder input's pieces, EOS last (S of them).
        target_tokens: list of str, the decoder input's pieces, BOS first (T of them).
        encoder_self_attention: list (one per encoder layer) of float32 `[N, S, S]`.
        decoder_self_attention: list (one per decoder layer) of float32 `[N, T, T]`.
        cross_attention: list (one per decoder layer) of float32 `[N, T, S]`.
    """

    source_tokens: list
    target_tokens: list
    encoder_self_attention: list
    decoder_self_attention: list
    cross_attention: list


def attention_maps(model, tokenizer, source, target=None):
    """The attention maps of `model` reading `source` and producing `target`.

    The source is tokenized with EOS appended and the target with BOS prepended, as in
    training; both are cut to `config.max_length`. Without a `target`, the model's own
    greedy translation of the source is used.

    Args:
        model: a `keras_transformer.Transformer`.
        tokenizer: its `SubwordTokenizer`.
        source: str, the source sentence.
        target: str or None, the target sentence.

    Returns:
        An `AttentionMaps`.

    Example:

    ```python
    maps = attention_maps(model, tokenizer, "the cat sat", "die Katze saß")
    maps.cross_attention[0].shape  # [heads, target tokens + BOS, source tokens + EOS]
    # (4, 5, 4)
    ```
    """
    for name, value in (("source", source), ("target", target)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"`{name}` must be a str. Received: {type(value).__name__}")
    if not source.strip():
        raise ValueError("`source` is empty; attention maps need at least one token.")
    limit = model.config.max_length - 1  # room for EOS / BOS
    source_ids = tokenizer.encode([source])[0][:limit] + [EOS_ID]
    encoder_inputs = np.array([source_ids], "int32")
    encoder_outputs, padding_mask, encoder_scores = model.encode(
        encoder_inputs, return_attention_scores=True
    )
    if target is None:
        from keras_transformer.inference.compiled import CompiledDecoder

        # Compiled (or, on PyTorch, run without autograd): one sentence, one trace.
        tokens, _ = CompiledDecoder(model, "greedy", jit_compile=False)(encoder_inputs)
        target_ids = [int(i) for i in keras.ops.convert_to_numpy(tokens)[0] if i not in (0, EOS_ID)]
    else:
        target_ids = tokenizer.encode([target])[0]
    decoder_ids = [BOS_ID] + target_ids[:limit]
    _, decoder_scores = model.decode(
        np.array([decoder_ids], "int32"),
        encoder_outputs,
        padding_mask,
        return_attention_scores=True,
    )

    def first(scores):
        return keras.ops.convert_to_numpy(keras.ops.cast(scores, "float32"))[0]

    return AttentionMaps(
        source_tokens=[tokenizer.id_to_piece(i) for i in source_ids],
        target_tokens=[tokenizer.id_to_piece(i) for i in decoder_ids],
        encoder_self_attention=[first(scores) for scores in encoder_scores],
        decoder_self_attention=[first(scores["self_attention"]) for scores in decoder_scores],
        cross_attention=[first(scores["cross_attention"]) for scores in decoder_scores],
    )


# ------------------------------------------------------------------- drawing
# (map attribute, title) of each kind of attention, in the order drawn.
_ATTENTION_KINDS = (
    ("encoder_self_attention", "encoder self-attention"),
    ("decoder_self_attention", "decoder self-attention"),
    ("cross_attention", "cross-attention"),
)
# Inches per token on a heat map's axes, and the least size of one heat map.
_INCHES_PER_TOKEN = 0.28
_MIN_PANEL_INCHES = 2.4


def plot_attention_maps(maps, png_path, *, dpi=100, cmap="viridis"):
    """Draws every attention map of a sentence pair as heat maps in one PNG.

    One row per layer of each kind (encoder self-attention, decoder self-attention,
    cross-attention, in that order) and one column per head; each heat map has the
    query tokens down its side and the key tokens along its bottom, and shares one
    0-1 colour scale with the others.

    Args:
        maps: a `keras_transformer.attention_maps.AttentionMaps` (anything with its
            attributes: token lists and per-layer `[N, Q, K]` arrays).
        png_path: str or path-like, the image to write (directories are created).
        dpi: int, resolution of the PNG.
        cmap: str, a matplotlib colormap name.

    Returns:
        str, `png_path`.

    Raises:
        ValueError: a map's shape does not match the token lists.

    Example:

    ```python
    maps = attention_maps(model, tokenizer, "the cat sat", "die Katze saß")
    plot_attention_maps(maps, "attention.png")
    # 'attention.png'
    ```
    """
    rows = _figure_rows(maps)
    heads = max(scores.shape[0] for _, scores, _, _ in rows)
    longest = max(len(maps.source_tokens), len(maps.target_tokens))
    panel = max(_MIN_PANEL_INCHES, _INCHES_PER_TOKEN * longest + 1.0)
    figure = Figure(figsize=(panel * heads + 1.0, panel * len(rows)), layout="constrained")
    FigureCanvasAgg(figure)
    grid = figure.subplots(len(rows), heads, squeeze=False)
    image = None
    for row, (title, scores, queries, keys) in enumerate(rows):
        for head in range(heads):
            axes = grid[row][head]
            if head >= scores.shape[0]:
                axes.set_axis_off()
                continue
            image = axes.imshow(scores[head], cmap=cmap, vmin=0.0, vmax=1.0, aspect="auto")
            axes.set_title(f"{title}, head {head + 1}", fontsize=8)
            axes.set_xticks(range(len(keys)), keys, rotation=90, fontsize=7)
            axes.set_yticks(range(len(queries)), queries, fontsize=7)
    figure.colorbar(image, ax=grid, shrink=0.6, label="attention weight")
    png_path = os.fspath(png_path)
    os.makedirs(os.path.dirname(png_path) or ".", exist_ok=True)
    figure.savefig(png_path, dpi=dpi)
    return png_path


def _figure_rows(maps):
    """`(title, scores [N, Q, K], query tokens, key tokens)` per layer of each kind, checked.

    Raises:
        ValueError: a map's shape does not match the token lists, or there is no map.
    """
    tokens = {"source": list(maps.source_tokens), "target": list(maps.target_tokens)}
    axes_tokens = {
        "encoder_self_attention": ("source", "source"),
        "decoder_self_attention": ("target", "target"),
        "cross_attention": ("target", "source"),
    }
    rows = []
    for attribute, title in _ATTENTION_KINDS:
        queries, keys = (tokens[side] for side in axes_tokens[attribute])
        for layer, scores in enumerate(getattr(maps, attribute)):
            scores = np.asarray(scores, dtype="float32")
            if scores.ndim != 3 or scores.shape[1:] != (len(queries), len(keys)):
                raise ValueError(
                    f"{attribute}[{layer}] must have shape [heads, {len(queries)}, {len(keys)}] "
                    f"(query and key tokens). Received: shape={scores.shape}"
                )
            rows.append((f"{title}, layer {layer + 1}", scores, queries, keys))
    if not rows:
        raise ValueError("`maps` holds no attention map to draw.")
    return rows


__all__ = ["AttentionMaps", "attention_maps", "plot_attention_maps"]
