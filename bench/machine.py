"""What every benchmark records beside its numbers: the machine, the load, the versions.

Shared by the benchmarks, so the results each one writes name the
CPU, core count, load average and library versions the same way, and draw their
bar charts with the same helper.
"""

import datetime
import importlib.metadata
import json
import os
import pathlib
import platform
import subprocess
import sys
import tempfile
import textwrap

RESULTS_DIR = pathlib.Path(__file__).resolve().parent / "results"

# Libraries whose versions change the numbers; missing ones are recorded as None.
_PACKAGES = (
    "keras",
    "keras-hub",
    "tensorflow",
    "tensorflow-text",
    "jax",
    "jaxlib",
    "torch",
    "numpy",
)


def cpu_model():
    """The CPU's "model name" from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def usable_cores():
    """Cores this process may run on (the affinity mask where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count()


def load_average():
    """The 1-minute load average, or None where the OS has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine_info():
    """A JSON-ready dict naming the machine, its load and the library versions."""
    versions = {}
    for package in _PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    return {
        "cpu_model": cpu_model(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable_cores(),
        "load_average_1min": load_average(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "versions": versions,
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def run_per_backend(script, backends, arguments):
    """Runs `script` once per Keras backend, each in a fresh process; returns the parts.

    KERAS_BACKEND is fixed when Keras is imported, so every backend needs its own
    process. Each child runs `python script --backends B *arguments --part-output F`
    and writes its JSON to F.

    Returns:
        `(parts, failures)`: `{backend: the child's JSON}` and `{backend: exit status}`
        for the children that failed.
    """
    parts, failures = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for backend in backends:
            part = pathlib.Path(folder) / f"{backend}.json"
            command = [sys.executable, str(script), "--backends", backend, *arguments, "--part-output", str(part)]
            env = dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2")
            status = subprocess.run(command, env=env).returncode
            if status != 0:
                print(f"backend {backend} failed with status {status}", file=sys.stderr)
                failures[backend] = status
                continue
            parts[backend] = json.loads(part.read_text())
    return parts, failures


def write_json(path, payload):
    """Writes `payload` as indented JSON, creating the folder; returns the path.

    Atomically: a results file holds many runs' numbers, and a benchmark stopped while
    writing it must leave the old file, not half of a new one.
    """
    # Imported on first write: the package imports keras, which scripts that only read
    # or plot results do not need.
    from keras_transformer.atomic import atomic_path

    path = pathlib.Path(path)
    with atomic_path(path) as temporary:
        pathlib.Path(temporary).write_text(json.dumps(payload, indent=2, sort_keys=False) + "\n")
    return path


def grouped_bar_chart(path, title, ylabel, groups, series, note=None, log_scale=False):
    """Draws a PNG bar chart: one cluster per entry of `groups`, one bar per series.

    Args:
        path: where the PNG goes.
        title, ylabel: str.
        groups: list of str, the cluster labels (e.g. "tiny / jax").
        series: dict from series name to a list of values aligned with `groups`
            (None leaves a gap).
        note: optional str printed under the axes (machine, load).
        log_scale: bool, logarithmic y axis (for values spanning decades).
    """
    import matplotlib

    matplotlib.use("Agg")  # no display on a benchmark machine
    import matplotlib.pyplot as plt

    names = list(series)
    width = 0.8 / max(len(names), 1)
    figure, axes = plt.subplots(figsize=(max(6.0, 1.6 * len(groups) + 2.0), 4.5))
    for offset, name in enumerate(names):
        values = series[name]
        xs = [index + (offset - (len(names) - 1) / 2) * width for index in range(len(groups))]
        heights = [0.0 if value is None else value for value in values]
        bars = axes.bar(xs, heights, width=width, label=name)
        for bar, value in zip(bars, values):
            if value is not None:
                axes.annotate(
                    f"{value:,.0f}" if value >= 100 else f"{value:.2f}",
                    (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center",
                    va="bottom",
                    fontsize=7,
                )
    axes.set_xticks(range(len(groups)))
    axes.set_xticklabels(groups, fontsize=8)
    axes.set_ylabel(ylabel)
    if log_scale:
        axes.set_yscale("log")
    axes.set_title(title, fontsize=10)
    axes.legend(fontsize=8)
    lines = []
    if note:
        # Wrapped to the figure's width (~17 characters an inch at 7 points), so a long
        # note (two machines, say) is not cut off at the right edge.
        lines = textwrap.wrap(note, width=int(figure.get_figwidth() * 17))
        figure.text(0.01, 0.01, "\n".join(lines), fontsize=7)
    figure.tight_layout(rect=(0, 0.01 + 0.03 * max(len(lines), 1), 1, 1))
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
