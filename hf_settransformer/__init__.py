"""hf_settransformer: ScaleNorm pre-norm Transformer encoder/decoder, Set Transformer and Perceiver IO as Hugging Face
models with selectable softmax or linear attention. Importing the package registers every class with transformers'
Auto classes and for `save_pretrained`'s remote-code export."""

from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
)

from .attention import (
    AttentionMask,
    LinearAttentionState,
    MultiHeadAttention,
    causal_linear_attention,
    linear_attention,
    linear_attention_step,
)
from .blocks import ISAB, MAB, PMA
from .configuration_base import HfstConfig
from .configuration_decoder import TransformerDecoderConfig
from .configuration_encoder import TransformerEncoderConfig
from .configuration_perceiver_io import PerceiverIOConfig
from .configuration_set_transformer import SetTransformerConfig
from .data import DataCollatorForSets
from .language_modeling import (
    BlockDataset,
    TargetWindowDataset,
    WindowDataset,
    build_word_tokenizer,
    decoder_windows,
    evaluate_masked_stream,
    evaluate_perplexity,
    evaluate_stream,
    evaluation_protocol,
    example_length,
    is_masked_lm,
    lm_model_card_fields,
    lm_training_dataset,
    masked_positions,
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
from .set_tasks import (
    PAPER_RESULTS,
    SET_TASKS,
    SHAPES,
    TASK_HEADS,
    DeepSetsBaseline,
    MaxRegression,
    MixtureOfGaussians,
    PointClouds,
    evaluate_set_task,
    l1_loss,
    make_set_task,
    random_rotation,
    sample_shape,
)
from .training import (
    BUDGET_FILE,
    CLOCKS,
    COMPLETE_MARKER,
    LOCK_FILE,
    PUSH_IGNORE_PATTERNS,
    CompleteCheckpointCallback,
    OutputDirLock,
    OutputDirLockedError,
    TimeBudgetCallback,
    TimedEvalCallback,
    check_checkpoint_matches,
    checkpoint_step,
    cpu_model_name,
    fast_bf16_available,
    lock_output_dir,
    max_steps_for_budget,
    probe_seconds_per_step,
    push_folder_to_hub,
    read_marker,
    replace_atomically,
    replica_checksums,
    resolve_resume,
    run_environment,
    save_model_atomically,
    timed_callbacks,
    tokens_per_step,
    train_and_measure,
    train_unless_finished,
    whole_run_train_loss,
    write_model_card,
    write_text_atomically,
)
from .modeling_set_transformer import (
    SetTransformerForMixtureOfGaussians,
    SetTransformerForNextTokenPrediction,
    SetTransformerForSequenceClassification,
    SetTransformerModel,
)

__version__ = "0.1.0"

# config -> {Auto class: model class}
FAMILIES = {
    TransformerEncoderConfig: {
        AutoModel: TransformerEncoderModel,
        AutoModelForMaskedLM: TransformerEncoderForMaskedLM,
        AutoModelForSequenceClassification: TransformerEncoderForSequenceClassification,
        AutoModelForCausalLM: TransformerEncoderForNextTokenPrediction,
    },
    TransformerDecoderConfig: {
        AutoModel: TransformerDecoderModel,
        AutoModelForCausalLM: TransformerDecoderForCausalLM,
    },
    SetTransformerConfig: {
        AutoModel: SetTransformerModel,
        AutoModelForSequenceClassification: SetTransformerForSequenceClassification,
        AutoModelForCausalLM: SetTransformerForNextTokenPrediction,
    },
    PerceiverIOConfig: {
        AutoModel: PerceiverIOModel,
        AutoModelForMaskedLM: PerceiverIOForMaskedLM,
        AutoModelForSequenceClassification: PerceiverIOForSequenceClassification,
        AutoModelForCausalLM: PerceiverIOForNextTokenPrediction,
    },
}

for _config_class, _models in FAMILIES.items():
    AutoConfig.register(_config_class.model_type, _config_class, exist_ok=True)
    _config_class.register_for_auto_class()
    for _auto_class, _model_class in _models.items():
        _auto_class.register(_config_class, _model_class, exist_ok=True)
        _model_class.register_for_auto_class(_auto_class.__name__)

__all__ = [
    "DeepSetsBaseline",
    "MaxRegression",
    "MixtureOfGaussians",
    "PointClouds",
    "PAPER_RESULTS",
    "SET_TASKS",
    "SHAPES",
    "TASK_HEADS",
    "evaluate_set_task",
    "l1_loss",
    "make_set_task",
    "COMPLETE_MARKER",
    "BlockDataset",
    "CompleteCheckpointCallback",
    "TargetWindowDataset",
    "OutputDirLock",
    "OutputDirLockedError",
    "TimeBudgetCallback",
    "TimedEvalCallback",
    "WindowDataset",
    "build_word_tokenizer",
    "checkpoint_step",
    "decoder_windows",
    "evaluate_stream",
    "evaluate_masked_stream",
    "resolve_resume",
    "target_windows",
    "token_stream",
    "train_unless_finished",
    "whole_run_train_loss",
    "lock_output_dir",
    "save_model_atomically",
    "write_text_atomically",
    "check_checkpoint_matches",
    "cpu_model_name",
    "evaluate_perplexity",
    "evaluation_protocol",
    "example_length",
    "fast_bf16_available",
    "is_masked_lm",
    "lm_model_card_fields",
    "lm_training_dataset",
    "max_steps_for_budget",
    "probe_seconds_per_step",
    "push_folder_to_hub",
    "replica_checksums",
    "run_environment",
    "timed_callbacks",
    "tokens_per_step",
    "train_and_measure",
    "write_model_card",
    "BUDGET_FILE",
    "CLOCKS",
    "LOCK_FILE",
    "PUSH_IGNORE_PATTERNS",
    "masked_positions",
    "random_rotation",
    "read_marker",
    "replace_atomically",
    "sample_shape",
    "ISAB",
    "MAB",
    "PMA",
    "AttentionMask",
    "DataCollatorForSets",
    "HfstConfig",
    "LinearAttentionState",
    "MultiHeadAttention",
    "PerceiverIOConfig",
    "PerceiverIOForMaskedLM",
    "PerceiverIOForNextTokenPrediction",
    "PerceiverIOForSequenceClassification",
    "PerceiverIOModel",
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
    "causal_linear_attention",
    "linear_attention",
    "linear_attention_step",
]
