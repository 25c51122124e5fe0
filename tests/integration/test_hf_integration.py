"""Hugging Face conventions: Auto classes, save/load (also as remote code without this package), checkpoints shared
across heads, gradient checkpointing, the Trainer, generate() and EncoderDecoderModel."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
from tests.helpers import (
    ATTENTION_IDS,
    ATTENTIONS,
    FAMILIES,
    MODEL_CLASSES,
    VOCAB,
    family_classes,
    main_output,
    make_model,
    quiet_training_args,
    tiny_config,
)
from transformers import (
    AutoConfig,
    AutoModel,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoModelForSequenceClassification,
    EncoderDecoderModel,
    Trainer,
)

import hf_settransformer as hfst


def model_inputs(family, b=2, n=6):
    torch.manual_seed(1)
    ids = torch.randint(0, VOCAB, (b, n))
    mask = torch.ones(b, n, dtype=torch.long)
    mask[-1, n - 2 :] = 0
    return {"input_ids": ids, "attention_mask": mask}


# ------------------------------------------------------------------------------------------------ Auto classes


def test_auto_registration():
    expected = {
        AutoModel: ["TransformerEncoderModel", "TransformerDecoderModel", "SetTransformerModel", "PerceiverIOModel"],
        AutoModelForCausalLM: [
            "TransformerDecoderForCausalLM",
            "TransformerEncoderForNextTokenPrediction",
            "SetTransformerForNextTokenPrediction",
            "PerceiverIOForNextTokenPrediction",
        ],
        AutoModelForMaskedLM: ["TransformerEncoderForMaskedLM", "PerceiverIOForMaskedLM"],
        AutoModelForSequenceClassification: [
            "TransformerEncoderForSequenceClassification",
            "SetTransformerForSequenceClassification",
            "PerceiverIOForSequenceClassification",
        ],
    }
    for auto_class, names in expected.items():
        built = set()
        for family in FAMILIES:
            try:
                built.add(type(auto_class.from_config(tiny_config(family))).__name__)
            except ValueError:
                pass  # this family has no model for this Auto class
        assert built == set(names), auto_class.__name__


def test_quick_start_runs():
    cfg = AutoConfig.for_model(
        "hfst_set_transformer",
        input_size=2,
        hidden_size=64,
        num_inducing_points=16,
        attention_type="linear",
        feature_map="elu",
    )
    model = AutoModel.from_config(cfg)
    out = model(input_features=torch.randn(3, 10, 2))
    assert out.last_hidden_state.shape == (3, 10, 64) and out.pooler_output.shape == (3, 1, 64)


# ------------------------------------------------------------------------------------------------ save / load


@pytest.mark.parametrize("family,cls", MODEL_CLASSES, ids=[c.__name__ for _, c in MODEL_CLASSES])
def test_save_load_round_trip(tmp_path, family, cls):
    config = tiny_config(family, "linear" if "Set" in cls.__name__ else "softmax")
    model = make_model(cls, config)
    inputs = model_inputs(family)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists() and not (tmp_path / "pytorch_model.bin").exists()
    auto_map = json.loads((tmp_path / "config.json").read_text())["auto_map"]
    assert {"AutoConfig", "AutoModel"} <= set(auto_map)
    assert cls.__name__ in {v.split(".")[-1] for v in auto_map.values()}
    shipped = ("attention.py", "masks.py", "softmax_ops.py", "linear_ops.py", "layers.py", "blocks.py")
    for name in (*shipped, "modeling_common.py", "checks.py", "heads.py", "losses.py", "configuration_base.py"):
        assert (tmp_path / name).exists(), name
    assert not (tmp_path / "linear_naive.py").exists()  # the references are for tests, never imported by a model
    loaded = cls.from_pretrained(tmp_path).eval()
    assert torch.equal(main_output(loaded(**inputs)), main_output(model(**inputs)))
    auto = next(a for a, c in family_classes(config).items() if c is cls)
    via_auto = auto.from_pretrained(tmp_path).eval()
    assert type(via_auto) is cls and torch.equal(main_output(via_auto(**inputs)), main_output(model(**inputs)))


@pytest.mark.parametrize("family", ["encoder", "set_transformer", "perceiver_io"])
def test_head_checkpoint_loads_into_base_and_other_heads(tmp_path, family):
    config = tiny_config(family)
    classes = family_classes(config)
    head_cls = classes[AutoModelForCausalLM]
    head = make_model(head_cls, config)
    head.save_pretrained(tmp_path)
    inputs = model_inputs(family)
    base = classes[AutoModel].from_pretrained(tmp_path).eval()
    assert torch.equal(base(**inputs).last_hidden_state, head.model(**inputs).last_hidden_state)
    other = classes[AutoModelForSequenceClassification].from_pretrained(tmp_path).eval()
    for (name, p), (_, q) in zip(other.model.named_parameters(), head.model.named_parameters()):
        assert torch.equal(p, q), name
    # and a base checkpoint loads into a head
    base_dir = tmp_path / "base"
    base.save_pretrained(base_dir)
    again = head_cls.from_pretrained(base_dir).eval()
    assert torch.equal(again.model(**inputs).last_hidden_state, base(**inputs).last_hidden_state)


REMOTE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["hf_settransformer"] = None  # any import of the package now fails
    import torch, transformers
    cases = json.load(open(sys.argv[1]))
    from transformers.dynamic_module_utils import get_class_from_dynamic_module
    for case in cases:
        if hasattr(transformers, case["auto"]):
            auto = getattr(transformers, case["auto"])
        else:  # a head without an Auto class: its class is named in the checkpoint's auto_map
            auto_map = json.load(open(case["path"] + "/config.json"))["auto_map"]
            auto = get_class_from_dynamic_module(auto_map[case["auto"]], case["path"])
        model = auto.from_pretrained(case["path"], trust_remote_code=True).eval()
        assert type(model).__name__ == case["cls"], (type(model).__name__, case["cls"])
        assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
        inputs = torch.load(case["inputs"])
        with torch.no_grad():
            out = model(**inputs)
        out = next(out[key] for key in ("logits", "means", "last_hidden_state") if key in out)
        expected = torch.load(case["expected"])
        assert torch.equal(out, expected), (case["cls"], (out - expected).abs().max())
        print("ok", case["auto"], case["cls"])
    try:
        import hf_settransformer
    except ImportError:
        print("package not importable")
    """
)


