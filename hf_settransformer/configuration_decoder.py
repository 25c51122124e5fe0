"""Configuration of the pre-norm causal Transformer decoder (Vaswani et al. 2017, ScaleNorm)."""

from huggingface_hub.dataclasses import strict
from transformers.utils.type_validators import interval

from .configuration_base import HfstConfig, optional, positive


@strict
class TransformerDecoderConfig(HfstConfig):
    r"""
    Configuration of [`TransformerDecoderModel`] and [`TransformerDecoderForCausalLM`]: the fields of [`HfstConfig`]
    (no pooled or window heads: a causal LM reads its whole input) and the decoder's own.

    Example:

    ```python
    >>> from hf_settransformer import TransformerDecoderConfig, TransformerDecoderForCausalLM
    >>> config = TransformerDecoderConfig(vocab_size=1000, hidden_size=64, attention_type="linear")
    >>> model = TransformerDecoderForCausalLM(config)
    ```
    """

    model_type = "hfst_decoder"
    keys_to_ignore_at_inference = ["past_key_values"]

    vocab_size: int | None = optional(positive, default=33278)  # the word-level WikiText-2 vocabulary
    num_hidden_layers: int = positive(default=4)  # causal blocks
    # a cross-attention sublayer in every block, over `encoder_hidden_states` (EncoderDecoderModel, as BERT and GPT-2)
    add_cross_attention: bool = False
    is_decoder: bool = True  # always a decoder; read by EncoderDecoderModel
    use_cache: bool = True  # return past key/values (softmax) or recurrent states (linear)
    # > 0: a forward with `labels` runs output layer + loss this many positions at a time (no full logits: None)
    lm_loss_chunk_size: int = interval(min=0)(default=0)
