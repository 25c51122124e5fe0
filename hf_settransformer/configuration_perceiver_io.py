"""Configuration of Perceiver IO (Jaegle et al. 2022) with pre-norm ScaleNorm blocks."""

from typing import Literal

from huggingface_hub.dataclasses import strict

from .configuration_base import PooledHeadsConfig, check_divisible, check_field, optional, positive


@strict
class PerceiverIOConfig(PooledHeadsConfig):
    r"""
    Configuration of [`PerceiverIOModel`] and its heads: the fields of [`PooledHeadsConfig`] and Perceiver IO's own
    (names as in transformers' `PerceiverConfig`). `num_hidden_layers` is derived, `num_blocks *
    num_self_attends_per_block` (for tools that count layers), and not saved.
    """

    model_type = "hfst_perceiver_io"

    vocab_size: int | None = optional(positive, default=33278)  # the word-level WikiText-2 vocabulary
    num_latents: int = positive(default=64)  # learned latent vectors
    num_blocks: int = positive(default=1)  # times the latent self-attention block is applied, with shared weights
    num_self_attends_per_block: int = positive(default=4)  # latent self-attention layers in that block
    num_cross_attention_heads: int = positive(default=1)  # heads of the encoder and decoder cross-attentions
    # the decoder's queries: the embedded inputs, their position embeddings, or `num_output_queries` learned vectors
    output_query_type: Literal["inputs", "positions", "learned"] = "inputs"
    num_output_queries: int = positive(default=1)  # learned output queries

    @property
    def num_hidden_layers(self):
        return self.num_blocks * self.num_self_attends_per_block

    @num_hidden_layers.setter
    def num_hidden_layers(self, value):
        """A config.json written before it was derived repeats it: it must agree."""
        check_field("num_hidden_layers", self.check_derived_layers, value)

    def check_derived_layers(self, value):
        if type(value) is not int or value != self.num_hidden_layers:
            raise ValueError(
                f"`num_hidden_layers` of Perceiver IO is num_blocks * num_self_attends_per_block = "
                f"{self.num_hidden_layers}; got {value!r}. Set `num_blocks` and `num_self_attends_per_block`."
            )

    def validate_architecture(self):
        super().validate_architecture()
        check_divisible("hidden_size", self.hidden_size, "num_cross_attention_heads", self.num_cross_attention_heads)
        if self.output_query_type == "positions" and self.position_embedding_type == "none":
            raise ValueError(
                "`output_query_type='positions'` needs position embeddings: set `position_embedding_type` to "
                "'sinusoidal' or 'learned', or use `output_query_type='inputs'`."
            )
