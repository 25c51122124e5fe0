"""Configuration of the pre-norm Transformer encoder (Vaswani et al. 2017, ScaleNorm by Nguyen & Salazar 2019)."""

from .configuration_base import PooledHeadsConfig


class TransformerEncoderConfig(PooledHeadsConfig):
    r"""
    Configuration of [`TransformerEncoderModel`] and its heads. Takes every argument of [`PooledHeadsConfig`]; token
    inputs by default (`vocab_size=33278`, the word-level WikiText-2 vocabulary).

    Example:

    ```python
    >>> from hf_settransformer import TransformerEncoderConfig, TransformerEncoderModel
    >>> config = TransformerEncoderConfig(vocab_size=1000, hidden_size=64, attention_type="linear")
    >>> model = TransformerEncoderModel(config)
    ```
    """

    model_type = "hfst_encoder"

    def __init__(self, vocab_size=33278, **kwargs):
        super().__init__(vocab_size=vocab_size, **kwargs)
