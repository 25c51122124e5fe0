"""The decays of causal linear attention, in one table: `config.linear_attention_decay` names an entry of `DECAYS`.

A decay g_t in (0, 1] per head and key position makes the recurrent state forget,
S_t = g_t S_{t-1} + phi(k_t) v_t^T (and the normaliser likewise): key j weighs prod_{j < t <= i} g_t at query i. The
ops take its logarithm, log g <= 0 (`linear_ops`); each entry here is the module a layer builds to give it,
`(key states (b, m, hidden)) -> log g (b, h, m)` in float32:

- `"none"`: no decay (every past token weighs the same forever: Katharopoulos et al. 2020, Shen et al. 2021);
- `"fixed"`: RetNet's per-head constant (Sun et al. 2023), gamma_h = 1 - 2^(-5-h) for head h = 0..H-1 (from a
  ~32-token memory to one of 2^(4+H) tokens), no parameters;
- `"gated"`: simple gated linear attention's data-dependent scalar per token and head (Yang et al. 2024; fla's
  `simple_gla`): log g = logsigmoid(x W^T + b) / 16 from the token's own state x, the 16 (fla's
  `gate_logit_normalizer`) keeping decays near 1 at init; b starts at the fixed schedule (with W ~ 0, the gated model
  starts as the fixed one).

A decay needs an order: it applies to causal attention only (`decay_applies`, the one statement of the rule). A
non-causal attention in the same model (ISAB's inducing points reading a prefix) runs without it, and a forward with no
causal attention at all (a set, a classifier) is refused (`checks.check_decay_applies`), as is a train_lm.py run of such
a head.
"""

import torch
import torch.nn.functional as F
from torch import nn

GATE_LOGIT_NORMALISER = 16.0


def retnet_log_decay(num_heads, device=None):
    """log gamma_h = log(1 - 2^(-5-h)), h = 0..num_heads-1 (Sun et al. 2023), float32 (num_heads,)."""
    exponents = -5.0 - torch.arange(num_heads, dtype=torch.float32, device=device)
    return torch.log1p(-torch.exp2(exponents))


class FixedDecay(nn.Module):
    """RetNet's per-head decay, the same at every position: (b, m, hidden) -> (b, h, m), no parameters."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads

    def forward(self, states):
        b, m = states.shape[:2]
        return retnet_log_decay(self.num_heads, states.device)[None, :, None].expand(b, self.num_heads, m)


class GatedDecay(nn.Module):
    """A per-token, per-head gate from the token's state: log g = logsigmoid(x W^T + b) / 16, (b, m, hidden) ->
    (b, h, m), computed in float32 (its cumulative sums over the sequence need the precision)."""

    def __init__(self, hidden_size, num_heads):
        super().__init__()
        self.num_heads = num_heads
        self.weight = nn.Parameter(torch.empty(num_heads, hidden_size))
        self.bias = nn.Parameter(torch.empty(num_heads))

    def schedule_bias(self):
        """The bias whose gate at x W^T = 0 is the fixed schedule's: logsigmoid(b) / 16 = log gamma_h."""
        target = retnet_log_decay(self.num_heads) * GATE_LOGIT_NORMALISER  # logsigmoid(b), < 0
        return target - torch.log(-torch.expm1(target))  # b = y - log(1 - e^y)

    def forward(self, states):
        with torch.autocast(device_type=states.device.type, enabled=False):
            logits = F.linear(states.float(), self.weight.float(), self.bias.float())  # (b, m, h)
        return (F.logsigmoid(logits) / GATE_LOGIT_NORMALISER).transpose(1, 2)


DECAYS = {"none": None, "fixed": FixedDecay, "gated": GatedDecay}


def check_decay(name):
    """`name` must be a `DECAYS` entry; a ValueError naming them otherwise."""
    if not isinstance(name, str) or name not in DECAYS:
        raise ValueError(f"`linear_attention_decay` must be one of {list(DECAYS)}, got {name!r}.")


def decay_applies(name, causal):
    """Whether decay `name` can apply to attention that runs in causal order (`causal`) or not: a decay needs an order
    to decay along; "none" applies anywhere. Layers build their decay by it (`attention`), and the checks of a forward
    (`checks.check_decay_applies`) and of train_lm.py's flags refuse a decay where it is False."""
    return causal or DECAYS[name] is None


def decay_module(name, hidden_size, num_heads):
    """The module of decay `name` for a layer of `num_heads` heads over `hidden_size` states, or None for "none"."""
    check_decay(name)
    return None if DECAYS[name] is None else DECAYS[name](hidden_size, num_heads)

