"""The paper's beam search settings (Vaswani et al., 2017, 6.1), defined once.

A leaf module (it imports nothing): the model directory's saved search falls back
to these, and run configs and commands name them as defaults, without importing the
decoding loop (`keras_transformer.inference.decoding`, which re-exports them).
"""

BEAM_SIZE = 4  # "beam search with a beam size of 4"
LENGTH_PENALTY = 0.6  # "length penalty alpha = 0.6", in ((5 + len) / 6) ** alpha
MAX_DECODE_EXTRA = 50  # "maximum output length during inference to input length + 50"
