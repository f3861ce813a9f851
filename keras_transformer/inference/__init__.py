"""Inference: cached greedy and beam search, their compiled form per backend, the
text-in text-out `Translator`, scoring, SavedModel export and attention maps.

`decoding` and `compiled` use keras only; the others hold the tokenizer (TensorFlow)
and are imported by name.
"""
