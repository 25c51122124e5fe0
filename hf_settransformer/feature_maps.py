"""The feature maps of linear attention, phi(Q) (phi(K)^T V) / (phi(Q) (phi(K)^T 1)), in one table. The config, the
PyTorch ops (`linear_ops.py`), their float64 references (`linear_naive.py`), the Triton kernels' host side
(`linear_triton.py`) and the scripts read `FEATURE_MAPS`; none of them branches on a map's name.

An elementwise map is applied as it is (`phi`). A stabilised one, exp, would overflow so applied: the ops, references
and kernels compute it on a path of their own. Non-causal, it is Shen et al.'s efficient attention (a softmax over the
features for queries, over the sequence for keys); causal, the ratio above with phi = exp, the keys shifted by their
running per-feature maxima (folded into the queries, so the ratio is unchanged), which a state carries as `k_max`.

A new elementwise map is an entry here; the Triton kernels compute it once `linear_triton._phi` and `_phi_slope` have
a branch for its `triton_id` and `linear_triton.KERNEL_IDS` lists it (until then the PyTorch ops do).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class FeatureMap:
    name: str
    phi: Callable  # elementwise, as the PyTorch ops apply it to q and k (in fp32)
    exact: Callable | None = None  # the float64 references' form where phi's is not exact; None: phi
    stabilised: bool = False  # computed with per-feature key maxima on the ops', references' and kernels' exp path
    triton_id: int | None = None  # the `PHI` constexpr the kernels branch on; None: PyTorch ops only
    paper: str = ""
    description: str = ""

    def __post_init__(self):
        if self.exact is None:
            object.__setattr__(self, "exact", self.phi)


def _elu1(x):
    """elu(x) + 1 as the ops' fp32 takes it: off by up to ~1e-7 (cancellation) for negative x, and about a fifth of
    the exact form's cost (forward and backward on CPU). Compiled, the exact form (one fused kernel there): torch
    2.13's AOT autograd gives elu's backward of a non-contiguous tensor (heads split off a projection) strides its
    kernel does not produce, and the compiled backward fails on a view ("view size is not compatible")."""
    if torch.compiler.is_compiling():
        return _elu1_exact(x)
    return F.elu(x) + 1.0


def _elu1_exact(x):
    """elu(x) + 1 in its exact form (`elu(x) + 1` cancels to 0 in low precision); clamped, as exp(large x) would
    give NaN gradients through the branch `where` drops."""
    return torch.where(x > 0, x + 1.0, torch.exp(torch.clamp(x, max=0.0)))


FEATURE_MAPS = {
    "elu": FeatureMap(
        name="elu",
        phi=_elu1,
        exact=_elu1_exact,
        triton_id=0,
        paper="Katharopoulos et al. 2020",
        description="elu(x) + 1",
    ),
    "exp": FeatureMap(
        name="exp",
        phi=torch.exp,
        stabilised=True,
        triton_id=1,
        paper="Shen et al. 2021",
        description="exp, stabilised by per-feature key maxima; non-causal, softmaxes over features and over keys",
    ),
}


def get_feature_map(name):
    """The table's entry `name`; a ValueError naming the table's names otherwise (as the config's other choices)."""
    if not isinstance(name, str) or name not in FEATURE_MAPS:
        raise ValueError(f"`feature_map` must be one of {list(FEATURE_MAPS)}, got {name!r}.")
    return FEATURE_MAPS[name]
