"""Configuration of the pre-norm causal Transformer decoder (Vaswani et al. 2017, ScaleNorm)."""

import functools

from .configuration_base import HfstConfig, check_positive


class TransformerDecoderConfig(HfstConfig):
    r"""
    Configuration of [`TransformerDecoderModel`] and [`TransformerDecoderForCausalLM`]. Takes every argument of
    [`HfstConfig`] (it has no pooled or window heads: no `pooling`, `context_length`, `next_token_mode` or
    `target_length`; a causal LM reads its whole input), plus:

    add_cross_attention (`bool`, defaults to `False`): add a cross-attention sublayer to every block, attending to
        `encoder_hidden_states` (set by `EncoderDecoderModel`, as for BERT and GPT-2).
    is_decoder (`bool`, defaults to `True`): always a decoder; kept for `EncoderDecoderModel`.
    use_cache (`bool`, defaults to `True`): return past key/values (softmax) or recurrent states (linear).
    lm_loss_chunk_size (`int`, defaults to 0): when > 0, a training forward with `labels` computes the output layer
        and the cross-entropy together, this many positions at a time, without keeping the (positions x vocabulary)
        logits, their log-softmax or its gradient; that forward then returns `logits=None`. 0: the usual path.

    Example:

    ```python
    >>> from hf_settransformer import TransformerDecoderConfig, TransformerDecoderForCausalLM
    >>> config = TransformerDecoderConfig(vocab_size=1000, hidden_size=64, attention_type="linear")
    >>> model = TransformerDecoderForCausalLM(config)
    ```
    """

    model_type = "hfst_decoder"
    keys_to_ignore_at_inference = ["past_key_values"]

    def __init__(
        self,
        vocab_size=33278,
        add_cross_attention=False,
        is_decoder=True,
        use_cache=True,
        lm_loss_chunk_size=0,
        **kwargs,
    ):
        self.add_cross_attention = add_cross_attention
        self.is_decoder = is_decoder
        self.use_cache = use_cache
        self.lm_loss_chunk_size = lm_loss_chunk_size
        super().__init__(vocab_size=vocab_size, **kwargs)

    field_checks = {
        **HfstConfig.field_checks,
        "lm_loss_chunk_size": functools.partial(check_positive, "lm_loss_chunk_size", allow_zero=True),
    }
