"""The names of the model's inputs, the keys of a batch's input dict, defined once.

A leaf module (it imports nothing), so that the input pipeline, which builds the
batches, need not import the model that reads them.
"""

MODEL_INPUTS = ("encoder_inputs", "decoder_inputs")
"""Source ids `[B, S]` and shifted target ids `[B, T]`: every batch has both, and nothing else."""
