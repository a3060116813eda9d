"""What a tensor's name says about it: its layer (src/llama-arch.cpp LLM_TENSOR_INFOS) and its op."""

from __future__ import annotations

import re

_BLK_RE = re.compile(r"^blk\.(\d+)\.")
# LLM_TENSOR_LAYER_INPUT tensors (src/llama-arch.cpp:750-752, 957, 1031-1032)
INPUT_PREFIXES = ("token_embd.", "position_embd.", "token_types.", "per_layer_token_embd.", "masked_embd_")
# Tensors read by row (GGML_OP_GET_ROWS) rather than multiplied; never repacked or op-offloaded.
GET_ROWS_PREFIXES = ("token_embd.", "position_embd.", "token_types.", "per_layer_token_embd.")
# LLM_TENSOR_LAYER_REPEATING tensors named without a block, which Gemma 3n, Gemma 4 and its assistant create in
# block 0 (src/llama-arch.cpp:958-959, 1013; models/gemma4.cpp:60-61, gemma3n.cpp:40-41, gemma4-assistant.cpp:55):
# layer 0's device holds them
FIRST_BLOCK_PREFIXES = ("per_layer_model_proj.", "per_layer_proj_norm.", "nextn.pre_projection.")


def layer_of(name: str, n_layer_all: int) -> int | None:
    """The layer a tensor belongs to: None for the input layer, ``n_layer_all`` for the output layer.

    Blocks numbered past ``n_layer_all`` (heads) go with the output (llama-model.cpp:1966-1970).
    """
    if name.startswith(INPUT_PREFIXES):
        return None
    if name.startswith(FIRST_BLOCK_PREFIXES):
        return 0
    m = _BLK_RE.match(name)
    if m is None:
        return n_layer_all
    return min(int(m.group(1)), n_layer_all)


def is_matmul_weight(name: str, n_dims: int) -> bool:
    """A weight used by MUL_MAT (2-D) or MUL_MAT_ID (3-D experts): what CPU_REPACK can take."""
    if not name.endswith(".weight") or name.startswith(GET_ROWS_PREFIXES):
        return False
    if "_exps." in name or "_chexps." in name:
        return n_dims == 3
    return n_dims == 2 and "conv1d" not in name
