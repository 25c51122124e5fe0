"""Pre-norm causal Transformer decoder (Vaswani et al. 2017) with ScaleNorm (Nguyen & Salazar 2019) and selectable
softmax or causal linear attention (Katharopoulos et al. 2020). Each block: causal self-attention, an optional
cross-attention to `encoder_hidden_states` (`add_cross_attention=True`, as BERT/GPT-2 do for
`EncoderDecoderModel`), a feed-forward; all pre-normalised, with a final norm after the stack."""

from torch import nn
from transformers import GenerationMixin
from transformers.modeling_outputs import BaseModelOutputWithPastAndCrossAttentions, CausalLMOutputWithCrossAttentions

from .attention import AttentionMask
from .blocks import MAB
from .configuration_decoder import TransformerDecoderConfig
from .layers import InputEmbeddings, make_norm, position_ids_from_mask
from .modeling_common import (
    HfstPreTrainedModel,
    LMHeadMixin,
    check_attention_mask,
    input_shape,
    resolve_output_flags,
    run_stack,
)


class TransformerDecoderPreTrainedModel(HfstPreTrainedModel):
    config_class = TransformerDecoderConfig
    family_auto_map = {"AutoModel": "TransformerDecoderModel", "AutoModelForCausalLM": "TransformerDecoderForCausalLM"}


class TransformerDecoderModel(TransformerDecoderPreTrainedModel):
    """Embeddings -> `num_hidden_layers` causal blocks -> final norm."""

    def __init__(self, config):
        super().__init__(config)
        self.embeddings = InputEmbeddings(config)
        self.layers = nn.ModuleList(
            [
                MAB(config, causal=True, cross_attention=config.add_cross_attention)
                for _ in range(config.num_hidden_layers)
            ]
        )
        self.final_norm = make_norm(config)
        self.gradient_checkpointing = False
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        past_key_values=None,
        use_cache=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        **kwargs,
    ):
        if past_key_values is not None and past_key_values.get_seq_length() > 0:
            raise NotImplementedError("TransformerDecoderModel does not read a cache yet: pass the whole sequence.")
        output_attentions, output_hidden_states, return_dict = resolve_output_flags(
            self.config, output_attentions, output_hidden_states, return_dict
        )
        b, n = input_shape(input_ids, None, inputs_embeds)
        key_mask = check_attention_mask(attention_mask, b, n)
        if position_ids is None and key_mask is not None:
            position_ids = position_ids_from_mask(key_mask, n)  # left padding keeps real tokens at 0, 1, ...
        hidden_states = self.embeddings(input_ids, None, inputs_embeds, position_ids)
        for_softmax = self.config.attention_type == "softmax"
        mask = AttentionMask.build(key_mask, causal=True, num_queries=n, for_softmax=for_softmax)
        cross_mask = None
        if encoder_hidden_states is not None:
            if not self.config.add_cross_attention:
                raise ValueError("`encoder_hidden_states` given but the config has `add_cross_attention=False`.")
            if (
                encoder_hidden_states.dim() != 3
                or encoder_hidden_states.shape[0] != b
                or encoder_hidden_states.shape[-1] != self.config.hidden_size
            ):
                raise ValueError(
                    f"`encoder_hidden_states` must have shape ({b}, source length, {self.config.hidden_size}), "
                    f"got {tuple(encoder_hidden_states.shape)}."
                )
            encoder_key_mask = check_attention_mask(
                encoder_attention_mask, b, encoder_hidden_states.shape[1], name="encoder_attention_mask"
            )
            cross_mask = AttentionMask.build(encoder_key_mask, for_softmax=for_softmax)
        hidden_states, all_states, all_weights, all_cross = run_stack(
            self.layers,
            hidden_states,
            mask,
            output_attentions,
            output_hidden_states,
            cross_states=encoder_hidden_states,
            cross_mask=cross_mask,
        )
        hidden_states = self.final_norm(hidden_states)
        if output_hidden_states:
            all_states = all_states[:-1] + (hidden_states,)
        output = BaseModelOutputWithPastAndCrossAttentions(
            last_hidden_state=hidden_states,
            hidden_states=all_states,
            attentions=all_weights,
            cross_attentions=all_cross,
        )
        return output if return_dict else output.to_tuple()


class TransformerDecoderForCausalLM(LMHeadMixin, TransformerDecoderPreTrainedModel, GenerationMixin):
    """Decoder with a (tied) vocabulary projection: logits at every position, transformers' causal-LM loss
    (`labels` = `input_ids`, shifted inside)."""

    def __init__(self, config):
        super().__init__(config)
        self.model = TransformerDecoderModel(config)
        self.lm_head = self.make_lm_head(config)
        self.post_init()

    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        position_ids=None,
        inputs_embeds=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        past_key_values=None,
        use_cache=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        return_dict=None,
        logits_to_keep=0,
        **kwargs,
    ):
        r"""labels (`torch.LongTensor` (batch, length)): usually `input_ids`; -100 positions are ignored.
        logits_to_keep (`int`): compute logits for the last `logits_to_keep` positions only (0: all)."""
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            encoder_hidden_states=encoder_hidden_states,
            encoder_attention_mask=encoder_attention_mask,
            past_key_values=past_key_values,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
        )
        hidden_states = outputs.last_hidden_state
        if isinstance(logits_to_keep, int) and logits_to_keep > 0:
            hidden_states = hidden_states[:, -logits_to_keep:]
        logits = self.lm_head(hidden_states)  # (b, n, vocab)
        loss = None
        if labels is not None:
            loss = self.loss_function(logits=logits, labels=labels, vocab_size=self.config.vocab_size, **kwargs)
        output = CausalLMOutputWithCrossAttentions(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            cross_attentions=outputs.cross_attentions,
        )
        return output if (return_dict if return_dict is not None else self.config.return_dict) else output.to_tuple()

    def prepare_inputs_for_generation(
        self,
        input_ids,
        attention_mask=None,
        inputs_embeds=None,
        encoder_hidden_states=None,
        encoder_attention_mask=None,
        **kwargs,
    ):
        # No cache yet: every step reads the whole sequence.
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if encoder_hidden_states is not None:
            inputs.update(encoder_hidden_states=encoder_hidden_states, encoder_attention_mask=encoder_attention_mask)
        return inputs

    def _supports_default_dynamic_cache(self):
        return False
