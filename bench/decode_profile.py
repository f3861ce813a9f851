"""Where one batch's beam search spends its time: the model's steps against the search's own work.

Takes one batch of `--rows` Multi30k test2016 sentences (sorted longest first, from
`--start`), as `Translator` batches them, and times with process CPU seconds (steadier
than wall time on a shared machine), `--calls` calls each, on JAX:

- the whole compiled beam search (`decoding.beam_decode`, beam 4, α 0.6);
- its decode steps alone: `model.decode_step` over the batch's rows, the same caches,
  as many steps as the search took, in one compiled loop;
- the encoder;
- the same search forced to that many steps at that width (`max_length`), with and
  without the per-step reorder of the key/value caches (without it the search is wrong:
  timing only).

It also prints after how many steps each sentence stopped. Nothing is written.

Usage:

    KERAS_BACKEND=jax .venv/bin/python bench/decode_profile.py saved_models/multi30k ../shared/data/multi30k
    KERAS_BACKEND=jax .venv/bin/python bench/decode_profile.py MODEL_DIR DATA_DIR --early-stopping
"""

import argparse
import os
import pathlib
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir")
    parser.add_argument("data_dir", help="Multi30k raw text files (test_2016_flickr.SRC)")
    parser.add_argument("--source-lang", default="de")
    parser.add_argument("--rows", type=int, default=8, help="sentences in the batch")
    parser.add_argument("--start", type=int, default=400, help="where the batch starts in the sorted order")
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--early-stopping", action="store_true")
    args = parser.parse_args(argv)

    import jax
    import keras
    import numpy as np
    from keras import ops

    from keras_transformer.inference import decoding
    from keras_transformer.inference.translator import pad_batch
    from keras_transformer.model.directory import load_model_and_tokenizer
    from keras_transformer.special_tokens import BOS_ID, EOS_ID, PAD_ID

    if keras.backend.backend() != "jax":
        parser.error("runs on JAX: set KERAS_BACKEND=jax")
    model, tokenizer = load_model_and_tokenizer(args.model_dir)
    path = pathlib.Path(args.data_dir) / f"test_2016_flickr.{args.source_lang}"
    ids = [x + [EOS_ID] for x in tokenizer.encode(path.read_text(encoding="utf-8").splitlines())]
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    rows, beams = args.rows, decoding.BEAM_SIZE
    source = pad_batch([ids[i] for i in order[args.start : args.start + rows]], model.config.max_length, rows)
    variables = list(model.variables)
    values = [v.value for v in variables]

    def compiled(function):
        def pure(values, *inputs):
            with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                return function(*inputs)

        return jax.jit(pure)

    def cpu_seconds(function):
        jax.block_until_ready(function())
        started = time.process_time()
        for _ in range(args.calls):
            jax.block_until_ready(function())
        return (time.process_time() - started) / args.calls

    width, limits = decoding.decode_lengths(model, source, None, decoding.MAX_DECODE_EXTRA)
    outputs, mask = compiled(model.encode)(values, source)
    self_caches, cross_caches = compiled(lambda o: model.initial_cache(o, width))(values, outputs)
    tiled = [decoding.tile_beams(x, beams) for x in (self_caches, cross_caches, mask)]

    # The steps each sentence took: the search's own step, run from Python.
    settings = decoding._BeamSettings(
        beams, decoding.LENGTH_PENALTY, limits, ops.repeat(limits, beams, axis=0)[:, None], None,
        ops.arange(width, dtype="int32")[None, None, :], EOS_ID, PAD_ID, BOS_ID, args.early_stopping,
    )
    step_fn = lambda tokens, index, cache: model.decode_step(tokens, index, cache, tiled[1], tiled[2])  # noqa: E731
    beam_step = compiled(lambda state: decoding._beam_step(step_fn, state, settings))
    state = decoding._initial_beam_state(self_caches, rows, width, beams, BOS_ID)
    stopped, steps = [None] * rows, 0
    while steps < width:
        state = beam_step(values, state)
        steps += 1
        for row, done in enumerate(np.asarray(state.done)):
            if done and stopped[row] is None:
                stopped[row] = steps
        if all(s is not None for s in stopped):
            break

    def only_steps(caches):
        def body(index, caches):
            return model.decode_step(ops.full((rows * beams, 1), 7, "int32"), index, caches, tiled[1], tiled[2])[1]

        return jax.lax.fori_loop(0, steps, body, caches)

    def search(max_length=None):
        return compiled(
            lambda s: decoding.beam_decode(model, s, beams, early_stopping=args.early_stopping, max_length=max_length)
        )

    # Each compiled once, before its timing (a new jax.jit would trace again every call).
    functions = {"whole": search(), "steps": compiled(only_steps), "encoder": compiled(model.encode)}
    functions["forced"] = search(steps)
    functions["no_reorder"] = search(steps)
    whole = cpu_seconds(lambda: functions["whole"](values, source))
    model_steps = cpu_seconds(lambda: functions["steps"](values, tiled[0]))
    encoder = cpu_seconds(lambda: functions["encoder"](values, source))
    forced = cpu_seconds(lambda: functions["forced"](values, source))
    original = decoding._pick_alive
    decoding._pick_alive = lambda candidates, cache, k: original(candidates, (), k)[:3] + (cache,)
    try:  # traced (on its first call) with the reorder removed
        no_reorder = cpu_seconds(lambda: functions["no_reorder"](values, source))
    finally:
        decoding._pick_alive = original
    rest = whole - model_steps - encoder
    print(f"{rows} sentences x beam {beams}, source bucket {source.shape[1]}, width {width}, "
          f"early_stopping={args.early_stopping}; CPU ms a call (load {os.getloadavg()[0]:.1f}):")
    print(f"  whole search {whole * 1e3:.0f}: its {steps} decode steps alone {model_steps * 1e3:.0f} "
          f"({model_steps / whole:.0%}), encoder {encoder * 1e3:.1f} ({encoder / whole:.0%}), "
          f"the search's own work {rest * 1e3:.0f} ({rest / whole:.0%})")
    print(f"  forced to {steps} steps at width {steps}: {forced * 1e3:.0f}; without the cache reorder {no_reorder * 1e3:.0f}")
    alive = sum(stopped)
    print(f"  steps each sentence took: {stopped}; alive sentence-steps {alive} of {rows * steps} ({alive / (rows * steps):.0%})")


if __name__ == "__main__":
    main()
