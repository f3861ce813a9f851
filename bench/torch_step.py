"""The PyTorch backend's training step against plain PyTorch of the same shape, on this CPU.

Times full training steps (forward, backward, Adam) of one model shape, interleaved round
by round so that every variant sees the same background load, and reports each variant's
best round in ms a step and its ratio to plain PyTorch's eager step:

- `torch_eager`: `torch.nn.Transformer` between tied embeddings, its own Adam and
  cross-entropy (`bench/peers.py:make_torch_peer`);
- `torch_compiled`: the same model and step under `torch.compile` (inductor);
- `ours_keras_eager`: ours through Keras' eager PyTorch step (`jit_compile=False`);
- `ours_default`: ours with `compile_transformer`'s default `jit_compile="auto"`, after the
  warm-up that lets it capture the batch's shape (`AUTO_CAPTURE_AFTER` batches);
- `ours_captured`: ours through `CapturedTrainStep` without inductor (the captured graph
  run as it is: what is left once Keras' per-layer Python is gone);
- `ours_compiled`: ours with `jit_compile=True` (the captured graph compiled by inductor).

`--breakdown` also times the parts of our step alone (forward and loss through Keras'
layers or through the captured graph, backward, optimizer update, metrics): where the
eager milliseconds go.

Usage:

    .venv/bin/python bench/torch_step.py                       # batch 8 and 64, length 16
    .venv/bin/python bench/torch_step.py --batches 8 --rounds 3 --breakdown

Writes bench/results/torch_step.json and torch_step.png (ms a step per variant).
"""

import argparse
import os
import pathlib
import sys
import time

os.environ["KERAS_BACKEND"] = "torch"
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from bench import machine  # noqa: E402

from keras_transformer.train.torch_step import AUTO_CAPTURE_AFTER  # noqa: E402

VARIANTS = ("torch_eager", "torch_compiled", "ours_keras_eager", "ours_default", "ours_captured", "ours_compiled")
VOCAB = 1000
LENGTH = 16


def _config(args):
    import keras_transformer as kt

    return kt.TransformerConfig.from_preset("tiny", vocab_size=args.vocab)  # d_model 64, 2+2 layers