@pytest.mark.slow
def test_remote_code_loads_without_the_package(tmp_path):
    """Every family: save a head, load it through AutoModel and its head's Auto class with trust_remote_code in a
    process where hf_settransformer cannot be imported; outputs are identical."""
    cases = []
    for family in FAMILIES:
        for attention, feature_map in (("softmax", "elu"), ("linear", "exp")):
            # the linear models with adaptive input and output layers (Baevski & Auli; Grave et al.)
            adaptive = {}
            if attention == "linear":
                adaptive = dict(adaptive_input_cutoffs=[4, 16], adaptive_softmax_cutoffs=[4, 16])
            config = tiny_config(family, attention, feature_map, **adaptive)
            classes = family_classes(config)
            head_auto = AutoModelForCausalLM
            head = make_model(classes[head_auto], config)
            path = tmp_path / f"{family}-{attention}-{feature_map}"
            head.save_pretrained(path)
            inputs = model_inputs(family)
            torch.save(inputs, path / "inputs.pt")
            with torch.no_grad():
                torch.save(main_output(head(**inputs)), path / "head.pt")
                torch.save(head.model(**inputs).last_hidden_state, path / "base.pt")
            for auto, cls, expected in (
                (head_auto, classes[head_auto], "head.pt"),
                (AutoModel, classes[AutoModel], "base.pt"),
            ):
                cases.append(
                    {
                        "auto": auto.__name__,
                        "cls": cls.__name__,
                        "path": str(path),
                        "inputs": str(path / "inputs.pt"),
                        "expected": str(path / expected),
                    }
                )
    # a sequence-classification checkpoint too
    config = tiny_config("set_transformer", vocab_size=None, input_size=2)
    clf = make_model(hfst.SetTransformerForSequenceClassification, config)
    path = tmp_path / "set-clf"
    clf.save_pretrained(path)
    inputs = {"input_features": torch.randn(2, 5, 2)}
    torch.save(inputs, path / "inputs.pt")
    with torch.no_grad():
        torch.save(clf(**inputs).logits, path / "head.pt")
    cases.append(
        {
            "auto": "AutoModelForSequenceClassification",
            "cls": "SetTransformerForSequenceClassification",
            "path": str(path),
            "inputs": str(path / "inputs.pt"),
            "expected": str(path / "head.pt"),
        }
    )

    # the mixture-of-Gaussians head, which has no Auto class (families.py lists it under its own name)
    config = tiny_config("set_transformer", vocab_size=None, input_size=2, num_seeds=3)
    mog = make_model(hfst.SetTransformerForMixtureOfGaussians, config)
    path = tmp_path / "set-mog"
    mog.save_pretrained(path)
    assert (path / "modeling_set_transformer.py").exists()
    inputs = {"input_features": torch.randn(2, 5, 2)}
    torch.save(inputs, path / "inputs.pt")
    with torch.no_grad():
        torch.save(mog(**inputs).means, path / "head.pt")
    name = "SetTransformerForMixtureOfGaussians"
    cases.append(
        {"auto": name, "cls": name, "path": str(path), "inputs": str(path / "inputs.pt"), "expected": str(path / "head.pt")}
    )

    (tmp_path / "cases.json").write_text(json.dumps(cases))
    (tmp_path / "load.py").write_text(REMOTE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["HF_MODULES_CACHE"] = str(tmp_path / "modules")
    env["HF_HUB_OFFLINE"] = "1"
    env["OMP_NUM_THREADS"] = str(torch.get_num_threads())  # the threads that computed `expected`: the same sums
    result = subprocess.run(
        [sys.executable, str(tmp_path / "load.py"), str(tmp_path / "cases.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("ok ") == len(cases)
    assert "package not importable" in result.stdout


def test_remote_code_needs_trust(tmp_path):
    make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder")).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "modeling_decoder.TransformerDecoderForCausalLM"


# ------------------------------------------------------------------------------------------------ training


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
@pytest.mark.parametrize("family", FAMILIES)
def test_gradient_checkpointing_gives_same_gradients(family, attention_type, feature_map):
    config = tiny_config(family, attention_type, feature_map)
    cls = family_classes(config)[AutoModelForCausalLM]
    inputs = model_inputs(family)
    labels = inputs["input_ids"]  # causal-LM labels for the decoder and the many-target heads

    def grads(checkpointing):
        model = make_model(cls, config).train()
        if checkpointing:
            model.gradient_checkpointing_enable()
            assert model.is_gradient_checkpointing
        model(**inputs, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain, checkpointed = grads(False), grads(True)
    assert plain.keys() == checkpointed.keys() and len(plain) > 10
    for name in plain:
        assert torch.allclose(plain[name], checkpointed[name], atol=1e-6), name


def synthetic_examples(family, head_auto, n=32, length=8):
    """A learnable task for each kind of head."""
    g = torch.Generator().manual_seed(0)
    examples = []
    for _ in range(n):
        ids = torch.randint(1, VOCAB, (length,), generator=g)
        if head_auto is AutoModelForSequenceClassification:
            examples.append({"input_ids": ids, "labels": int(ids.max() > VOCAB * 0.9) + int(ids.min() < 3)})
        elif head_auto is AutoModelForMaskedLM:
            labels = ids.clone()
            masked = ids.clone()
            masked[::3] = 0
            labels[1::3] = -100
            examples.append({"input_ids": masked, "labels": labels})
        elif family == "decoder":
            examples.append({"input_ids": ids, "labels": ids})
        else:  # many-target heads: a counting sequence, each next token is the previous one plus 1
            ids = (ids[0] + torch.arange(length)) % (VOCAB - 1) + 1
            examples.append({"input_ids": ids, "labels": ids})
    return examples


def loss_before_and_after_training(model, data, batch, tmp_path, steps, data_collator=None):
    """The loss on `batch` before and after `steps` Trainer steps on `data` (lr 5e-3, batches of 16)."""

    def loss():
        model.eval()
        with torch.no_grad():
            return model(**batch).loss.item()

    before = loss()
    args = quiet_training_args(tmp_path, max_steps=steps, per_device_train_batch_size=16, learning_rate=5e-3)
    Trainer(model=model, args=args, train_dataset=data, data_collator=data_collator).train()
    return before, loss()


HEADS = [
    (family, auto)
    for family in FAMILIES
    for auto in (AutoModelForCausalLM, AutoModelForMaskedLM, AutoModelForSequenceClassification)
    if auto in family_classes(tiny_config(family))
]


@pytest.mark.slow
@pytest.mark.parametrize("family,head_auto", HEADS, ids=[f"{f}-{a.__name__}" for f, a in HEADS])
def test_trainer_lowers_the_loss(tmp_path, family, head_auto):
    config = tiny_config(family, "linear" if family in ("encoder", "perceiver_io") else "softmax")
    model = make_model(family_classes(config)[head_auto], config)
    data = synthetic_examples(family, head_auto)
    batch = {k: torch.stack([torch.as_tensor(e[k]) for e in data]) for k in data[0]}
    before, after = loss_before_and_after_training(model, data, batch, tmp_path, steps=60)
    assert after < 0.8 * before, (before, after)


def lm_training_loss_drop(
    tmp_path, family, attention_type, feature_map, steps, config_overrides=None, **training_flags
):
    """Loss on a fixed batch before / after `steps` Trainer steps of a tiny LM with the given Trainer flags."""
    config = tiny_config(family, attention_type, feature_map, **(config_overrides or {}))
    model = make_model(family_classes(config)[AutoModelForCausalLM], config)
    data = synthetic_examples(family, AutoModelForCausalLM)
    batch = {k: torch.stack([torch.as_tensor(e[k]) for e in data]) for k in data[0]}

    def loss():
        model.eval()
        with torch.no_grad():
            return model(**batch).loss.item()

    before = loss()
    args = quiet_training_args(
        tmp_path, max_steps=steps, per_device_train_batch_size=16, learning_rate=5e-3, **training_flags
    )
    trainer = Trainer(model=model, args=args, train_dataset=data)
    trainer.train()
    return before, loss(), trainer


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_bf16_autocast_training_lowers_the_loss(tmp_path, family, attention_type, feature_map):
    """The Trainer's --bf16 on CPU (autocast): every family and attention type trains, sums and norms in fp32."""
    before, after, trainer = lm_training_loss_drop(tmp_path, family, attention_type, feature_map, 40, bf16=True)
    assert trainer.accelerator.mixed_precision == "bf16"
    assert after < 0.8 * before, (before, after)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family,attention_type,feature_map",
    [("decoder", "linear", "exp"), ("encoder", "softmax", "elu"), ("set_transformer", "linear", "elu"),
     ("perceiver_io", "softmax", "elu")],
)
def test_torch_compile_bf16_training_lowers_the_loss(tmp_path, family, attention_type, feature_map):
    """The Trainer's --torch_compile (inductor) with --bf16 on CPU: one compile per family (each takes tens of
    seconds here), the attention types alternating, with attention dropout (linear attention: key dropout)."""
    overrides = {"attention_probs_dropout_prob": 0.1}
    if family == "decoder":  # with adaptive input and output layers, train_lm.py's `small` preset
        overrides.update(adaptive_input_cutoffs=[4, 16], adaptive_softmax_cutoffs=[4, 16])
    before, after, trainer = lm_training_loss_drop(
        tmp_path, family, attention_type, feature_map, 30, overrides, bf16=True, torch_compile=True
    )
    assert isinstance(trainer.model_wrapped, torch._dynamo.eval_frame.OptimizedModule)  # it ran compiled
    assert after < 0.8 * before, (before, after)


def test_trainer_with_the_chunked_lm_loss_trains_the_same_weights(tmp_path):
    """lm_loss_chunk_size changes how the loss is computed, not the training: same weights after Trainer steps with
    gradient accumulation (where the Trainer passes `num_items_in_batch`) and padded labels."""
    data = synthetic_examples("decoder", AutoModelForCausalLM)
    for example in data[::3]:
        example["labels"] = example["labels"].clone()
        example["labels"][:2] = -100
    trained = []
    for chunk in (0, 5):
        model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder", lm_loss_chunk_size=chunk))
        args = quiet_training_args(
            tmp_path / str(chunk),
            max_steps=6,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=2,
            optim="sgd",  # Adam would blow rounding noise in gradients that are 0 in theory (key biases) up to lr
            learning_rate=0.5,
        )
        Trainer(model=model, args=args, train_dataset=data).train()
        trained.append(model.state_dict())
    for name in trained[0]:
        torch.testing.assert_close(trained[1][name], trained[0][name], rtol=1e-4, atol=1e-5, msg=name)
    untrained = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder")).state_dict()
    key = "model.embeddings.embed_tokens.weight"
    assert not torch.equal(trained[0][key], untrained[key])  # the steps did train


# ------------------------------------------------------------------------------------------------ generate


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_decoder_greedy_generate_matches_argmax_loop(attention_type, feature_map):
    model = make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder", attention_type, feature_map))
    prompt = torch.randint(1, VOCAB, (2, 5))
    generated = model.generate(prompt, max_new_tokens=10, do_sample=False, pad_token_id=0)
    expected = prompt
    with torch.no_grad():
        for _ in range(10):
            expected = torch.cat([expected, model(input_ids=expected).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, expected)


@pytest.mark.parametrize("family", ["encoder", "set_transformer", "perceiver_io"])
def test_next_token_heads_generate_with_a_sliding_window(family):
    config = tiny_config(family, context_length=4)
    model = make_model(family_classes(config)[AutoModelForCausalLM], config)
    prompt = torch.randint(1, VOCAB, (2, 3))
    generated = model.generate(prompt, max_new_tokens=7, do_sample=False, pad_token_id=0)
    expected = prompt
    with torch.no_grad():
        for _ in range(7):
            window = expected[:, -4:]
            expected = torch.cat([expected, model(input_ids=window).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(generated, expected)
    sampled = model.generate(prompt, max_new_tokens=5, do_sample=True, num_return_sequences=2, pad_token_id=0)
    assert sampled.shape == (4, 8)


# ------------------------------------------------------------------------------------------------ encoder-decoder


@pytest.mark.parametrize("attention_type", ["softmax", "linear"])
def test_encoder_decoder_pairing(tmp_path, attention_type):
    make_model(hfst.TransformerEncoderModel, tiny_config("encoder", attention_type)).save_pretrained(tmp_path / "enc")
    make_model(hfst.TransformerDecoderForCausalLM, tiny_config("decoder", attention_type)).save_pretrained(
        tmp_path / "dec"
    )
    pair = EncoderDecoderModel.from_encoder_decoder_pretrained(str(tmp_path / "enc"), str(tmp_path / "dec"))
    assert pair.decoder.config.add_cross_attention and pair.decoder.model.layers[0].cross_attention is not None
    src = torch.randint(1, VOCAB, (2, 7))
    src_mask = torch.ones(2, 7, dtype=torch.long)
    src_mask[1, 5:] = 0
    tgt = torch.randint(1, VOCAB, (2, 5))
    out = pair(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt, labels=tgt)
    assert out.logits.shape == (2, 5, VOCAB) and torch.isfinite(out.loss)
    out.loss.backward()
    assert pair.decoder.model.layers[0].cross_attention.q_proj.weight.grad.abs().sum() > 0
    # padded source positions are ignored by the cross-attention
    changed = src.clone()
    changed[1, 5:] = (changed[1, 5:] + 3) % VOCAB
    pair.eval()
    a = pair(input_ids=src, attention_mask=src_mask, decoder_input_ids=tgt).logits
    b = pair(input_ids=changed, attention_mask=src_mask, decoder_input_ids=tgt).logits
    assert torch.allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("family", ["encoder", "set_transformer", "perceiver_io"])
def test_next_token_heads_train_on_run_clm_style_blocks(tmp_path, family):
    """run_clm.py's data: blocks of token ids with labels = input_ids, batched by default_data_collator."""
    from transformers import default_data_collator

    config = tiny_config(family, context_length=6)
    model = make_model(family_classes(config)[AutoModelForCausalLM], config)
    g = torch.Generator().manual_seed(0)
    stream = torch.randint(1, VOCAB, (48 * 8,), generator=g)
    blocks = [{"input_ids": b.tolist(), "labels": b.tolist()} for b in stream.view(48, 8)]
    batch = default_data_collator(blocks)
    before, after = loss_before_and_after_training(
        model, blocks, batch, tmp_path, steps=40, data_collator=default_data_collator
    )
    assert after < 0.8 * before, (before, after)


CONFIG_FOLDER_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["hf_settransformer"] = None  # any import of the package now fails
    import torch, transformers
    from transformers import AutoConfig, AutoModelForCausalLM
    config = AutoConfig.from_pretrained(sys.argv[1], trust_remote_code=True)
    model = AutoModelForCausalLM.from_config(config, trust_remote_code=True)
    ids = torch.randint(1, config.vocab_size, (2, 6))
    print(type(model).__name__, model(input_ids=ids, labels=ids).loss.item() > 0)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("family", FAMILIES)
def test_a_saved_config_folder_is_enough_to_start_from(tmp_path, family):
    """run_clm.py's --config_name: a folder holding only a config builds the family's models where the package
    cannot be imported."""
    config = tiny_config(family)
    config.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["auto_map"] == hfst.FAMILIES[family].auto_map  # every class of the family, MoG head included
    assert (tmp_path / f"modeling_{family}.py").exists() and (tmp_path / "attention.py").exists()
    assert not (tmp_path / "model.safetensors").exists()
    result = subprocess.run(
        [sys.executable, "-c", CONFIG_FOLDER_SCRIPT, str(tmp_path)], capture_output=True, text=True, timeout=300,
        env=dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules")),
    )
    assert result.returncode == 0, result.stderr[-3000:]
    causal = family_classes(config)[AutoModelForCausalLM].__name__
    assert result.stdout.split() == [causal, "True"]


RESAVE_SCRIPT = textwrap.dedent(
    """
    import sys
    sys.modules["hf_settransformer"] = None  # any import of the package now fails
    import torch, transformers
    from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments
    source, out = sys.argv[1], sys.argv[2]
    model = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=True).eval()
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        expected = model(ids).logits
    model.save_pretrained(out + "/saved")  # what the Trainer's checkpoints and run_clm's save_model call
    Trainer(model=model, args=TrainingArguments(out + "/trainer", report_to=[], use_cpu=True)).save_model()
    AutoConfig.from_pretrained(source, trust_remote_code=True).save_pretrained(out + "/config")
    for folder in ("saved", "trainer"):
        again = AutoModelForCausalLM.from_pretrained(out + "/" + folder, trust_remote_code=True).eval()
        with torch.no_grad():
            assert torch.equal(again(ids).logits, expected), folder
        print("ok", folder)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["decoder", "set_transformer"])
def test_a_remote_code_model_saves_again(tmp_path, family):
    """A checkpoint loaded as remote code (the package absent) saves again, directly and through the Trainer, and the
    copy loads to identical outputs. transformers caches the config's and the model's code in separate folders, so the
    config's save cannot import the modeling file beside itself (every Trainer checkpoint of run_clm/run_mlm/run_glue
    failed on it)."""
    model = make_model(family_classes(tiny_config(family))[AutoModelForCausalLM], tiny_config(family))
    model.save_pretrained(tmp_path / "source")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_MODULES_CACHE=str(tmp_path / "modules"), HF_HUB_OFFLINE="1")
    result = subprocess.run(
        [sys.executable, "-c", RESAVE_SCRIPT, str(tmp_path / "source"), str(tmp_path)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["ok", "saved", "ok", "trainer"]
    for folder in ("saved", "trainer"):
        assert (tmp_path / folder / f"modeling_{family}.py").exists()
        assert json.loads((tmp_path / folder / "config.json").read_text())["auto_map"] == hfst.FAMILIES[family].auto_map
    assert (tmp_path / "config" / "config.json").exists()
