"""Configuration of the Set Transformer (Lee et al. 2019): ISAB/SAB encoder, PMA + SAB decoder."""

from typing import Literal

from huggingface_hub.dataclasses import strict
from transformers.utils.type_validators import interval

from .configuration_base import PooledHeadsConfig, positive


@strict
class SetTransformerConfig(PooledHeadsConfig):
    r"""
    Configuration of [`SetTransformerModel`] and its heads: the fields of [`PooledHeadsConfig`] (inputs are continuous
    features of size `input_size`, or tokens with `vocab_size`) and the Set Transformer's own. A set has no order: the
    model is permutation invariant (pooled output) and equivariant (per-element output).

    Example:

    ```python
    >>> from transformers import AutoConfig, AutoModel
    >>> import hf_settransformer
    >>> config = AutoConfig.for_model("hfst_set_transformer", input_size=2, hidden_size=64, num_inducing_points=16)
    >>> model = AutoModel.from_config(config)
    ```
    """

    model_type = "hfst_set_transformer"

    num_hidden_layers: int = positive(default=4)  # ISABs (SABs with no inducing points) before pooling
    num_inducing_points: int = interval(min=0)(default=16)  # m inducing points of each ISAB; 0: SABs instead
    num_seeds: int = positive(default=1)  # k seed vectors of the PMA that pools the set
    num_decoder_layers: int = interval(min=0)(default=1)  # SABs over the k pooled vectors, as the paper's decoder
    position_embedding_type: Literal["none"] = "none"  # a set has no order
