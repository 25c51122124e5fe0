"""Configuration of Perceiver IO (Jaegle et al. 2022) with pre-norm ScaleNorm blocks."""

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
        given = kwargs.pop("num_hidden_layers", layers)  # derived; a saved config repeats it
        if given != layers:
            raise ValueError(
                f"`num_hidden_layers` of Perceiver IO is num_blocks * num_self_attends_per_block = {layers}; got "
                f"{given!r}. Set `num_blocks` and `num_self_attends_per_block` instead."
            )
        super().__init__(vocab_size=vocab_size, num_hidden_layers=layers, **kwargs)

    def check_fields(self):
        super().check_fields()
        check_positive("num_latents", self.num_latents)
        check_positive("num_cross_attention_heads", self.num_cross_attention_heads)
        check_positive("num_output_queries", self.num_output_queries)
        check_heads("hidden_size", self.hidden_size, "num_cross_attention_heads", self.num_cross_attention_heads)
        check_choice("output_query_type", self.output_query_type, OUTPUT_QUERY_TYPES)
        if self.output_query_type == "positions" and self.position_embedding_type == "none":
            raise ValueError(
                "`output_query_type='positions'` needs position embeddings: set `position_embedding_type` to "
                "'sinusoidal' or 'learned', or use `output_query_type='inputs'`."
            )
