"""hf_settransformer.toolkit.objectives: every LM head declares a row of OBJECTIVES, and a new objective is one row plus
its functions (the README's "Extending: an objective", run here as written there)."""

from pathlib import Path

import pytest
import torch
import transformers

import hf_settransformer as hfst
from hf_settransformer import toolkit
from hf_settransformer.toolkit import OBJECTIVES, objective_of

from tests.helpers import tiny_config

EXPECTED = {  # Auto class -> the objective its heads declare, by next_token_mode
    "AutoModelForCausalLM": {"many": "many_target_windows", "window": "one_target_window"},
    "AutoModelForMaskedLM": {"many": "masked_lm", "window": "masked_lm"},
}


@pytest.mark.parametrize("family", list(hfst.FAMILIES))
@pytest.mark.parametrize("mode", ["many", "window"])
def test_every_lm_head_declares_its_objective(family, mode):
    config = tiny_config(family, **({"next_token_mode": mode} if family != "decoder" else {}))
    for auto_name, cls in hfst.FAMILIES[family].model_classes().items():
        if auto_name not in EXPECTED:
            continue
        with torch.device("meta"):
            model = cls(config)
        expected = "causal_lm" if family == "decoder" else EXPECTED[auto_name][mode]
        assert objective_of(model) is OBJECTIVES[expected]
        assert OBJECTIVES[expected].auto_class == auto_name
        # the class answers as its instance does, before any model is made (train_lm.py's flag checks ask it)
        assert cls.in_mode(mode).objective == model.objective
        assert cls.in_mode(mode).attends_causally == model.attends_causally == (expected in CAUSAL)


CAUSAL = ("causal_lm", "many_target_windows")  # the objectives whose heads attend in causal order


@pytest.mark.parametrize("family", list(hfst.FAMILIES))
@pytest.mark.parametrize("flag", ["next_token", "mlm"])
@pytest.mark.parametrize("mode", ["many", "window"])
def test_the_flags_head_is_the_model_train_lm_builds(family, flag, mode):
    """`lm_arguments.flagged_head`, which train_lm.py's flag checks read before any model exists: the row and the
    causal order of the model that `new_config` and the flag's Auto class then build; a family without such a head is
    refused, naming the families that have one."""
    from hf_settransformer.toolkit.lm_arguments import DataArguments, ModelArguments, flagged_head, new_config

    model_args = ModelArguments(family=family, objective=flag, next_token_mode=mode, preset="tiny")
    auto = toolkit.objectives.auto_class_for_flag(flag)
    if auto.__name__ not in hfst.FAMILIES[family].models:
        with pytest.raises(SystemExit, match=f"--objective {flag} needs a family with a .* not {family}"):
            flagged_head(model_args)
        return
    head, row = flagged_head(model_args)
    config = new_config(model_args, DataArguments(block_size=16, context_length=16), vocab_size=50, eos_id=0)
    with torch.device("meta"):
        model = auto.from_config(config)
    assert objective_of(model) is row and row.flag == flag
    assert head.attends_causally == model.attends_causally


def test_a_subclass_with_an_objective_of_its_own_is_checked_as_its_parent():
    """What a head's labels must be and whether it attends causally are its class's, not its objective's name: a
    next-token head declaring a new objective still refuses float labels by name, and takes a decay ("many")."""

    class MyNextToken(hfst.TransformerEncoderForNextTokenPrediction):
        objective = "my_windows"

    config = tiny_config("encoder", "linear", "elu", linear_attention_decay="fixed", context_length=12, target_length=6)
    torch.manual_seed(0)
    model = MyNextToken(config)
    ids = torch.randint(1, config.vocab_size, (2, 12))
    with pytest.raises(ValueError, match=r"`labels` must be token ids \(torch.long"):
        model(input_ids=ids, labels=ids.float())
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


def test_a_head_without_a_known_objective_is_refused():
    config = hfst.SetTransformerConfig(input_size=2, hidden_size=16, num_hidden_layers=1, num_attention_heads=2)
    with pytest.raises(ValueError, match="declares the objective None; known:"):
        objective_of(hfst.SetTransformerForMixtureOfGaussians(config))


def test_train_lm_flags_name_one_auto_class_each():
    assert toolkit.objectives.auto_class_for_flag("next_token") is transformers.AutoModelForCausalLM
    assert toolkit.objectives.auto_class_for_flag("mlm") is transformers.AutoModelForMaskedLM


@pytest.mark.slow
def test_a_new_objective_is_one_row_plus_its_functions(tmp_path):
    # the README's "Extending: an objective", as written there
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    entry = readme.split("<!-- objective-entry -->", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    namespace = {"__name__": "readme_objective_entry"}
    exec(compile(entry, "README.md (objective entry)", "exec"), namespace)
    BlockLM = namespace["BlockLM"]
    from hf_settransformer import TransformerDecoderForCausalLM
    try:
        torch.manual_seed(0)
        config = hfst.TransformerDecoderConfig(vocab_size=12, hidden_size=32, num_hidden_layers=2,
                                               num_attention_heads=4, initializer_range=0.1)
        model = BlockLM(config)
        stream = torch.arange(400) % 10 + 2  # a cycle: learnable
        dataset = toolkit.lm_training_dataset(model, stream, block_size=8)
        args = transformers.TrainingArguments(tmp_path, max_steps=30, per_device_train_batch_size=8,
                                              learning_rate=3e-3, report_to=[], use_cpu=True, save_strategy="no")
        before = toolkit.evaluate_perplexity(model, stream[:80], batch_size=4, block_size=8, eos_id=1)
        transformers.Trainer(model=model, args=args, train_dataset=dataset).train()
        after = toolkit.evaluate_perplexity(model, stream[:80], batch_size=4, block_size=8, eos_id=1)
        assert after["tokens_scored"] == before["tokens_scored"] == 80
        assert after["perplexity"] < before["perplexity"] / 2
        assert toolkit.evaluation_protocol(model, block_size=8) == "blocks of 8, no shared context"
        reference = toolkit.evaluate_stream(TransformerDecoderForCausalLM(config).eval(), stream[:80], batch_size=4,
                                            block_size=8, stride=7, eos_id=1)
        assert reference["tokens"] == 80  # the causal_lm row with stride block_size - 1: the same windows
    finally:
        OBJECTIVES.pop("block_lm")
