"""PEFT on remote-code checkpoints: LoRA with target_modules="all-linear" on every family's main head trains, saves
its adapter, reloads it onto a fresh remote-code base with identical outputs, and merges into the base weights with
the same outputs again. The projections LoRA wraps are the ones the README names."""

import pytest
import torch
from tests.helpers import family_classes, make_model, quiet_training_args, tiny_config
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification, Trainer

import hf_settransformer as hfst  # noqa: F401 (registers the Auto classes)

peft = pytest.importorskip("peft")  # in the dev extra; listed in the README's install

MAIN_HEADS = [
    ("decoder", AutoModelForCausalLM),
    ("encoder", AutoModelForMaskedLM),
    ("set_transformer", AutoModelForSequenceClassification),
    ("perceiver_io", AutoModelForSequenceClassification),
]
PROJECTIONS = {"qkv_proj", "q_proj", "kv_proj", "o_proj", "fc_in", "fc_out"}


def batch(family, auto):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, 50, (4, 8), generator=g)
    if auto is AutoModelForSequenceClassification:
        return {"input_ids": ids, "labels": torch.tensor([0, 1, 2, 1])}
    return {"input_ids": ids, "labels": ids}


@pytest.mark.slow
@pytest.mark.parametrize("family,auto", MAIN_HEADS, ids=[f for f, _ in MAIN_HEADS])
def test_lora_all_linear_trains_saves_reloads_and_merges(tmp_path, family, auto):
    from peft import LoraConfig, PeftModel, get_peft_model

    config = tiny_config(family, "linear", vocab_size=50)
    make_model(family_classes(config)[auto], config).save_pretrained(tmp_path / "base")
    load = lambda: auto.from_pretrained(tmp_path / "base", trust_remote_code=True)  # noqa: E731
    model = get_peft_model(load(), LoraConfig(target_modules="all-linear", r=4, lora_alpha=8, init_lora_weights=False))
    wrapped = {name.split(".")[-1] for name, module in model.named_modules() if hasattr(module, "lora_A")}
    assert wrapped and wrapped <= PROJECTIONS | {"dense", "score", "classifier"}, wrapped
    inputs = batch(family, auto)
    data = [{k: v[i] for k, v in inputs.items()} for i in range(4)] * 8
    model.eval()
    with torch.no_grad():
        before = model(**inputs).loss.item()
    args = quiet_training_args(tmp_path / "run", max_steps=20, per_device_train_batch_size=8, learning_rate=1e-2)
    Trainer(model=model, args=args, train_dataset=data).train()
    model.eval()
    with torch.no_grad():
        trained = model(**inputs)
    assert trained.loss.item() < before
    model.save_pretrained(tmp_path / "adapter")
    assert (tmp_path / "adapter" / "adapter_model.safetensors").is_file()
    assert not list((tmp_path / "adapter").glob("*.bin"))

    reloaded = PeftModel.from_pretrained(load(), tmp_path / "adapter").eval()
    with torch.no_grad():
        again = reloaded(**inputs)
    assert torch.allclose(again.logits, trained.logits, atol=1e-5)
    merged = reloaded.merge_and_unload().eval()
    assert not any(hasattr(m, "lora_A") for m in merged.modules())
    with torch.no_grad():
        assert torch.allclose(merged(**inputs).logits, trained.logits, atol=1e-4)
