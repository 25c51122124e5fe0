"""The heads every family shares, written once: sequence pooling (PMA or mean), the LM output layer (dense or adaptive
softmax), masked LM, sequence classification, and next-token prediction over a window (many targets after a
bidirectional prefix, or the literal one-target window)."""

from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from transformers.modeling_outputs import CausalLMOutput, MaskedLMOutput, SequenceClassifierOutput
from transformers.utils import can_return_tuple

from .attention import AttentionMask
from .blocks import PMA, masked_mean
from .checks import checked
from .label_checks import classification_labels, many_target_labels, masked_lm_labels, one_target_labels
from .layers import TiedAdaptiveLogSoftmax
from .losses import problem_type_of, token_loss
from .set_packing import sets_of


class SequencePool(nn.Module):
    """Sequence -> one vector: PMA with one seed (Lee et al. 2019) or a masked mean, per `config.pooling`."""

    def __init__(self, config):
        super().__init__()
        self.pma = PMA(config, num_seeds=1) if config.pooling == "pma" else None

    def forward(self, hidden_states, key_mask=None, packing=None):
        """(b, n, hidden), (b, n) bool -> (b, hidden). A packed row of S sets (`packing`): (1, total, hidden) ->
        (S, hidden), each set pooled alone."""
        sets = sets_of(packing, hidden_states.device)
        if self.pma is None:
            return masked_mean(hidden_states, key_mask, sets)
        mask = AttentionMask.build(key_mask) if sets is None else sets.route("pool")
        return self.pma(hidden_states, mask)[0][:, 0]


class PooledHeadMixin:
    """A head that reads one vector per example from the base model. Families override `pool_outputs`."""

    def make_head_pool(self, config):
        return SequencePool(config)

    def pool_outputs(self, outputs, key_mask, packing=None):
        """Default: pool the per-element states with this head's own `SequencePool`. `packing`: a packed row's, whose
        sets are pooled one by one."""
        return self.head_pool(outputs.last_hidden_state, key_mask, packing)

    def run_base_model(self, attention_mask, output_attentions, output_hidden_states, **inputs):
        """-> (the base model's output, (b, hidden) pooled over the real elements; (S, hidden) for a packed row of S
        sets)."""
        inputs = {k: v for k, v in inputs.items() if v is not None and k != "num_items_in_batch"}
        outputs = self.model(
            attention_mask=attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **inputs,
        )
        key_mask = None if attention_mask is None else attention_mask.bool()
        return outputs, self.pool_outputs(outputs, key_mask, inputs.get("packing"))


