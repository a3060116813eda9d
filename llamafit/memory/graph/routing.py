"""How a MoE layer routes its tokens, read from a model's tensors and header: ``build_moe_ffn``'s arguments as
each builder passes them, shared by the readers of ``shapes`` and ``dsv4``."""

from __future__ import annotations

from llamafit.gguf.model import ModelInfo
from llamafit.memory.graph.trunk import Experts


def read_experts(model: ModelInfo, shapes: dict[str, tuple[int, ...]], il: int) -> Experts | None:
    """The routing of one MoE layer (build_moe_ffn's arguments as each model passes them): Llama and
    Qwen3-MoE softmax with normalized weights; DeepSeek-V2/V3 and GLM-4.5 from the header (gating
    function, expert_weights_norm, expert_weights_scale) with the selection bias exp_probs_b."""
    hp, kv = model.hparams, model.kv
    up = shapes.get(f"blk.{il}.ffn_up_exps.weight")
    if up is None or len(up) != 3 or f"blk.{il}.ffn_gate_up_exps.weight" in shapes:
        return None  # fused gate/up experts: other nodes
    scale = model.number("expert_weights_scale")
    if hp.arch == "gpt-oss":  # SOFTMAX_WEIGHT over biased experts (openai-moe.cpp:132-142)
        return Experts(
            n_expert=up[2], n_used=hp.n_expert_used, n_ff=up[1], scale=scale, softmax_weight=True, biased=True
        )
    if hp.arch in ("llama", "qwen3moe", "qwen3vlmoe", "qwen35moe", "qwen3next"):
        return Experts(n_expert=up[2], n_used=hp.n_expert_used, n_ff=up[1], norm_w=True, scale=scale)
    if hp.arch == "hunyuan-moe":  # softmax, normalized weights, no scale read (hunyuan-moe.cpp:3-8, 147-158)
        return Experts(n_expert=up[2], n_used=hp.n_expert_used, n_ff=up[1], norm_w=True)
    if hp.arch == "llama4":  # sigmoid, weights as they are, no scale read (llama4.cpp:219-230)
        return Experts(n_expert=up[2], n_used=hp.n_expert_used, n_ff=up[1], sigmoid=True, weight_before=True)
    if hp.arch == "qwen2moe":  # softmax, weights as they are, no scale read (qwen2moe.cpp:3-7, 132-143)
        return Experts(n_expert=up[2], n_used=hp.n_expert_used, n_ff=up[1])
    if hp.arch == "granitemoe":  # softmax, normalized, no scale read (granite.cpp:279-290, granite-moe.cpp:3-15)
        if f"blk.{il}.ffn_gate_exps.weight" not in shapes:
            return None  # up-only experts
        return Experts(n_expert=up[2], n_used=hp.n_expert_used, n_ff=up[1], norm_w=True)
    if hp.arch == "ernie4_5-moe":  # softmax, normalized weights, the optional selection bias (ernie4-5-moe.cpp:81-92)
        if f"blk.{il}.ffn_gate_exps.weight" not in shapes:
            return None  # up-only experts
        bias = f"blk.{il}.exp_probs_b.bias" in shapes
        return Experts(n_expert=up[2], n_used=hp.n_expert_used, n_ff=up[1], probs_bias=bias, norm_w=True)
    gating = int(model.number("expert_gating_func"))
    if gating == 0 and hp.arch == "dots1":
        return None  # no gating function in the header: the graph aborts (dots1.cpp:10, 145-155)
    if hp.arch == "minimax-m2":  # the header's gating (none aborts), normalized weights, no scale read
        if gating not in (1, 2) or f"blk.{il}.exp_probs_b.bias" not in shapes:  # (minimax-m2.cpp:6, 130-140)
            return None
        return Experts(
            n_expert=up[2], n_used=hp.n_expert_used, n_ff=up[1], sigmoid=gating == 2, probs_bias=True, norm_w=True
        )
    if gating == 0:  # GGUFs without the key: glm4-moe.cpp:16-18, deepseek2.cpp:23-31
        old_glm_lite = hp.n_layer in (47, 48) and hp.n_vocab == 154880
        gating = 2 if hp.arch in ("glm4moe", "glm-dsa") or old_glm_lite else 1  # glm-dsa.cpp:53-57
    if gating not in (1, 2) and (gating != 4 or not model.number("hyper_connection.count")):
        return None  # sqrt-softplus routing outside DeepSeek-V4's backbone: not held to a load
    return Experts(
        n_expert=up[2],
        n_used=hp.n_expert_used,
        n_ff=up[1],
        sigmoid=gating == 2,
        sqrt_softplus=gating == 4,
        probs_bias=f"blk.{il}.exp_probs_b.bias" in shapes,
        norm_w=bool(kv.get(f"{hp.arch}.expert_weights_norm", False)),
        scale=scale,
    )
