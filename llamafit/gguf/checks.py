"""What llama.cpp checks when it loads a model, checked before a plan says it fits (exit 7 otherwise).

llama-server refuses or aborts on these at load (src/llama-model.cpp:373, 1300-1400; the loader's
"missing tensor" error); a plan that calls such a file fitting would send the user to a crash. Checked:
the architecture is one this llama.cpp knows, the keys every model needs are there and sane, expert
counts obey llama.cpp's asserts, attention models have heads, and every block has tensors (a trunk-only
file of an architecture whose loader allows it may leave out its NextN blocks). The per-architecture lists
of required tensors (src/models/*.cpp) are not mirrored: a file missing one of those still reaches
llama-server, whose "missing tensor" error llamafit reports as a model-file failure.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from llamafit.errors import BadModelFileError
from llamafit.gguf.archs import ARCHS
from llamafit.gguf.hparams import Hparams
from llamafit.options import MAX_CTX_TRAIN

MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS, src/llama-hparams.h:12
# the loaders that take a file without its NextN blocks ("trunk_only": the first NextN block's eh_proj absent
# makes its tensors not required, src/models/glm4-moe.cpp:32-40, the same in each of these files' loaders)
TRUNK_ONLY_ARCHS = frozenset(
    {
        "bailingmoe3",
        "cohere2moe",
        "deepseek2",
        "deepseek32",
        "glm-dsa",
        "glm4moe",
        "glm5-next",
        "hy_v3",
        "mimo2",
        "step35",
    }
)


def check_arch(kv: Mapping[str, object], src: str) -> None:
    arch = kv.get("general.architecture")
    if arch == "clip":
        raise BadModelFileError(f"{src} is a multimodal projector, not a model", hint="give it with -- --mmproj FILE")
    if isinstance(arch, str) and arch and arch not in ARCHS:
        raise BadModelFileError(
            f"{src}: unknown model architecture {arch[:64]!r}: llama-server b11434 would refuse it "
            "(src/llama-model.cpp:373)",
            hint="a newer llama.cpp build may know it; or the file is not a llama.cpp model",
        )


def check_model(kv: Mapping[str, object], hp: Hparams, tensor_names: Iterable[str], src: str) -> None:
    """The target model's keys and blocks (a drafter sidecar may carry only its NextN blocks and
    borrow the target's embeddings, so it is not held to this)."""
    arch = hp.arch
    for key in ("context_length", "embedding_length"):
        if f"{arch}.{key}" not in kv:
            raise BadModelFileError(f"{src}: {arch}.{key} is missing (llama.cpp requires it)")
    if not 0 < hp.n_ctx_train <= MAX_CTX_TRAIN:
        raise BadModelFileError(f"{src}: {arch}.context_length = {hp.n_ctx_train} is not a usable training context")
    if hp.n_embd <= 0:
        raise BadModelFileError(f"{src}: {arch}.embedding_length = {hp.n_embd}")
    used = hp.n_expert_used
    if hp.n_expert > MAX_EXPERTS or used > hp.n_expert or (hp.n_expert > 0 and used == 0):
        raise BadModelFileError(
            f"{src}: {hp.n_expert} experts with {used} used per token: llama.cpp would abort "
            "(src/llama-model.cpp:1358-1372)"
        )
    if not hp.is_recurrent_arch and not hp.is_hybrid_arch and hp.has_memory and not any(hp.n_head):
        raise BadModelFileError(f"{src}: {arch}.attention.head_count is 0 for a model with attention")
    names = set(tensor_names)
    blocks = {int(n.split(".")[1]) for n in names if n.startswith("blk.") and n.split(".")[1].isdigit()}
    held = hp.n_layer_all
    if hp.arch in TRUNK_ONLY_ARCHS and hp.n_nextn and f"blk.{hp.n_layer}.nextn.eh_proj.weight" not in names:
        held = hp.n_layer  # a trunk-only file: its NextN blocks may be left out (no MTP drafter in it)
    missing = [il for il in range(held) if il not in blocks]
    if missing:
        raise BadModelFileError(
            f"{src}: {arch}.block_count is {hp.n_layer_all} but block {missing[0]} has no tensors "
            f"({len(missing)} of {hp.n_layer_all} blocks missing)",
            hint="the file is truncated or was converted wrongly",
        )
