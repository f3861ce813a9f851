"""PNG plots: training curves from a run's CSV log, and attention maps.

Figures are drawn with matplotlib's object API on its Agg canvas (no `pyplot`, no
global backend switch), so plotting works on machines without a display and does not
change the backend of a user's own session.
"""

import csv
import math
import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter

_PANELS_PER_ROW = 3
# (title, [(column, label)]) for each panel; a panel without any of its columns is skipped.
_PANELS = (
    ("loss", [("loss", "train"), ("val_loss", "validation")]),
    ("token accuracy", [("masked_accuracy", "train"), ("val_masked_accuracy", "validation")]),
    ("perplexity", [("perplexity", "train"), ("val_perplexity", "validation")]),
    ("learning rate", [("learning_rate", "schedule")]),
    ("validation BLEU", [("val_bleu", "greedy, sample")]),
)


def read_csv_log(csv_path):
    """The columns of a `CSVLogger` file: `{column: [float or nan per row]}`.

    "NA" and empty cells (epochs where a value was not computed) read as NaN.
    """
    with open(csv_path, newline="", encoding="utf-8") as file:
        rows = list(csv.DictReader(file))
    if not rows:
        raise ValueError(f"{csv_path} has no rows. Expected a CSV log with at least one epoch.")
    columns = {}
    for name in rows[0]:
        values = []
        for row in rows:
            try:
                values.append(float(row[name]))
            except (TypeError, ValueError):
                values.append(math.nan)
        columns[name] = values
    return columns


def plot_training_curves(csv_path, png_path):
    """Draws loss, accuracy, perplexity, learning rate and BLEU per epoch into a PNG.

    Reads the `CSVLogger` file of a run (`training_log.csv`) and draws one panel per
    quantity found in it, train and validation together; epochs are 1-based on the x
    axis. Missing columns are skipped, so any Keras CSV log works.

    Args:
        csv_path: str or path-like, the CSV log.
        png_path: str or path-like, the image to write (directories are created).

    Returns:
        str, `png_path`.

    Example:
    >>> plot_training_curves("saved_models/demo/training_log.csv", "curves.png")
    """
    columns = read_csv_log(csv_path)
    epochs = [int(value) + 1 for value in columns.get("epoch", [])] or list(
        range(1, len(next(iter(columns.values()))) + 1)
    )
    panels = [
        (title, [(columns[name], label) for name, label in series if name in columns])
        for title, series in _PANELS
    ]
    panels = [(title, series) for title, series in panels if series]
    if not panels:
        raise ValueError(
            f"{csv_path} has none of the columns plotted ({[s[0] for _, ss in _PANELS for s in ss]}). "
            f"Received columns: {sorted(columns)}"
        )
    columns_count = min(len(panels), _PANELS_PER_ROW)
    rows_count = math.ceil(len(panels) / columns_count)
    figure = Figure(figsize=(4.2 * columns_count, 3.4 * rows_count), layout="constrained")
    FigureCanvasAgg(figure)
    for index, (title, series) in enumerate(panels):
        axes = figure.add_subplot(rows_count, columns_count, index + 1)
        for values, label in series:
            points = [(e, v) for e, v in zip(epochs, values) if not math.isnan(v)]
            if points:
                xs, ys = zip(*points)
                axes.plot(xs, ys, marker="o", markersize=3, label=label)
        axes.set_title(title)
        axes.set_xlabel("epoch")
        axes.grid(alpha=0.3)
        if title in ("perplexity", "learning rate") and _all_positive(series):
            axes.set_yscale("log")
            # Plain numbers ("1.2", "6e-04") instead of matplotlib's "1.2 x 10^0" labels.
            for axis_formatter in (axes.yaxis.set_major_formatter, axes.yaxis.set_minor_formatter):
                axis_formatter(FormatStrFormatter("%.3g"))
        if len(series) > 1:
            axes.legend()
    png_path = os.fspath(png_path)
    os.makedirs(os.path.dirname(png_path) or ".", exist_ok=True)
    figure.savefig(png_path, dpi=100)
    return png_path


def _all_positive(series):
    return all(v > 0 for values, _ in series for v in values if not math.isnan(v))


# --------------------------------------------------------------- attention maps
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
    >>> maps = attention_maps(model, tokenizer, "the cat sat", "die Katze saß")
    >>> plot_attention_maps(maps, "attention.png")
    'attention.png'
    """
    import numpy as np

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
    heads = max(scores.shape[0] for _, scores, _, _ in rows)
    longest = max(len(tokens["source"]), len(tokens["target"]))
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


__all__ = ["plot_training_curves", "read_csv_log", "plot_attention_maps"]
