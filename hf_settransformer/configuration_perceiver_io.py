"""Configuration of Perceiver IO (Jaegle et al. 2022) with pre-norm ScaleNorm blocks."""

import functools

from .configuration_base import PooledHeadsConfig, check_choice, check_heads, check_positive

OUTPUT_QUERY_TYPES = ("inputs", "positions", "learned")


class PerceiverIOConfig(PooledHeadsConfig):
    r"""
    Configuration of [`PerceiverIOModel`] and its heads. Takes every argument of [`PooledHeadsConfig`], plus (names as
    in transformers' `PerceiverConfig`):

    num_latents (`int`, defaults to 64): number of learned latent vectors.
    num_blocks (`int`, defaults to 1): times the latent self-attention block is applied, with shared weights.
    num_self_attends_per_block (`int`, defaults to 4): latent self-attention layers in that block.
    num_cross_attention_heads (`int`, defaults to 1): heads of the encoder and decoder cross-attentions.
    output_query_type (`str`, defaults to `"inputs"`): the decoder's queries: `"inputs"` (one per input position,
        the embedded input itself), `"positions"` (one per input position, its position embedding only) or
        `"learned"` (`num_output_queries` learned vectors).
    num_output_queries (`int`, defaults to 1): number of learned output queries.

    `num_hidden_layers` is derived: `num_blocks * num_self_attends_per_block` (for tools that count layers).
    """

    model_type = "hfst_perceiver_io"

    def __init__(
        self,
        vocab_size=33278,
        num_latents=64,
        num_blocks=1,
        num_self_attends_per_block=4,
        num_cross_attention_heads=1,
        output_query_type="inputs",
        num_output_queries=1,
        **kwargs,
    ):
        self.num_latents = num_latents
        self.num_blocks = num_blocks
        self.num_self_attends_per_block = num_self_attends_per_block
        self.num_cross_attention_heads = num_cross_attention_heads
        self.output_query_type = output_query_type
        self.num_output_queries = num_output_queries
        check_positive("num_blocks", num_blocks)
        check_positive("num_self_attends_per_block", num_self_attends_per_block)
        layers = num_blocks * num_self_attends_per_block
        check_derived_layers(kwargs.pop("num_hidden_layers", layers), layers)  # derived; a saved config repeats it
        super().__init__(vocab_size=vocab_size, num_hidden_layers=layers, **kwargs)

    field_checks = {
        **PooledHeadsConfig.field_checks,
        **{
            name: functools.partial(check_positive, name)
            for name in (
                "num_latents",
                "num_blocks",
                "num_self_attends_per_block",
                "num_cross_attention_heads",
                "num_output_queries",
            )
        },
        "output_query_type": lambda v: check_choice("output_query_type", v, OUTPUT_QUERY_TYPES),
    }

    def __setattr__(self, key, value):
        """`num_hidden_layers` follows `num_blocks` and `num_self_attends_per_block` once built; set directly, it must
        equal their product."""
        built = self.__dict__.get("_post_init_done")
        if built and key == "num_hidden_layers":
            check_derived_layers(value, self.num_blocks * self.num_self_attends_per_block)
        super().__setattr__(key, value)
        if built and key in ("num_blocks", "num_self_attends_per_block"):
            super().__setattr__("num_hidden_layers", self.num_blocks * self.num_self_attends_per_block)

    def check_fields(self):
        super().check_fields()
        check_derived_layers(self.num_hidden_layers, self.num_blocks * self.num_self_attends_per_block)
        check_heads("hidden_size", self.hidden_size, "num_cross_attention_heads", self.num_cross_attention_heads)
        if self.output_query_type == "positions" and self.position_embedding_type == "none":
            raise ValueError(
                "`output_query_type='positions'` needs position embeddings: set `position_embedding_type` to "
                "'sinusoidal' or 'learned', or use `output_query_type='inputs'`."
            )


def check_derived_layers(given, layers):
    if type(given) is not int or given != layers:
        raise ValueError(
            f"`num_hidden_layers` of Perceiver IO is num_blocks * num_self_attends_per_block = {layers}; got "
            f"{given!r}. Set `num_blocks` and `num_self_attends_per_block` instead."
        )
