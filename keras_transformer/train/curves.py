"""The training-curve PNG: loss, accuracy, perplexity, learning rate and BLEU per epoch.

Figures are drawn with matplotlib's object API on its Agg canvas (no `pyplot`, no
global backend switch), so plotting works on machines without a display and does not
change the backend of a user's own session.
"""

import csv
import math
import os

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FormatStrFormatter, NullFormatter

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

    ```python
    plot_training_curves("saved_models/demo/training_log.csv", "curves.png")
    ```
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
            _log_scale(axes, series)
        if len(series) > 1:
            axes.legend()
    png_path = os.fspath(png_path)
    os.makedirs(os.path.dirname(png_path) or ".", exist_ok=True)
    figure.savefig(png_path, dpi=100)
    return png_path


def _log_scale(axes, series):
    """A log y axis with plain labels ("1.2", "6e-04", not "1.2 x 10^0").

    Minor ticks (2-9 x 10^k) are labelled only when the values span less than a decade:
    there they are the only labels, and over several decades (a learning rate that decays
    to 1e-8) eight labels a decade would print on top of each other.
    """
    axes.set_yscale("log")
    axes.yaxis.set_major_formatter(FormatStrFormatter("%.3g"))
    values = [v for values, _ in series for v in values if not math.isnan(v)]
    decades = math.log10(max(values) / min(values)) if values else 0.0
    axes.yaxis.set_minor_formatter(FormatStrFormatter("%.3g") if decades < 1 else NullFormatter())


def _all_positive(series):
    return all(v > 0 for values, _ in series for v in values if not math.isnan(v))


__all__ = ["plot_training_curves", "read_csv_log"]
