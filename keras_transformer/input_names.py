"""The names of the model's inputs, the keys of a batch's input dict, defined once.

A leaf module (it imports nothing), so that the input pipeline, which builds the
batches, need not import the model that reads them.
"""

MODEL_INPUTS = ("encoder_inputs", "decoder_inputs")
"""Source ids `[B, S]` and shifted target ids `[B, T]`: every batch has both."""

PACKING_INPUTS = (
    "encoder_segment_ids",
    "decoder_segment_ids",
    "encoder_positions",
    "decoder_positions",
)
"""The extra inputs of a batch of packed rows (`make_dataset(..., packing=True)`)."""
