"""Configuration of the Set Transformer (Lee et al. 2019): ISAB/SAB encoder, PMA + SAB decoder."""

import functools

from .configuration_base import PooledHeadsConfig, check_positive


def check_no_positions(value):
    if value != "none" or not isinstance(value, str):
        raise ValueError(
            f"`position_embedding_type` must be 'none' for the Set Transformer (a set has no order), got {value!r}."
        )


class SetTransformerConfig(PooledHeadsConfig):
    r"""
    Configuration of [`SetTransformerModel`] and its heads. Takes every argument of [`PooledHeadsConfig`] (inputs are
    continuous features of size `input_size`, or tokens with `vocab_size`), plus:

    num_inducing_points (`int`, defaults to 16): m inducing points of each ISAB; 0 uses SABs instead.
    num_seeds (`int`, defaults to 1): k seed vectors of the PMA that pools the set.
    num_decoder_layers (`int`, defaults to 1): SABs applied to the k pooled vectors, as in the paper's decoder.

    A set has no order: `position_embedding_type` is always `"none"` and the model is permutation invariant
    (pooled output) and equivariant (per-element output).

    Example:

    ```python
    >>> from transformers import AutoConfig, AutoModel
    >>> import hf_settransformer
    >>> config = AutoConfig.for_model("hfst_set_transformer", input_size=2, hidden_size=64, num_inducing_points=16)
    >>> model = AutoModel.from_config(config)
    ```
    """

    model_type = "hfst_set_transformer"

    def __init__(
        self,
        num_inducing_points=16,
        num_seeds=1,
        num_decoder_layers=1,
        position_embedding_type="none",
        **kwargs,
    ):
        self.num_inducing_points = num_inducing_points
        self.num_seeds = num_seeds
        self.num_decoder_layers = num_decoder_layers
        super().__init__(position_embedding_type=position_embedding_type, **kwargs)

    field_checks = {
        **PooledHeadsConfig.field_checks,
        "num_inducing_points": functools.partial(check_positive, "num_inducing_points", allow_zero=True),
        "num_seeds": functools.partial(check_positive, "num_seeds"),
        "num_decoder_layers": functools.partial(check_positive, "num_decoder_layers", allow_zero=True),
        "position_embedding_type": check_no_positions,
    }
