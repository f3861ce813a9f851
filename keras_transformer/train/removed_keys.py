"""The run-config keys that 0.4 removed, each with the reason, and the check that names them.

keras-transformer 0.4 removed the options that the project's own benchmarks said lost
(docs/what_we_tried.md keeps each result). A 0.3 run config that still asks for one gets an
error that says so, instead of "unknown key". A removed key at its 0.3 default asks for
nothing that was removed (every 0.3 model directory's `config.toml` lists every key):
it is dropped, with a warning.
"""

import warnings

REMOVED_IN = "0.4"

_MEMORY = "the kNN translation memory did not beat the run-to-run spread"
# "key" or "table.key" -> (its 0.3 default, why it went, in a few words).
REMOVED_KEYS = {
    "bidirectional_steps": (0, "bidirectional training scored val 39.23 against 39.57 without it"),
    "late_dropout_start": (0.0, "late dropout scored val 35.79 against 36.27 without it"),
    "eval_memory_weight": (0.0, _MEMORY),
    "eval_memory_neighbors": (16, _MEMORY),
    "eval_memory_temperature": (30.0, _MEMORY),
    "eval_memory_distance_scale": (0.0, _MEMORY),
    "eval_memory_pairs": (0, _MEMORY),
    "training.optimizer": ("adam", "Muon tied Adam, then lost 0.60 BLEU: Adam is the optimizer"),
    "training.rdrop_alpha": (0.0, "R-Drop lost 5.1 BLEU at twice the step time"),
    "packing": (False, "sequence packing trained 0.96x the real target tokens/s of length buckets on Multi30k"),
}


def removed_key_message(key, value):
    """The error for a config that sets the removed `key` to `value`."""
    _, reason = REMOVED_KEYS[key]
    return (
        f"`{key}` was removed in keras-transformer {REMOVED_IN} ({reason}); delete it from "
        f"the config. Received: {key}={value!r}"
    )


def drop_removed_keys(values):
    """Takes the removed keys out of a run config's `values` (a TOML table), in place.

    Raises:
        ValueError: a removed key set to anything but its 0.3 default, naming the key,
            the reason and the value.
    """
    for key, (default, _) in REMOVED_KEYS.items():
        table, _, name = key.rpartition(".")
        holder = values.get(table) if table else values
        if not isinstance(holder, dict) or name not in holder:
            continue
        value = holder[name]
        if value != default:
            raise ValueError(removed_key_message(key, value))
        del holder[name]
        warnings.warn(
            f"`{key}` was removed in keras-transformer {REMOVED_IN}; its 0.3 default "
            f"{default!r} is ignored. Delete it from the config to silence this.",
            UserWarning,
            stacklevel=4,
        )


def check_not_removed(key, text):
    """Refuses `--set key=text` for a removed `key` (`"late_dropout_start"`, `"training.rdrop_alpha"`)."""
    if key in REMOVED_KEYS:
        raise ValueError(removed_key_message(key, text))


__all__ = ["REMOVED_KEYS", "REMOVED_IN", "drop_removed_keys", "check_not_removed", "removed_key_message"]