class LMHeadMixin:
    """A vocabulary projection `lm_head`, tied to the input embedding when `config.tie_word_embeddings`; an adaptive
    softmax, tied to the adaptive input when `config.tie_adaptive_weights` (`layers.TiedAdaptiveLogSoftmax`)."""

    predicts_tokens = True
    predicts_every_position = True

    @property
    def _tied_weights_keys(self):
        # transformers' {tied parameter: its source}; also the patterns by which a save finds the copies to drop
        lm_head = self._modules.get("lm_head")
        if isinstance(lm_head, TiedAdaptiveLogSoftmax):
            return lm_head.tied_keys("lm_head", "model.embeddings.embed_tokens")
        return {"lm_head.weight": "model.embeddings.embed_tokens.weight"}

    def get_expanded_tied_weights_keys(self, all_submodels=False):
        """As transformers', which ties only with `tie_word_embeddings` (refused beside an adaptive layer): a tied
        adaptive softmax's pairs are tied as well."""
        if not all_submodels and isinstance(self._modules.get("lm_head"), TiedAdaptiveLogSoftmax):
            return dict(self._tied_weights_keys)
        return super().get_expanded_tied_weights_keys(all_submodels)

    def make_lm_head(self, config):
        if config.adaptive_softmax_cutoffs and config.tie_adaptive_weights:
            return TiedAdaptiveLogSoftmax(
                config.hidden_size,
                config.vocab_size,
                config.adaptive_softmax_cutoffs,
                div_value=float(config.adaptive_softmax_div_value),
                tie_projections=config.tie_adaptive_projections,
            )
        if config.adaptive_softmax_cutoffs:  # Grave et al. 2017; ids ordered by decreasing frequency
            return nn.AdaptiveLogSoftmaxWithLoss(
                config.hidden_size,
                config.vocab_size,
                config.adaptive_softmax_cutoffs,
                div_value=float(config.adaptive_softmax_div_value),
            )
        return nn.Linear(config.hidden_size, config.vocab_size, bias=False)

    @property
    def adaptive_output(self):
        return isinstance(self.lm_head, nn.AdaptiveLogSoftmaxWithLoss)

    def lm_logits(self, hidden_states):
        """(..., hidden) -> (..., vocab): logits, or the adaptive softmax's exact log-probabilities (which softmax,
        argmax, sampling and cross-entropy treat exactly as logits)."""
        if not self.adaptive_output:
            return self.lm_head(hidden_states)
        flat = hidden_states.reshape(-1, hidden_states.shape[-1])
        with torch.autocast(device_type=flat.device.type, enabled=False):  # its index_copy_ mixes dtypes otherwise
            # the output layer's dtype, read from a cluster (a tied layer's head is two matrices)
            log_probs = self.lm_head.log_prob(flat.to(self.lm_head.tail[0][1].weight.dtype))
        return log_probs.view(*hidden_states.shape[:-1], -1)

    def lm_loss(self, hidden_states, targets, divisor=None):
        """Summed cross-entropy of `targets` (-100 ignored) from (..., hidden) states, / `divisor` (default: the
        number of counted targets; 0 with a zero gradient when there are none).

        The full output layer reads no values (no host sync). The adaptive softmax computes only the targets' rows and
        clusters: selecting them is data-dependent (a host sync, as in `nn.AdaptiveLogSoftmaxWithLoss` itself), which
        is what makes it the choice for a CPU."""
        hidden = hidden_states.reshape(-1, hidden_states.shape[-1])
        targets = targets.reshape(-1).to(hidden.device)
        keep = targets != -100
        if self.adaptive_output:
            hidden, targets = hidden[keep], targets[keep]
            with torch.autocast(device_type=hidden.device.type, enabled=False):  # as in lm_logits
                total = -self.lm_head(hidden.to(self.lm_head.tail[0][1].weight.dtype), targets).output.float().sum()
        else:
            total = F.cross_entropy(self.lm_head(hidden).float(), targets, ignore_index=-100, reduction="sum")
        return total / (keep.sum().clamp_min(1) if divisor is None else divisor)

    def get_output_embeddings(self):
        return None if self.adaptive_output else self.lm_head

    def set_output_embeddings(self, value):
        self.lm_head = value


class ForMaskedLMMixin(LMHeadMixin):
    """Masked language modelling: a vocabulary projection of every position; loss where labels are not -100."""

    objective = "masked_lm"  # the toolkit's OBJECTIVES row: how it is trained and scored
    check_labels = masked_lm_labels

    def __init__(self, config):
        super().__init__(config)
        self.model = self.base_model_class(config)
        self.lm_head = self.make_lm_head(config)
        self.post_init()

    @checked
    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        r"""labels (`torch.LongTensor` of shape (batch, length)): token ids to predict, -100 elsewhere.

        With an adaptive softmax (`adaptive_softmax_cutoffs`) the logits are exact log-probabilities, and a training
        forward with `labels` computes only the loss (`logits=None`): the masked positions are a small share of the
        block, and full log-probabilities of every position would cost most of the step."""
        model_kwargs = {k: v for k, v in kwargs.items() if k not in ("num_items_in_batch",)}
        outputs = self.model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            **model_kwargs,
        )
        hidden = outputs.last_hidden_state
        loss = logits = None
        if self.adaptive_output and labels is not None:
            divisor = kwargs.get("num_items_in_batch")
            loss = self.lm_loss(hidden, labels, divisor=divisor.to(hidden.device) if torch.is_tensor(divisor) else divisor)
            if not self.training:
                logits = self.lm_logits(hidden)
        else:
            logits = self.lm_logits(hidden)  # (b, n, vocab)
            if labels is not None:
                loss = token_loss(logits, labels, kwargs.get("num_items_in_batch"))
        output = MaskedLMOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output


