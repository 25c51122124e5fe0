"""hf_settransformer: ScaleNorm pre-norm Transformer encoder/decoder, Set Transformer and Perceiver IO as Hugging Face
models with selectable softmax or linear attention. Importing the package registers every class with transformers'
Auto classes and for `save_pretrained`'s remote-code export."""

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
    evaluate_perplexity,
    evaluate_stream,
    evaluation_protocol,
    example_length,
    is_masked_lm,
    lm_flops_per_token,
    lm_model_card_fields,
    lm_training_dataset,
    masked_positions,
    target_windows,
    token_stream,
)
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
    GPU_PEAK_TFLOPS,
    GPU_TRAINING_DEFAULTS,
    LOCK_FILE,
    PUSH_IGNORE_PATTERNS,
    RUN_FILES,
    CompleteCheckpointCallback,
    OutputDirLock,
    OutputDirLockedError,
    PerplexityLoggingTrainer,
    TimeBudgetCallback,
    TimedEvalCallback,
    check_checkpoint_matches,
    check_output_dir,
    checkpoint_step,
    cpu_model_name,
    fast_bf16_available,
    from_main_process,
    gpu_training_defaults,
    linked_paths,
    lock_output_dir,
    max_steps_for_budget,
    model_flops_utilization,
    peak_flops,
    probe_seconds_per_evaluation,
    probe_seconds_per_step,
    push_folder_to_hub,
    read_marker,
    replace_atomically,
    replica_checksums,
    resolve_resume,
    restore_use_cache,
    run_environment,
    save_model_atomically,
    selected_checkpoint,
    timed_callbacks,
    tokens_per_step,
    train_and_measure,
    train_unless_finished,
    whole_run_train_loss,
    write_model_card,
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
    "AttentionKernel",
    "AttentionMask",
    "BUDGET_FILE",
    "BlockDataset",
    "CLOCKS",
    "COMPLETE_MARKER",
    "CompleteCheckpointCallback",
    "DataCollatorForSets",
    "DeepSetsBaseline",
    "FAMILIES",
    "Family",
    "GPU_PEAK_TFLOPS",
    "GPU_TRAINING_DEFAULTS",
    "HfstConfig",
    "ISAB",
    "LOCK_FILE",
    "LinearAttentionState",
    "MAB",
    "MaxRegression",
    "MixtureOfGaussians",
    "MultiHeadAttention",
    "OutputDirLock",
    "OutputDirLockedError",
    "PerplexityLoggingTrainer",
    "PAPER_RESULTS",
    "PMA",
    "PUSH_IGNORE_PATTERNS",
    "PerceiverIOConfig",
    "PerceiverIOForMaskedLM",
    "PerceiverIOForNextTokenPrediction",
    "PerceiverIOForSequenceClassification",
    "PerceiverIOModel",
    "PointClouds",
    "RUN_FILES",
    "SET_TASKS",
    "SHAPES",
    "ScaleNorm",
    "SetTransformerConfig",
    "SetTransformerForMixtureOfGaussians",
    "SetTransformerForNextTokenPrediction",
    "SetTransformerForSequenceClassification",
    "SetTransformerModel",
    "TASK_HEADS",
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
    "check_checkpoint_matches",
    "check_output_dir",
    "checkpoint_step",
    "cpu_model_name",
    "decoder_windows",
    "evaluate_masked_stream",
    "evaluate_perplexity",
    "evaluate_set_task",
    "evaluate_stream",
    "evaluation_protocol",
    "example_length",
    "fast_bf16_available",
    "from_main_process",
    "gpu_training_defaults",
    "is_masked_lm",
    "l1_loss",
    "linear_attention",
    "linear_attention_step",
    "linked_paths",
    "lm_flops_per_token",
    "lm_model_card_fields",
    "lm_training_dataset",
    "lock_output_dir",
    "make_set_task",
    "masked_positions",
    "max_steps_for_budget",
    "model_flops_utilization",
    "peak_flops",
    "probe_seconds_per_evaluation",
    "probe_seconds_per_step",
    "push_folder_to_hub",
    "random_rotation",
    "read_marker",
    "register_attention_kernel",
    "replace_atomically",
    "replica_checksums",
    "resolve_resume",
    "restore_use_cache",
    "run_environment",
    "sample_shape",
    "save_model_atomically",
    "selected_checkpoint",
    "target_windows",
    "timed_callbacks",
    "token_stream",
    "tokens_per_step",
    "train_and_measure",
    "train_unless_finished",
    "whole_run_train_loss",
    "write_model_card",
    "write_text_atomically",
]
