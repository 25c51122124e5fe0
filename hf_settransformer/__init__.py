"""hf_settransformer: ScaleNorm pre-norm Transformer encoder/decoder, Set Transformer and Perceiver IO as Hugging Face
models with selectable softmax or linear attention. Importing the package registers every class with transformers'
Auto classes and for `save_pretrained`'s remote-code export."""

import transformers
from transformers import AutoConfig

from .attention import (
    ATTENTION_KERNELS,
    AttentionKernel,
    AttentionMask,
    LinearAttentionState,
    MultiHeadAttention,
    attention_kernel,
    causal_linear_attention,
    linear_attention,
    linear_attention_step,
    register_attention_kernel,
)
from .blocks import ISAB, MAB, PMA
from .configuration_base import HfstConfig
from .configuration_decoder import TransformerDecoderConfig
from .configuration_encoder import TransformerEncoderConfig
from .configuration_perceiver_io import PerceiverIOConfig
from .configuration_set_transformer import SetTransformerConfig
from .data import DataCollatorForSets
from .families import FAMILIES, Family
from .language_modeling import (
    BlockDataset,
    TargetWindowDataset,
    WindowDataset,
    build_word_tokenizer,
    decoder_windows,
    evaluate_masked_stream,
    evaluate_stream,
    target_windows,
    token_stream,
)
from .layers import ScaleNorm
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
from .set_tasks import DeepSetsBaseline, MaxRegression, MixtureOfGaussians, PointClouds
from .training import (
    COMPLETE_MARKER,
    CompleteCheckpointCallback,
    OutputDirLock,
    OutputDirLockedError,
    TimeBudgetCallback,
    TimedEvalCallback,
    checkpoint_step,
    lock_output_dir,
    resolve_resume,
    save_model_atomically,
    train_unless_finished,
    whole_run_train_loss,
    write_text_atomically,
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
    "COMPLETE_MARKER",
    "FAMILIES",
    "ISAB",
    "MAB",
    "PMA",
    "AttentionKernel",
    "AttentionMask",
    "BlockDataset",
    "CompleteCheckpointCallback",
    "DataCollatorForSets",
    "DeepSetsBaseline",
    "Family",
    "HfstConfig",
    "LinearAttentionState",
    "MaxRegression",
    "MixtureOfGaussians",
    "MultiHeadAttention",
    "OutputDirLock",
    "OutputDirLockedError",
    "PerceiverIOConfig",
    "PerceiverIOForMaskedLM",
    "PerceiverIOForNextTokenPrediction",
    "PerceiverIOForSequenceClassification",
    "PerceiverIOModel",
    "PointClouds",
    "ScaleNorm",
    "SetTransformerConfig",
    "SetTransformerForMixtureOfGaussians",
    "SetTransformerForNextTokenPrediction",
    "SetTransformerForSequenceClassification",
    "SetTransformerModel",
    "TargetWindowDataset",
    "TimeBudgetCallback",
    "TimedEvalCallback",
    "TransformerDecoderConfig",
    "TransformerDecoderForCausalLM",
    "TransformerDecoderModel",
    "TransformerEncoderConfig",
    "TransformerEncoderForMaskedLM",
    "TransformerEncoderForNextTokenPrediction",
    "TransformerEncoderForSequenceClassification",
    "TransformerEncoderModel",
    "WindowDataset",
    "attention_kernel",
    "build_word_tokenizer",
    "causal_linear_attention",
    "checkpoint_step",
    "decoder_windows",
    "evaluate_masked_stream",
    "evaluate_stream",
    "linear_attention",
    "linear_attention_step",
    "lock_output_dir",
    "register_attention_kernel",
    "resolve_resume",
    "save_model_atomically",
    "target_windows",
    "token_stream",
    "train_unless_finished",
    "whole_run_train_loss",
    "write_text_atomically",
]