class ForSequenceClassificationMixin(PooledHeadMixin):
    """Set/sequence classification or regression, with transformers' `problem_type` conventions."""

    accepts_loss_kwargs = False  # mean loss: the Trainer scales it for gradient accumulation
    # transformers' name for the task. Trained by the user's own script (run_glue.py) or the set tasks, not by a row of
    # the toolkit's OBJECTIVES.
    objective = "sequence_classification"
    check_labels = classification_labels
    built_from = ("num_labels",)  # the classifier's outputs (`id2label` may rename them)

    def __init__(self, config):
        super().__init__(config)
        self.num_labels = config.num_labels
        self.model = self.base_model_class(config)
        self.head_pool = self.make_head_pool(config)
        self.head_dropout = nn.Dropout(config.hidden_dropout_prob)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)
        self.post_init()

    @checked
    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        input_features=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        r"""labels (`torch.LongTensor` of shape (batch,), or float (batch, num_labels) for multi-label/regression)."""
        outputs, pooled = self.run_base_model(
            attention_mask,
            output_attentions,
            output_hidden_states,
            input_ids=input_ids,
            input_features=input_features,
            inputs_embeds=inputs_embeds,
            **kwargs,
        )
        logits = self.classifier(self.head_dropout(pooled))  # (b, num_labels)
        loss = None
        if labels is not None:
            if problem_type_of(labels, self.config.num_labels, self.config)[0] != "single_label_classification":
                labels = labels.to(logits.dtype)  # 0/1 targets or regression values, as the logits
            loss = self.loss_function(labels=labels, pooled_logits=logits, config=self.config)
        output = SequenceClassifierOutput(
            loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions
        )
        return output


class NextTokenMode(NamedTuple):
    """The next-token head in one `config.next_token_mode`: the toolkit's OBJECTIVES row it is trained and scored by,
    its forward (the name of a private method, which `forward` calls once the inputs are checked), its labels' check
    (`checks`), whether it attends in causal order and whether it pools each target with its own PMA query."""

    objective: str
    forward: str
    check_labels: Callable
    attends_causally: bool
    pools_each_target: bool


