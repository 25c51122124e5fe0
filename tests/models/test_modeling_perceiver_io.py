"""Mirrors `hf_settransformer/modeling_perceiver_io.py`: the output query types."""

import pytest
from tests.helpers import VOCAB, batch_of_tokens, make_model, tiny_config

import hf_settransformer as hfst


def test_perceiver_query_types():
    ids = batch_of_tokens(2, 6)
    learned = make_model(
        hfst.PerceiverIOModel, tiny_config("perceiver_io", output_query_type="learned", num_output_queries=4)
    )
    assert learned(input_ids=ids).last_hidden_state.shape == (2, 4, 32)
    positions = make_model(hfst.PerceiverIOForMaskedLM, tiny_config("perceiver_io", output_query_type="positions"))
    assert positions(input_ids=ids).logits.shape == (2, 6, VOCAB)
    with pytest.raises(ValueError, match="output_query_type"):
        hfst.PerceiverIOForMaskedLM(tiny_config("perceiver_io", output_query_type="learned"))
    cls = make_model(
        hfst.PerceiverIOForSequenceClassification, tiny_config("perceiver_io", output_query_type="learned")
    )
    assert cls(input_ids=ids).logits.shape == (2, 3)
