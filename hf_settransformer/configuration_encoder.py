"""Configuration of the pre-norm Transformer encoder (Vaswani et al. 2017, ScaleNorm by Nguyen & Salazar 2019)."""

from huggingface_hub.dataclasses import strict

from .configuration_base import PooledHeadsConfig, optional, positive


@strict
class TransformerEncoderConfig(PooledHeadsConfig):
    r"""
    Configuration of [`TransformerEncoderModel`] and its heads: the fields of [`PooledHeadsConfig`].

    Example:

    ```python
    >>> from hf_settransformer import TransformerEncoderConfig, TransformerEncoderModel
    >>> config = TransformerEncoderConfig(vocab_size=1000, hidden_size=64, attention_type="linear")
    >>> model = TransformerEncoderModel(config)
    ```
    """

    model_type = "hfst_encoder"

    vocab_size: int | None = optional(positive, default=33278)  # the word-level WikiText-2 vocabulary
    num_hidden_layers: int = positive(default=4)  # self-attention blocks
