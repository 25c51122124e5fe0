"""Set Transformer (Lee et al. 2019): an encoder of ISABs (or SABs), PMA pooling to k seeds, SABs over the seeds.

Inputs are sets of continuous features (`input_features`, (b, n, input_size)) or of tokens (`input_ids`); there are
no positions, so per-element outputs are permutation equivariant and the pooled output is invariant. Padding
elements (`attention_mask` 0) are ignored by every block, ISAB and PMA included. See `blocks.py` for where this
departs from the official code (head-dim scaling, pre-norm ScaleNorm, rFF inside PMA, masks).
"""

from torch import nn
from transformers import GenerationMixin

from .attention import AttentionMask
from .blocks import ISAB, MAB, PMA, masked_mean
from .configuration_set_transformer import SetTransformerConfig
from .layers import InputEmbeddings, make_norm
from .modeling_common import (
    ForNextTokenPredictionMixin,
    ForSequenceClassificationMixin,
    HfstPreTrainedModel,
    SetModelOutput,
    check_attention_mask,
    input_shape,
    resolve_output_flags,
    run_stack,
)


class SetTransformerPreTrainedModel(HfstPreTrainedModel):
    config_class = SetTransformerConfig
    family_auto_map = {
        "AutoModel": "SetTransformerModel",
        "AutoModelForSequenceClassification": "SetTransformerForSequenceClassification",
        "AutoModelForCausalLM": "SetTransformerForNextTokenPrediction",
    }


class SetTransformerModel(SetTransformerPreTrainedModel):
    """Encoder: `num_hidden_layers` ISAB_m (SAB when `num_inducing_points=0`) + norm -> `last_hidden_state`.
    Decoder: PMA_k, `num_decoder_layers` SABs + norm -> `pooler_output` (b, k, hidden)."""

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = InputEmbeddings(config)
        block = ISAB if config.num_inducing_points > 0 else MAB
        self.encoder_layers = nn.ModuleList([block(config) for _ in range(config.num_hidden_layers)])
        self.encoder_norm = make_norm(config)
        self.pma = PMA(config, num_seeds=config.num_seeds)
        self.decoder_layers = nn.ModuleList([MAB(config) for _ in range(config.num_decoder_layers)])
        self.decoder_norm = make_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        input_features=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ):
        output_attentions, output_hidden_states, return_dict = resolve_output_flags(
            self.config, output_attentions, output_hidden_states, return_dict
        )
        b, n = input_shape(input_ids, input_features, inputs_embeds)
        key_mask = check_attention_mask(attention_mask, b, n)
        hidden_states = self.embeddings(input_ids, input_features, inputs_embeds)
        mask = AttentionMask.build(key_mask, for_softmax=self.config.attention_type == "softmax")

        all_states = (hidden_states,) if output_hidden_states else None
        all_weights = () if output_attentions else None
        for layer in self.encoder_layers:
            if isinstance(layer, ISAB):
                hidden_states, weights = layer(hidden_states, mask, output_attentions)
            else:
                hidden_states, weights, _ = layer(hidden_states, None, mask, None, None, output_attentions)
                weights = (weights,)
            if output_hidden_states:
                all_states += (hidden_states,)
            if output_attentions:
                all_weights += weights
        hidden_states = self.encoder_norm(hidden_states)
        if output_hidden_states:
            all_states = all_states[:-1] + (hidden_states,)

        pooled, weights = self.pma(hidden_states, mask, output_attentions)  # (b, k, hidden)
        if output_attentions:
            all_weights += (weights,)
        pooled, _, all_weights, _ = run_stack(
            self.decoder_layers, pooled, AttentionMask(), output_attentions, False, attentions_so_far=all_weights or ()
        )
        pooled = self.decoder_norm(pooled)
        output = SetModelOutput(
            last_hidden_state=hidden_states, pooler_output=pooled, hidden_states=all_states, attentions=all_weights
        )
        return output if return_dict else output.to_tuple()


class SetPooledHeadMixin:
    """Set heads read the model's own decoder output (its PMA), averaged over the k seeds, or a masked mean."""

    def make_head_pool(self, config):
        return None

    def pool_outputs(self, outputs, key_mask):
        if self.config.pooling == "pma":
            return outputs.pooler_output.mean(dim=1)  # (b, hidden); the identity for k = 1
        return masked_mean(outputs.last_hidden_state, key_mask)


class SetTransformerForSequenceClassification(
    SetPooledHeadMixin, ForSequenceClassificationMixin, SetTransformerPreTrainedModel
):
    """Set classification/regression (e.g. the paper's point-cloud and counting tasks)."""

    base_model_class = SetTransformerModel


class SetTransformerForNextTokenPrediction(
    SetPooledHeadMixin, ForNextTokenPredictionMixin, SetTransformerPreTrainedModel, GenerationMixin
):
    """The last `context_length` tokens as a set (no order), pooled by PMA, vocabulary projection."""

    base_model_class = SetTransformerModel
