"""Which weights a device's backend refuses at load, so that llama.cpp keeps them on the host.

The loader builds the op each weight is used in (``LLM_TENSOR_INFOS``' op) with probe shapes and asks the
device's backend whether it runs it (``weight_buft_supported``, src/llama-model-loader.cpp:927-1078); a
weight whose op is refused falls to the next buffer type of the list, the host's, and the scheduler then
runs that op on the host too (its weight chooses: ggml-backend.cpp:1100-1120). Most ops run everywhere; the
state-space kernels do not:

* ``GGML_OP_SSM_SCAN`` (the weight ``ssm_a``; probe: d_state from ``ssm_a`` for Mamba-1, the file's for
  Mamba-2, head_dim = d_inner / heads, loader:1010-1026). ggml-cuda (ggml-cuda.cu:5602-5618): Mamba-2 with
  d_state 96, 128 or 256 and head_dim a multiple of 16; Mamba-1 with d_state 16, one element per head, heads
  a multiple of 128 and one group. ggml-vulkan (ggml-vulkan.cpp:15905-15941): Mamba-2 only, d_state 128 or
  256, head_dim a multiple of 16.
* ``GGML_OP_SSM_CONV`` (``ssm_conv1d``, LFM2's ``shortconv.conv``; probe: the weight's channels): ggml-cuda
  takes channels that are a multiple of 128 (ggml-cuda.cu:5620-5623).

Metal, SYCL and an RPC server's CPU backend take them (an RPC device is taken as a remote CPU backend).
"""

from __future__ import annotations

from llamafit.gguf.hparams import Hparams
from llamafit.gguf.model import Tensor
from llamafit.memory import backends

STATE_OPS = (".ssm_a", ".ssm_conv1d", ".shortconv.conv")  # the weights of the ops some backend refuses


def refuses_somewhere(t: Tensor) -> bool:
    """Whether some backend may refuse ``t``'s op: only these weights need ``refuses``."""
    return t.name.removesuffix(".weight").endswith(STATE_OPS)


def refuses(device: str, t: Tensor, hp: Hparams) -> bool:
    """Whether ``device``'s backend refuses the op ``t`` is loaded for (so the weight stays on the host)."""
    name = t.name.removesuffix(".weight")
    if not name.endswith(STATE_OPS):
        return False
    b = backends.backend(device)
    if b is None:
        return False
    shape = t.info.shape
    if name.endswith(".ssm_a") and len(shape) >= 2:
        mamba2 = shape[0] == 1
        d_state = hp.ssm_d_state if mamba2 else shape[0]
        n_head = shape[1]
        head_dim = hp.ssm_d_inner // n_head if n_head else 0
        if b.cuda_like:
            if mamba2:
                return d_state not in (96, 128, 256) or head_dim % 16 != 0
            return not (d_state == 16 and head_dim == 1 and n_head % 128 == 0 and max(1, hp.ssm_n_group) == 1)
        if b.name == "Vulkan":
            return not mamba2 or d_state not in (128, 256) or head_dim % 16 != 0
        return False
    if name.endswith((".ssm_conv1d", ".shortconv.conv")) and len(shape) >= 2:
        return b.cuda_like and shape[1] % 128 != 0
    return False