def _batch(config, batch, length, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = lambda: rng.integers(4, config.vocab_size, (batch, length)).astype("int32")  # noqa: E731
    return ids(), ids(), ids()


def _ours(config, variant, source, decoder, labels):
    """A `run(steps) -> ms a step` for one of our variants, through `model.fit` as a user trains."""
    import keras

    import keras_transformer as kt
    from keras_transformer.train.compile import compile_transformer
    from keras_transformer.train.torch_step import CapturedTrainStep

    keras.utils.set_random_seed(0)
    model = kt.Transformer(config)
    jit_compile = {"ours_keras_eager": False, "ours_default": "auto", "ours_compiled": True}.get(variant, False)
    compile_transformer(model, jit_compile=jit_compile)
    if variant == "ours_captured":
        model.captured_train_step = CapturedTrainStep(model, compiler=None)
    x = {"encoder_inputs": keras.ops.convert_to_tensor(source), "decoder_inputs": keras.ops.convert_to_tensor(decoder)}
    y = keras.ops.convert_to_tensor(labels)

    def batches():
        while True:
            yield x, y

    class StepEnds(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            times.append(time.perf_counter())

    times = []

    def run(steps):
        # From the end of the first step to the end of the last: steps, not fit's set-up.
        times.clear()
        model.fit(batches(), steps_per_epoch=steps + 1, epochs=1, verbose=0, callbacks=[StepEnds()])
        return (times[-1] - times[0]) / steps * 1000

    return run, model


def _plain_torch(config, variant, source, decoder, labels):
    import torch

    from bench.peers import make_torch_peer

    torch.manual_seed(0)
    model, step = make_torch_peer(config)
    if variant == "torch_compiled":
        step = torch.compile(step)
    source, decoder, labels = (torch.from_numpy(a).long() for a in (source, decoder, labels))

    def run(steps):
        start = time.perf_counter()
        for _ in range(steps):
            loss = step(source, decoder, labels)
        float(loss.detach())  # waits for the last step, as fit's logs do
        return (time.perf_counter() - start) / steps * 1000

    return run, model


def measure(config, batch, variants, rounds, steps):
    """`{variant: {"ms": best ms a step, "warm_up_s": first-call seconds}}` for one batch size."""
    source, decoder, labels = _batch(config, batch, LENGTH)
    runners, results = {}, {}
    for variant in variants:
        make = _plain_torch if variant.startswith("torch") else _ours
        runner, _ = make(config, variant, source, decoder, labels)
        start = time.perf_counter()
        # Until the default captures the shape (at its AUTO_CAPTURE_AFTER-th batch), then one step.
        runner(AUTO_CAPTURE_AFTER + 1 if variant == "ours_default" else 2)
        results[variant] = {"warm_up_s": round(time.perf_counter() - start, 2), "rounds_ms": []}
        runners[variant] = runner
        print(f"  batch {batch}: {variant} warm-up {results[variant]['warm_up_s']} s", flush=True)
    for _ in range(rounds):  # interleaved: each variant once per round
        for variant, runner in runners.items():
            results[variant]["rounds_ms"].append(round(runner(steps), 3))
    for variant, entry in results.items():
        entry["ms"] = min(entry["rounds_ms"])
    eager = results.get("torch_eager", {}).get("ms")
    compiled = results.get("torch_compiled", {}).get("ms")
    for entry in results.values():
        if eager:
            entry["vs_torch_eager"] = round(entry["ms"] / eager, 3)
        if compiled:
            entry["vs_torch_compiled"] = round(entry["ms"] / compiled, 3)
    return results


def breakdown(config, batch, steps=20):
    """Where a step's milliseconds go, part by part, in Keras' eager step and in the captured one.

    Each part is timed alone over `steps` calls (best of three): the forward pass and loss
    (Keras' layers eagerly, or the captured graph, which updates the metrics too), the
    backward pass, the optimizer update (Keras' `apply`, or captured and compiled by
    inductor as `jit_compile=True` runs it), the metrics through Keras. Their differences
    are the Python of Keras' layer calls, metrics and optimizer that the capture removes.
    """
    import keras
    import torch

    from keras_transformer.train.torch_optimizer_update import CompiledOptimizerUpdate

    source, decoder, labels = _batch(config, batch, LENGTH)
    _, model = _ours(config, "ours_captured", source, decoder, labels)
    step = model._captured_train_step
    x = {"encoder_inputs": keras.ops.convert_to_tensor(source), "decoder_inputs": keras.ops.convert_to_tensor(decoder)}
    y = keras.ops.convert_to_tensor(labels)
    model.train_on_batch(x, y)  # captures
    graph = next(iter(step._graphs.values()))
    trainable, non_trainable = model.trainable_variables, model.non_trainable_variables
    metrics = model.metrics_variables

    def eager_forward():
        y_pred = model(x, training=True)
        return model.compute_loss(x=x, y=y, y_pred=y_pred, training=True), y_pred

    def captured_forward():
        values = [[v.value for v in variables] for variables in (trainable, non_trainable, metrics)]
        return graph(*values, x, y)[:2]  # the loss, the logs (the metrics are updated in the graph)

    def best_ms(function):
        times = []
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(steps):
                function()
            times.append((time.perf_counter() - start) / steps * 1000)
        return round(min(times), 3)

    def backward_of(forward):
        def run():
            model.zero_grad()
            forward()[0].backward()
        return run

    loss, _ = captured_forward()
    loss.backward()
    y_pred = eager_forward()[1]
    gradients = [v.value.grad for v in trainable]

    def optimizer_update():
        with torch.no_grad():
            model.optimizer.apply(gradients, trainable)

    compiled_update = CompiledOptimizerUpdate(model)
    compiled_update(gradients, trainable)  # captures and compiles (seconds)
    parts = {
        "forward_and_loss_keras_eager": best_ms(eager_forward),
        "forward_loss_metrics_captured": best_ms(captured_forward),
        "forward_loss_backward_keras_eager": best_ms(backward_of(eager_forward)),
        "forward_loss_metrics_backward_captured": best_ms(backward_of(captured_forward)),
        "optimizer_update_keras": best_ms(optimizer_update),
        "optimizer_update_compiled": best_ms(lambda: compiled_update(gradients, trainable)),
        "metrics_keras": best_ms(lambda: model.compute_metrics(x, y, y_pred.detach(), sample_weight=None)),
    }
    graph_nodes = len(graph.graph.nodes)
    return {"batch": batch, "ms": parts, "captured_graph_nodes": graph_nodes}


def _plot(payload, path):
    groups = [f"batch {batch}" for batch in payload["batches"]]
    series = {
        variant: [payload["batches"][batch][variant]["ms"] for batch in payload["batches"]]
        for variant in payload["variants"]
    }
    machine.grouped_bar_chart(
        path,
        "PyTorch training step: ours against plain PyTorch (lower is better)",
        "ms a step (best round)",
        groups,
        series,
        note=f"{payload['machine']['cpu_model']}; tiny model (d_model 64, 2+2 layers), length {LENGTH}, float32",
    )


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="8,64", help="comma-separated batch sizes (sentences)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, from {VARIANTS}")
    parser.add_argument("--rounds", type=int, default=5, help="timed rounds per variant (best counts)")
    parser.add_argument("--steps", type=int, default=20, help="steps per round")
    parser.add_argument("--vocab", type=int, default=VOCAB)
    parser.add_argument("--breakdown", action="store_true", help="also time the step's parts (forward, backward, optimizer)")
    parser.add_argument("--output", default=str(machine.RESULTS_DIR / "torch_step.json"))
    args = parser.parse_args(argv)
    import torch

    torch.set_num_threads(machine.usable_cores())
    config = _config(args)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown variants {unknown}; choose from {VARIANTS}")
    payload = {"machine": machine.machine_info(), "variants": variants, "length": LENGTH, "batches": {}}
    for batch in (int(b) for b in args.batches.split(",")):
        payload["batches"][batch] = measure(config, batch, variants, args.rounds, args.steps)
        for variant, entry in payload["batches"][batch].items():
            ratio = entry.get("vs_torch_eager")
            print(f"batch {batch}: {variant:18s} {entry['ms']:8.2f} ms  x{ratio} of torch eager", flush=True)
    if args.breakdown:
        payload["breakdown"] = [breakdown(config, int(b)) for b in args.batches.split(",")]
        for entry in payload["breakdown"]:
            print(f"batch {entry['batch']}: {entry['ms']}")
    output = pathlib.Path(args.output)
    machine.write_json(output, payload)
    _plot(payload, output.with_suffix(".png"))
    print(f"wrote {output} and {output.with_suffix('.png')}")


if __name__ == "__main__":
    main()
