"""Every numeric op the models use, each behind one dispatch point (see dispatch.py).

Each function below picks the Triton kernel for CUDA tensors when one exists, else the torch
reference in `<op>/reference.py`, which is the definition of correct.
"""

from deltaserve.kernels.activation import reference as _act
from deltaserve.kernels.attention import reference as _attn
from deltaserve.kernels.conv1d import reference as _conv
from deltaserve.kernels.gdn import reference as _gdn
from deltaserve.kernels.moe import reference as _moe
from deltaserve.kernels.norm import reference as _norm
from deltaserve.kernels.rotary import reference as _rotary
from deltaserve.kernels.sampling import reference as _sampling

rms_norm = _norm.rms_norm
add_rms_norm = _norm.add_rms_norm
gated_rms_norm = _norm.gated_rms_norm
apply_rotary = _rotary.apply_rotary
silu_and_mul = _act.silu_and_mul
store_kv = _attn.store_kv
paged_attention = _attn.paged_attention
causal_conv1d = _conv.causal_conv1d
chunk_gated_delta_rule = _gdn.chunk_gated_delta_rule
recurrent_gated_delta_rule = _gdn.recurrent_gated_delta_rule
moe_route = _moe.moe_route
moe_experts = _moe.moe_experts
apply_penalties = _sampling.apply_penalties
sample_from_logits = _sampling.sample_from_logits

__all__ = [
    "rms_norm", "add_rms_norm", "gated_rms_norm", "apply_rotary", "silu_and_mul", "store_kv",
    "paged_attention", "causal_conv1d", "chunk_gated_delta_rule", "recurrent_gated_delta_rule",
    "moe_route", "moe_experts", "apply_penalties", "sample_from_logits",
]
