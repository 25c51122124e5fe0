"""The model families: one row per family, the one list the package, its checkpoints, the scripts and the tests read.

Classes are named as `"module.Class"` strings, the form of a config's `auto_map`, so that this file imports nothing
and travels with a checkpoint's modeling code. `__init__.py` registers every row with transformers' Auto classes;
`save_pretrained` (of a config or of any model) writes the family's whole `auto_map`; `scripts/train_lm.py`'s
`--family` choices and the tests' family lists come from `FAMILIES`.

A head with no matching Auto class (the Set Transformer's mixture of Gaussians) is listed under its own class name:
its checkpoint's `auto_map` names it, and it loads without the package through
`transformers.dynamic_module_utils.get_class_from_dynamic_module(auto_map[name], folder)`.
"""

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    """name: the scripts' `--family`; model_type: `config.model_type`; config: the config class; models: Auto class
    name (or, for a head without one, the head's class name) -> model class, both as `"module.Class"`."""

    name: str
    model_type: str
    config: str
    models: dict

    @property
    def auto_map(self) -> dict:
        """The `auto_map` a saved config or checkpoint of this family carries: its config and every model."""
        return {"AutoConfig": self.config, **self.models}

    def config_class(self) -> type:
        return _resolve(self.config)

    def model_classes(self) -> dict:
        """Auto class name (or head name) -> model class, imported on demand."""
        return {name: _resolve(path) for name, path in self.models.items()}


def _resolve(path):
    """`"module.Class"` -> the class, from this package (or from the checkpoint folder this file was loaded from)."""
    module_name, class_name = path.split(".")
    return getattr(importlib.import_module(f".{module_name}", __package__), class_name)


FAMILIES = {
    family.name: family
    for family in (
        Family(
            "encoder",
            "hfst_encoder",
            "configuration_encoder.TransformerEncoderConfig",
            {
                "AutoModel": "modeling_encoder.TransformerEncoderModel",
                "AutoModelForMaskedLM": "modeling_encoder.TransformerEncoderForMaskedLM",
                "AutoModelForSequenceClassification": "modeling_encoder.TransformerEncoderForSequenceClassification",
                "AutoModelForCausalLM": "modeling_encoder.TransformerEncoderForNextTokenPrediction",
            },
        ),
        Family(
            "decoder",
            "hfst_decoder",
            "configuration_decoder.TransformerDecoderConfig",
            {
                "AutoModel": "modeling_decoder.TransformerDecoderModel",
                "AutoModelForCausalLM": "modeling_decoder.TransformerDecoderForCausalLM",
            },
        ),
        Family(
            "set_transformer",
            "hfst_set_transformer",
            "configuration_set_transformer.SetTransformerConfig",
            {
                "AutoModel": "modeling_set_transformer.SetTransformerModel",
                "AutoModelForSequenceClassification": "modeling_set_transformer.SetTransformerForSequenceClassification",
                "AutoModelForCausalLM": "modeling_set_transformer.SetTransformerForNextTokenPrediction",
                "SetTransformerForMixtureOfGaussians": "modeling_set_transformer.SetTransformerForMixtureOfGaussians",
            },
        ),
        Family(
            "perceiver_io",
            "hfst_perceiver_io",
            "configuration_perceiver_io.PerceiverIOConfig",
            {
                "AutoModel": "modeling_perceiver_io.PerceiverIOModel",
                "AutoModelForMaskedLM": "modeling_perceiver_io.PerceiverIOForMaskedLM",
                "AutoModelForSequenceClassification": "modeling_perceiver_io.PerceiverIOForSequenceClassification",
                "AutoModelForCausalLM": "modeling_perceiver_io.PerceiverIOForNextTokenPrediction",
            },
        ),
    )
}


def family_for_model_type(model_type: str) -> Family:
    """The row of a `config.model_type`."""
    for family in FAMILIES.values():
        if family.model_type == model_type:
            return family
    known = sorted(f.model_type for f in FAMILIES.values())
    raise ValueError(f"No hf_settransformer family has model_type {model_type!r}; known: {known}.")