class ForNextTokenPredictionMixin(PooledHeadMixin, LMHeadMixin):
    """Next-token prediction over a window (the design document's WikiText-2 model): the family's base model over the
    last `context_length` tokens, a pooling (`head_pool`), a vocabulary projection (`lm_head`), and `generate()`, which
    slides the window (the family's class lists `GenerationMixin` after its `PreTrainedModel`, as transformers
    requires). `config.next_token_mode` picks the forward at construction; both modes have the same modules, so one
    class serves the checkpoints of either (transformers maps a config class to one causal-LM class).

    - "many" (`_forward_many_targets`): one pass over a window predicts the next token at each of its last
      `target_length` positions. The positions before them are a prefix that the base model reads bidirectionally
      (`prefix_length`: encoder, Set Transformer, whose inducing points summarise the prefix) or through a causal
      cross-attention (Perceiver IO, as Perceiver AR); a target position sees the prefix and the positions up to
      itself, never its own target or a later token. Each target's pooling query is the PMA seed plus its own state
      (a shared seed alone gives every target the same query, which cannot single out the most recent tokens).
      `logits` (b, n, vocab): the targets' predictions, zeros (a uniform distribution) at the prefix positions.
      `labels` are causal-LM labels shaped like the inputs, shifted inside; the loss counts the targets only.
    - "window" (`_forward_one_target`, the design document's literal model): the window, pooled (PMA or mean,
      `config.pooling`), predicts the token after it: `logits` (b, 1, vocab). `labels` (b,) hold that token, or are
      causal-LM labels shaped like `input_ids`, read as "predict each row's last token from the tokens before it"."""

    accepts_loss_kwargs = False  # mean loss: the Trainer scales it for gradient accumulation
    modes = {
        "many": NextTokenMode("many_target_windows", "_forward_many_targets", many_target_labels,
                              attends_causally=True, pools_each_target=True),
        "window": NextTokenMode("one_target_window", "_forward_one_target", one_target_labels,
                                attends_causally=False, pools_each_target=False),
    }
    own_prefix_length = True  # where the targets begin in the window ("many"; refused by "window")
    predicts_every_position = False
    takes_packed_batches = True  # each sequence's last window (`_forward_packed`)

    def __init__(self, config):
        super().__init__(config)
        self.next_token_mode = config.next_token_mode
        self.model = self.base_model_class(config)
        self.head_pool = self.make_head_pool(config)
        self.lm_head = self.make_lm_head(config)
        self.post_init()

    @classmethod
    def in_mode(cls, next_token_mode):
        return cls.modes[next_token_mode]

    @property
    def mode(self):
        # the mode chosen at construction (the config's before then: `checks.check_model_config` reads it first)
        return self.modes[self.__dict__.get("next_token_mode", self.config.next_token_mode)]

    objective = property(lambda self: self.mode.objective)
    attends_causally = property(lambda self: self.mode.attends_causally)
    pools_each_target = property(lambda self: self.mode.pools_each_target)

    def check_labels(self, inputs, b, n):
        return self.mode.check_labels(self, inputs, b, n)

    @checked
    @can_return_tuple
    def forward(
        self,
        input_ids=None,
        attention_mask=None,
        inputs_embeds=None,
        labels=None,
        output_attentions=None,
        output_hidden_states=None,
        **kwargs,
    ):
        r"""labels (`torch.LongTensor`): "many": causal-LM labels (batch, length), -100 ignored, shifted inside;
        "window": the token after each window (batch,), or causal-LM labels shaped like `input_ids` (the last token of
        each row is then the target, and the window ends before it).
        prefix_length (`int`, *optional*, a keyword argument, "many" only): where the prefix of the (last
        `context_length` tokens of the) window ends; every later position is a target. Default: all but the last
        `target_length` positions. The same prefix gives a target the same prediction in any window that ends at or
        after it (evaluation passes it for the short windows at the start of a text).
        shift_labels (`torch.LongTensor` of shape (batch, length), *optional*, a keyword argument): targets already
        aligned with the positions (`shift_labels[:, i]` is what position i predicts), as transformers' causal LMs
        take them under sequence/context parallelism; they replace `labels` ("window": the last one is the target)."""
        kwargs.pop("use_cache", None)  # no cache: every step reads the whole window
        predict = getattr(self, self.modes[self.next_token_mode].forward)
        packing = kwargs.pop("packing", None)
        if packing is not None:
            return self._forward_packed(packing, predict, input_ids, inputs_embeds, labels, output_attentions,
                                        output_hidden_states, **kwargs)
        return predict(input_ids, attention_mask, inputs_embeds, labels, output_attentions, output_hidden_states,
                       **kwargs)

    def _forward_packed(self, packing, predict, input_ids, inputs_embeds, labels, output_attentions,
                        output_hidden_states, shift_labels=None, prefix_length=None, position_ids=None, **kwargs):
        """A packed row of S sequences (`packing`): the head reads each sequence's last window only, so the row is cut
        into those windows (the last `context_length` + 1 tokens of each: the "window" mode's causal-LM labels take
        one more), a left-padded batch of S rows that `predict` reads as any padded batch; no row is longer than the
        window, and a sequence at least that long has no padding. "many": logits (1, total, vocab), each sequence's
        targets at its own positions, zeros elsewhere; "window": logits (S, 1, vocab). The loss is the padded
        batch's: the mean over every sequence's targets. `position_ids` (checked against the boundaries) are
        replaced by each window's own, as alone."""
        if prefix_length is not None:
            raise ValueError("`prefix_length` takes an ordinary batch: in a packed row each sequence's window has its "
                             "own prefix (all but the last `target_length` positions).")
        if output_attentions or output_hidden_states:
            raise ValueError("A next-token head reads a packed row as one window per sequence: its hidden states and "
                             "attention weights are the windows', not the row's. Pass a padded batch to read them.")
        windowed = self.next_token_mode == "window"
        if windowed and labels is not None and labels.dim() == 1 and packing.num_sequences != labels.shape[0]:
            raise ValueError("In a packed row the window head's `labels` are causal-LM labels shaped like `input_ids` "
                             "(1, total): each sequence's last token is its target.")
        if windowed and labels is not None and packing.lengths is not None and min(packing.lengths) < 2:
            raise ValueError("The window head predicts each packed sequence's last token from the tokens before it: "
                             f"every sequence needs 2 or more tokens; got lengths {list(packing.lengths)[:8]}.")
        index, real = packing.last_windows(self.config.context_length + 1)  # (S, L)

        def cut(x, fill):  # (1, total, ...) -> (S, L, ...), `fill` at the padding slots
            if x is None:
                return None
            rows = x[0][index]
            return torch.where(real.view(*real.shape, *[1] * (rows.dim() - 2)), rows, fill)

        labels = labels if labels is None or labels.dim() == 1 else cut(labels, -100)
        outputs = predict(cut(input_ids, 0), real.long(), cut(inputs_embeds, 0.0), labels, None, None,
                          shift_labels=cut(shift_labels, -100), **kwargs)
        if windowed or outputs.logits is None:
            return outputs
        # each window's positions back to the row's; the padding slots go to a spare last position (no boolean index:
        # no host read)
        to = torch.where(real, index, packing.total).flatten()
        logits = outputs.logits.new_zeros(packing.total + 1, outputs.logits.shape[-1])
        logits = logits.index_put((to,), outputs.logits.flatten(0, 1), accumulate=True)
        return CausalLMOutput(loss=outputs.loss, logits=logits[None, :-1])

    def _forward_many_targets(self, input_ids, attention_mask, inputs_embeds, labels, output_attentions,
                             output_hidden_states, shift_labels=None, prefix_length=None, **kwargs):
        if shift_labels is not None:
            labels = shift_labels
        full_length = (input_ids if input_ids is not None else inputs_embeds).shape[1]
        window = self.config.context_length
        input_ids, inputs_embeds, attention_mask = (
            None if x is None else x[:, -window:] for x in (input_ids, inputs_embeds, attention_mask)
        )
        length = min(full_length, window)
        num_targets = min(self.config.target_length, length) if prefix_length is None else length - prefix_length
        outputs = self.model(
            input_ids=input_ids,
            inputs_embeds=inputs_embeds,
            attention_mask=attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            return_dict=True,
            prefix_length=length - num_targets,  # every base model: a bidirectional prefix, then the targets
            **{k: v for k, v in kwargs.items() if k != "num_items_in_batch"},
        )
        key_mask = None if attention_mask is None else attention_mask.bool()
        states = self.target_states(outputs, num_targets, key_mask)  # (b, t, hidden)
        if labels is not None and shift_labels is None:
            labels = F.pad(labels, (0, 1), value=-100)[:, 1:]  # position i predicts token i + 1
        loss, logits = self.target_loss_and_logits(states, None if labels is None else labels[:, -num_targets:], full_length)
        return CausalLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    def _forward_one_target(self, input_ids, attention_mask, inputs_embeds, labels, output_attentions,
                           output_hidden_states, shift_labels=None, prefix_length=None, **kwargs):
        if shift_labels is not None:
            labels = shift_labels[:, -1]  # the target of the window's last position: the token after it
        elif labels is not None and labels.dim() == 2 and input_ids is not None and labels.shape == input_ids.shape:
            input_ids, labels = input_ids[:, :-1], labels[:, -1]
            attention_mask = None if attention_mask is None else attention_mask[:, :-1]
        window = self.config.context_length
        outputs, pooled = self.run_base_model(
            None if attention_mask is None else attention_mask[:, -window:],
            output_attentions,
            output_hidden_states,
            input_ids=None if input_ids is None else input_ids[:, -window:],
            inputs_embeds=None if inputs_embeds is None else inputs_embeds[:, -window:],
            **kwargs,
        )
        logits = self.lm_logits(pooled).unsqueeze(1)  # (b, 1, vocab)
        loss = None if labels is None else F.cross_entropy(logits[:, 0].float(), labels, ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits, hidden_states=outputs.hidden_states, attentions=outputs.attentions)

    def target_states(self, outputs, num_targets, key_mask):
        """(base model outputs, t, (b, n) bool or None) -> (b, t, hidden). Default (encoder, Perceiver AR): one PMA
        query per target (the seed plus the target's state) reads the states up to the target."""
        states = outputs.last_hidden_state  # (b, m, hidden), the last t of them the targets'
        m = states.shape[1]
        mask = AttentionMask.build(
            None if key_mask is None else key_mask[:, -m:],
            causal=True,
            num_queries=num_targets,
            num_keys=m,
        )
        pooled, _ = self.head_pool.pma(states, mask, queries=states[:, -num_targets:])
        return pooled

    def target_loss_and_logits(self, states, targets, length):
        """(b, t, hidden) states, (b, t) targets or None -> (loss or None, logits (b, length, vocab) or None: zeros
        before the targets). A training step with targets computes the loss only."""
        if targets is not None and self.training and torch.is_grad_enabled():
            return self.lm_loss(states, targets), None  # no full logits while training
        target_logits = self.lm_logits(states)  # (b, t, vocab)
        loss = None if targets is None else token_loss(target_logits, targets)
        logits = target_logits.new_zeros(states.shape[0], length, target_logits.shape[-1])
        logits[:, length - states.shape[1] :] = target_logits
        return loss, logits

    def prepare_inputs_for_generation(self, input_ids, attention_mask=None, inputs_embeds=None,
                                      is_first_iteration=False, **kwargs):
        """generate() would feed only the newest token once it believes a cache exists: feed the whole window. With
        `inputs_embeds` (the prompt as vectors; transformers' decoders read them at the first step only, then keep them
        in their cache), every step reads those vectors followed by the tokens generated so far (generate()'s
        `input_ids`, which start empty), embedded as `input_ids` are (`get_input_embeddings`): this head keeps no
        cache."""
        if kwargs.get("position_ids") is not None:
            raise ValueError(
                f"generate() of {type(self).__name__} takes no `position_ids`: each step reads the last "
                f"`context_length` ({self.config.context_length}) tokens, whose positions it counts from the attention "
                "mask (left padding is skipped). Generate without them."
            )
        window = self.config.context_length
        if inputs_embeds is None:
            inputs = {"input_ids": input_ids[:, -window:]}
        else:
            if is_first_iteration and input_ids.shape[1]:
                raise ValueError(
                    f"generate() of {type(self).__name__} takes the prompt as `input_ids` or as `inputs_embeds`, not "
                    f"both (got {input_ids.shape[1]} ids and {inputs_embeds.shape[1]} vectors): it reads its whole "
                    "window at every step, and which of the two is the prompt would be a guess."
                )
            generated = self.get_input_embeddings()(input_ids).to(inputs_embeds.dtype)  # (b, steps so far, hidden)
            inputs = {"inputs_embeds": torch.cat([inputs_embeds, generated], dim=1)[:, -window:]}
        if attention_mask is not None:
            inputs["attention_mask"] = attention_mask[:, -window:]
        return inputs

    def _supports_default_dynamic_cache(self):
        return False
