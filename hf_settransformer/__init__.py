"""hf_settransformer: ScaleNorm pre-norm Transformer encoder/decoder, Set Transformer and Perceiver IO as Hugging Face
models with selectable softmax or linear attention. Importing the package registers every class with transformers'
Auto classes and for `save_pretrained`'s remote-code export.

This package holds the model side (the files a checkpoint carries: configurations, models, blocks, attention) and
exports the models, configurations and registries. The toolkit that trains and evaluates them (language-modelling
data and evaluation, set tasks, training callbacks, locks, model cards, Hub uploads) is `hf_settransformer.toolkit`;
no modeling file imports it, so a pushed checkpoint does not carry it."""

import transformers
from transformers import AutoConfig

from .attention import (
    ATTENTION_KERNELS,
    AttentionKernel,
    MultiHeadAttention,
    attention_kernel,
    register_attention_kernel,
)
from .blocks import ISAB, MAB, PMA
from .cache import LinearAttentionState
from .configuration_base import HfstConfig, PooledHeadsConfig
from .configuration_decoder import TransformerDecoderConfig
from .configuration_encoder import TransformerEncoderConfig
from .configuration_perceiver_io import PerceiverIOConfig
from .configuration_set_transformer import SetTransformerConfig
from .families import FAMILIES, Family
from .layers import ScaleNorm
from .linear_ops import causal_linear_attention, linear_attention, linear_attention_step
from .masks import AttentionMask
from .modeling_decoder import TransformerDecoderForCausalLM, TransformerDecoderModel
from .modeling_encoder import (
    TransformerEncoderForMaskedLM,
    TransformerEncoderForNextTokenPrediction,
    TransformerEncoderForSequenceClassification,
    TransformerEncoderModel,
)
from .modeling_perceiver_io import (
    PerceiverIOForMaskedLM,
    PerceiverIOForNextTokenPrediction,
    PerceiverIOForSequenceClassification,
    PerceiverIOModel,
)
from .modeling_set_transformer import (
    SetTransformerForMixtureOfGaussians,
    SetTransformerForNextTokenPrediction,
    SetTransformerForSequenceClassification,
    SetTransformerModel,
)

__version__ = "0.1.0"


# register every row of the family table (families.py) with transformers' Auto classes
for _family in FAMILIES.values():
    _config_class = _family.config_class()
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    _config_class.register_for_auto_class()
    for _auto_name, _model_class in _family.model_classes().items():
        _auto_class = getattr(transformers, _auto_name, None)
        if _auto_class is not None:  # a head without an Auto class is only named in the saved `auto_map`
            _auto_class.register(_config_class, _model_class, exist_ok=True)
            _model_class.register_for_auto_class(_auto_name)

__all__ = [
    "ATTENTION_KERNELS",
    "AttentionKernel",
    "AttentionMask",
    "FAMILIES",
    "Family",
    "HfstConfig",
    "ISAB",
    "LinearAttentionState",
    "MAB",
    "MultiHeadAttention",
    "PMA",
    "PerceiverIOConfig",
    "PerceiverIOForMaskedLM",
    "PerceiverIOForNextTokenPrediction",
    "PerceiverIOForSequenceClassification",
    "PerceiverIOModel",
    "PooledHeadsConfig",
    "ScaleNorm",
    "SetTransformerConfig",
    "SetTransformerForMixtureOfGaussians",
    "SetTransformerForNextTokenPrediction",
    "SetTransformerForSequenceClassification",
    "SetTransformerModel",
    "TransformerDecoderConfig",
    "TransformerDecoderForCausalLM",
    "TransformerDecoderModel",
    "TransformerEncoderConfig",
    "TransformerEncoderForMaskedLM",
    "TransformerEncoderForNextTokenPrediction",
    "TransformerEncoderForSequenceClassification",
    "TransformerEncoderModel",
    "attention_kernel",
    "causal_linear_attention",
    "linear_attention",
    "linear_attention_step",
    "register_attention_kernel",
]
