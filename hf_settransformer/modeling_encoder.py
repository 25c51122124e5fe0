"""Pre-norm Transformer encoder (Vaswani et al. 2017) with ScaleNorm (Nguyen & Salazar 2019) and selectable
softmax or linear attention. Each block is `MAB(X, X)`: `H = X + Attn(Norm(X))`, `out = H + FF(Norm(H))`; a final
norm closes the stack. With `position_embedding_type="none"` the encoder is permutation equivariant. A packed row
(several sequences in one, `packing.py`): each sequence attends to itself only, its positions counted from its start.
"""


from torch import nn
from transformers import GenerationMixin
from transformers.modeling_outputs import BaseModelOutput
from .blocks import MAB
from .checks import checked
from .configuration_encoder import TransformerEncoderConfig
from .heads import ForMaskedLMMixin, ForNextTokenPredictionMixin, ForSequenceClassificationMixin
from .layers import InputEmbeddings, make_norm
from .modeling_common import HfstPreTrainedModel, record_outputs
from .set_packing import self_route_applies, sets_of


class TransformerEncoderPreTrainedModel(HfstPreTrainedModel):
    config_class = TransformerEncoderConfig


class TransformerEncoderModel(TransformerEncoderPreTrainedModel):
    """Embeddings -> `num_hidden_layers` self-attention blocks -> final norm. Output: `BaseModelOutput`, whose
    `hidden_states` (the embeddings, then every block's output, the last one after the final norm) and `attentions`
    are recorded by transformers' hooks (`_can_record_outputs`)."""

    _can_record_outputs = {"hidden_states": MAB, "attentions": MAB}
    takes_packed_batches = True

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = InputEmbeddings(config)
        self.layers = nn.ModuleList([MAB(config) for _ in range(config.num_hidden_layers)])
        self.final_norm = make_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    @checked
    @record_outputs
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        input_features=None,
        inputs_embeds=None,
        output_attentions=None,
        output_hidden_states=None,
        prefix_length=None,
        **kwargs,
    ):
        r"""prefix_length (`int`, *optional*): None (default) for bidirectional attention over every position; an int
        for a causal encoder whose first `prefix_length` positions attend to each other bidirectionally (the
        many-target next-token head)."""
        hidden_states, _, mask = self.embed_inputs(
            input_ids,
            input_features,
            inputs_embeds,
            attention_mask,
            position_ids,
            causal=prefix_length is not None,
            prefix_length=prefix_length or 0,
            packing=kwargs.get("packing"),
        )
        if mask.packing is not None and self_route_applies(self.config, output_attentions):
            mask = sets_of(mask.packing, hidden_states.device).route("self")  # segmented; else block-diagonal
        for layer in self.layers:
            hidden_states, _, _ = layer(hidden_states, mask=mask, output_attentions=output_attentions)
        return BaseModelOutput(
            last_hidden_state=self.final_norm(hidden_states),
        )


class TransformerEncoderForMaskedLM(ForMaskedLMMixin, TransformerEncoderPreTrainedModel):
    """Encoder with a (tied) vocabulary projection at every position."""

    takes_packed_batches = True
    base_model_class = TransformerEncoderModel


class TransformerEncoderForSequenceClassification(ForSequenceClassificationMixin, TransformerEncoderPreTrainedModel):
    """Encoder, attention pooling (PMA, one seed) or mean pooling, linear classifier; a packed row of S sequences
    gives logits (S, num_labels)."""

    takes_packed_batches = True
    base_model_class = TransformerEncoderModel


class TransformerEncoderForNextTokenPrediction(
    ForNextTokenPredictionMixin, TransformerEncoderPreTrainedModel, GenerationMixin
):
    """Encoder over the last `context_length` tokens, PMA pooling, vocabulary projection (the design document's
    WikiText-2 language model)."""

    base_model_class = TransformerEncoderModel
