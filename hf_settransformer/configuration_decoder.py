"""Configuration of the pre-norm causal Transformer decoder (Vaswani et al. 2017, ScaleNorm)."""

from .configuration_base import HfstConfig


class TransformerDecoderConfig(HfstConfig):
    r"""
    Configuration of [`TransformerDecoderModel`] and [`TransformerDecoderForCausalLM`]. Takes every argument of
    [`HfstConfig`], plus:

    add_cross_attention (`bool`, defaults to `False`): add a cross-attention sublayer to every block, attending to
        `encoder_hidden_states` (set by `EncoderDecoderModel`, as for BERT and GPT-2).
    is_decoder (`bool`, defaults to `True`): always a decoder; kept for `EncoderDecoderModel`.
    use_cache (`bool`, defaults to `True`): return past key/values (softmax) or recurrent states (linear).

    Example:

    ```python
    >>> from hf_settransformer import TransformerDecoderConfig, TransformerDecoderForCausalLM
    >>> config = TransformerDecoderConfig(vocab_size=1000, hidden_size=64, attention_type="linear")
    >>> model = TransformerDecoderForCausalLM(config)
    ```
    """

    model_type = "hfst_decoder"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(self, vocab_size=33278, add_cross_attention=False, is_decoder=True, use_cache=True, **kwargs):
        self.add_cross_attention = add_cross_attention
        self.is_decoder = is_decoder
        self.use_cache = use_cache
        super().__init__(vocab_size=vocab_size, **kwargs)
