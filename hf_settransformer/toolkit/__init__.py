"""The toolkit of hf_settransformer: what trains, evaluates and publishes the models, as `scripts/` uses it.

One module a concern: the table of training objectives (`objectives`), language-modelling data and evaluation
(`language_modeling`), the paper's set tasks (`set_tasks`, `data`), the scripts' command line (`cli`) and log lines
(`logs`), the output folder, its lock and what is written into it (`run_folder`), what is read back from a checkpoint
or saved model (`checkpoint_files`), what a resume keeps of its run (`resume_settings`), the value every process
takes from the main one (`processes`), time budgets (`budget`), measurements (`measure`), the machine a run runs on
(`machine`), Hub uploads (`hub`), model cards (`cards`) and train_lm.py's flags and presets (`lm_arguments`). This
package exports what a script of your own needs;
everything else is imported from its module.

Nothing here travels with a checkpoint: the modeling files in `hf_settransformer/` never import this package. It needs
torch and transformers (and `tokenizers`, `huggingface_hub`, which transformers brings), not accelerate or datasets.
"""

from .budget import timed_callbacks
from .cards import refresh_model_card, write_lm_model_card
from .data import DataCollatorForSets
from .hub import push_folder_to_hub
from .language_modeling import (
    build_word_tokenizer,
    causal_window_logits,
    decoder_windows,
    evaluate_masked_stream,
    evaluate_windows,
    token_stream,
)
from .objectives import (
    OBJECTIVES,
    Objective,
    SetObjective,
    evaluate_perplexity,
    evaluate_stream,
    evaluation_protocol,
    lm_training_dataset,
    objective_of,
    register_objective,
)
from .run_folder import resolve_resume
from .run_lock import OutputDirLock
from .set_tasks import evaluate_set_task, make_set_task
from .cli import CheckedTrainingArguments, check_flags
from .logs import log_to_stdout
from .machine import quiet_deepspeed_on_cpu

quiet_deepspeed_on_cpu()  # before transformers or accelerate first imports DeepSpeed (at a save, a launch)


def __getattr__(name):
    """`measure` and its `train_and_measure` on first use: the module subclasses the `Trainer`, whose import brings
    datasets, so that a script parses its flags (`--help`, a misspelt flag) without it."""
    if name in ("measure", "train_and_measure"):
        import importlib

        measure = importlib.import_module(".measure", __name__)  # sets the package's `measure`
        return measure if name == "measure" else measure.train_and_measure
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    # the objectives table: what a head predicts, how its data is cut and how it is scored
    "OBJECTIVES",
    "Objective",
    "SetObjective",
    "register_objective",
    "objective_of",
    # language-modelling data
    "build_word_tokenizer",
    "token_stream",
    "lm_training_dataset",
    # evaluation: any head through its objective, and the window pieces an objective is made of
    "evaluate_perplexity",
    "evaluate_stream",
    "evaluate_masked_stream",
    "evaluation_protocol",
    "evaluate_windows",
    "decoder_windows",
    "causal_window_logits",
    # the set tasks
    "make_set_task",
    "evaluate_set_task",
    "DataCollatorForSets",
    # a training run: its folder, resumption, time budget and measurements
    "OutputDirLock",
    "resolve_resume",
    "timed_callbacks",
    "train_and_measure",
    # a script's command line and logging
    "CheckedTrainingArguments",
    "check_flags",
    "log_to_stdout",
    # publishing
    "write_lm_model_card",
    "refresh_model_card",
    "push_folder_to_hub",
]
