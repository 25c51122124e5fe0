"""What users copy from the transformers docs: pipeline("text-generation"), AutoTokenizer + AutoModelForCausalLM +
generate, TextStreamer, with checkpoints of ours."""

import pytest
import torch
from tests.helpers import ATTENTION_IDS, ATTENTIONS, family_classes, make_model, tiny_config, word_tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer, TextStreamer, pipeline

LM_FAMILIES = ["decoder", "encoder", "set_transformer", "perceiver_io"]


def causal_lm(family, attention_type="softmax", feature_map="elu"):
    window = {} if family == "decoder" else {"context_length": 6}  # the decoder has no window: no such field
    config = tiny_config(family, attention_type, feature_map, pad_token_id=0, eos_token_id=2, **window)
    return make_model(family_classes(config)[AutoModelForCausalLM], config)


@pytest.mark.parametrize("family", LM_FAMILIES)
def test_text_generation_pipeline(family):
    model, tokenizer = causal_lm(family), word_tokenizer()
    generator = pipeline("text-generation", model=model, tokenizer=tokenizer)
    prompt = "w1 w2 w3 w4 w5 w6 w7 w8"
    result = generator(prompt, max_new_tokens=5, do_sample=False)
    text = result[0]["generated_text"]
    assert text.startswith(prompt)
    ids = tokenizer(prompt, return_tensors="pt").input_ids
    expected = model.generate(ids, max_new_tokens=5, do_sample=False, pad_token_id=0)
    # the text keeps the generated words; special tokens an untrained model may emit are dropped from it
    words = [t for t in expected[0].tolist() if t not in tokenizer.all_special_ids]
    assert tokenizer(text, return_tensors="pt").input_ids[0].tolist() == words
    batch = generator([prompt, "w9 w10"], max_new_tokens=3, do_sample=False, batch_size=2)
    assert len(batch) == 2 and batch[1][0]["generated_text"].startswith("w9 w10")


@pytest.mark.parametrize("attention_type,feature_map", ATTENTIONS, ids=ATTENTION_IDS)
def test_docs_usage_from_a_saved_checkpoint(tmp_path, capsys, attention_type, feature_map):
    """AutoTokenizer + AutoModelForCausalLM(trust_remote_code) + generate + TextStreamer, as the docs show them."""
    causal_lm("decoder", attention_type, feature_map).save_pretrained(tmp_path)
    word_tokenizer().save_pretrained(tmp_path)

    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    model = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    inputs = tokenizer(["w3 w4 w5", "w7"], return_tensors="pt", padding=True, padding_side="left")
    outputs = model.generate(**inputs, max_new_tokens=6, do_sample=False)
    texts = tokenizer.batch_decode(outputs, skip_special_tokens=True)
    assert texts[0].strip().startswith("w3 w4 w5") and texts[1].strip().startswith("w7")

    streamer = TextStreamer(tokenizer)
    single = tokenizer(["w3 w4 w5"], return_tensors="pt")
    streamed = model.generate(**single, streamer=streamer, max_new_tokens=6, do_sample=False)
    printed = capsys.readouterr().out.strip()
    assert printed == tokenizer.decode(streamed[0]).strip()
    assert torch.equal(streamed[0], outputs[0])  # left padding did not change the first row's continuation
