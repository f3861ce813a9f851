"""`bench/gpu.py`'s report: ratios at equal tokens per step, the printed table, the PNG.

Reads the payload `bench/gpu.py` writes (`backends.<backend>.training`: one entry per
implementation, preset, policy and tokens per step) and needs nothing of Keras.
"""

import pathlib

LABELS = {  # every implementation, in the table's and the legend's order
    "ours_jax": "ours, JAX (XLA)",
    "flax": "Flax linen + optax, jitted step",
    "ours_torch": "ours, PyTorch (captured + inductor)",
    "torch_eager": "torch.nn.Transformer, eager",
    "torch_compiled": "torch.nn.Transformer, torch.compile",
}
# Ratios of target tokens/s at the same point: what issues 74 and 76 ask about.
RATIOS = (("ours_torch", "torch_compiled"), ("ours_torch", "torch_eager"), ("ours_jax", "flax"), ("ours_torch", "ours_jax"))


def ratios(parts):
    """Target tokens/s ratios between implementations measured at the same point."""
    speed = {}
    for part in parts.values():
        for entry in part["training"]:
            key = (entry["preset"], entry["policy"], entry["tokens_per_step"])
            speed.setdefault(key, {})[entry["implementation"]] = entry["tokens_per_s"]
    rows = []
    for (preset, policy, tokens), by_name in sorted(speed.items()):
        for numerator, denominator in RATIOS:
            if numerator in by_name and denominator in by_name:
                rows.append({
                    "preset": preset, "policy": policy, "tokens_per_step": tokens,
                    "ratio": f"{numerator} / {denominator}",
                    "value": by_name[numerator] / by_name[denominator],
                })
    return rows


def _cells(payload):
    """`{(preset, policy, tokens): {implementation: "tokens/s (MFU)"}}`."""
    rows = {}
    for part in payload["backends"].values():
        for entry in part["training"]:
            key = (entry["preset"], entry["policy"], entry["tokens_per_step"])
            rows.setdefault(key, {})[entry["implementation"]] = f"{entry['tokens_per_s']:,.0f} ({entry['mfu']:.2f})"
    return rows


def _decoding_lines(payload):
    lines = []
    for backend, part in payload["backends"].items():
        for key, decoding in part["decoding"].items():
            lines.append(
                f"decode {backend} {key} (batch {decoding['batch']}, {decoding['steps']} steps): "
                f"greedy {decoding['greedy']['tokens_per_s']:,.0f} tok/s, beam4 {decoding['beam4']['tokens_per_s']:,.0f} tok/s"
            )
    return lines


def print_summary(payload):
    """The table of every point, the ratios, decoding, and what was not measured."""
    print("\ntarget tokens/s (MFU) by tokens per step")
    names = list(LABELS)
    print(f"{'preset':<6} {'policy':<15} {'tokens':>6} " + " ".join(f"{n:>18}" for n in names))
    for (preset, policy, tokens), cells in sorted(_cells(payload).items()):
        print(f"{preset:<6} {policy:<15} {tokens:>6} " + " ".join(f"{cells.get(n, '-'):>18}" for n in names))
    for row in payload["ratios"]:
        print(f"{row['preset']} {row['policy']} {row['tokens_per_step']:>6}: {row['ratio']:<30} {row['value']:.2f}")
    print("\n".join(_decoding_lines(payload)))
    for backend, part in payload["backends"].items():
        for item in part["skipped"] + part["failed"]:
            print(f"{backend}: not measured {item}")
        if part.get("in_progress"):
            print(f"{backend}: stopped while measuring {part['in_progress']}")


def _plot_panel(axis, entries, preset, policy, field, ylabel):
    """One line per implementation of `field` against tokens per step."""
    ticks = set()
    for name, label in LABELS.items():
        points = sorted(
            (e["tokens_per_step"], e[field])
            for e in entries
            if e["implementation"] == name and e["preset"] == preset and e["policy"] == policy
        )
        if points:
            axis.plot(*zip(*points), marker="o", label=label)
            ticks.update(tokens for tokens, _ in points)
    axis.set_xscale("log", base=2)
    axis.set_xticks(sorted(ticks), [f"{tokens:,}" for tokens in sorted(ticks)], fontsize=8)
    axis.minorticks_off()
    axis.set_xlabel("target tokens per step")
    axis.set_ylabel(ylabel)
    axis.set_title(f"{preset}, {policy}", fontsize=10)
    axis.grid(alpha=0.3)


def plot(payload, path):
    """tokens/s and MFU against tokens per step: a line per implementation, a row per preset and policy."""
    import matplotlib

    matplotlib.use("Agg")  # no display on a benchmark machine
    import matplotlib.pyplot as plt

    entries = [entry for part in payload["backends"].values() for entry in part["training"]]
    groups = sorted({(entry["preset"], entry["policy"]) for entry in entries}) or [("nothing measured", "")]
    figure, axes = plt.subplots(len(groups), 2, figsize=(12, 4.2 * len(groups) + 0.6), squeeze=False)
    for row, (preset, policy) in enumerate(groups):
        _plot_panel(axes[row][0], entries, preset, policy, "tokens_per_s", "target tokens / s")
        _plot_panel(axes[row][1], entries, preset, policy, "mfu", "MFU (of the matmul peak measured there)")
        if entries:
            axes[row][0].legend(fontsize=8)
    devices = ", ".join(sorted({part["device"] for part in payload["backends"].values()}))
    figure.suptitle(f"Training on {devices or 'no device'} (length {payload['length']}, vocabulary {payload['vocab']})")
    figure.text(0.01, 0.01, "\n".join(_decoding_lines(payload)), fontsize=7)
    figure.tight_layout(rect=(0, 0.04, 1, 1))
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path
