"""Speculative types, their constants from llama.cpp, and how a drafter's kind is told from its file."""

from __future__ import annotations

import os
import re

from llamafit.gguf.model import ModelInfo
from llamafit.gguf.naming import SIDECARS, quant_bits
from llamafit.server.capabilities import ALL_SPEC_TYPES
from llamafit.units import MiB

SPEC_TYPES = ALL_SPEC_TYPES  # --spec-type's values, as the server parses them
DRAFT_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-mtp", "draft-dflash", "draft-dspark"})
ROLLBACK_TYPES = frozenset({"draft-mtp", "draft-eagle3", "draft-dflash", "draft-dspark"})  # common.h:399-405
NGRAM_TYPES = frozenset({"ngram-simple", "ngram-map-k", "ngram-map-k4v", "ngram-mod", "ngram-cache"})
DEFAULT_N_MAX = 3  # --spec-draft-n-max (common.h:329)
# Verification depth per ngram type (common_speculative_n_max, speculative.cpp:2396-2430)
NGRAM_N_MAX = {"ngram-simple": 48, "ngram-map-k": 48, "ngram-map-k4v": 48, "ngram-mod": 64, "ngram-cache": 8}
# The seed's flat reserve for a drafter whose size cannot be known: 5 % of the card plus a draft graph.
UNSIZED_FRACTION = 0.05
DRAFT_GRAPH_RESERVE = 224 * MiB


def ngram_host_bytes(spec_type: str, n_parallel: int) -> int:
    """Host structures of the ngram implementations (docs/memory-model.md §5.3)."""
    if spec_type == "ngram-mod":
        return 4 * (1 << 20) * 4  # one shared pool of 4 Mi int32 (ngram-mod.cpp:9-10)
    if spec_type == "ngram-simple":
        return 1 << 20  # one 2^18 x 4 B key map (ngram-map.h:42)
    if spec_type in ("ngram-map-k", "ngram-map-k4v"):
        return n_parallel << 20
    return 0  # ngram-cache grows at run time


def detect_kind(model: ModelInfo) -> str | None:
    """The type llama.cpp infers from a draft GGUF; None for a plain model (needs draft-simple). A Gemma 4
    assistant drafts only from its target's hidden states (gemma4-assistant.cpp:84-120): llama.cpp infers MTP
    from an ``mtp-`` sidecar's name alone, and llamafit says it for an assistant given with -md."""
    if model.arch == "gemma4-assistant":
        return "draft-mtp"
    if model.arch == "dflash":
        return "draft-dspark" if model.has_tensor("markov_w1.weight") else "draft-dflash"
    if model.arch == "eagle3":
        return "draft-eagle3"  # llama.cpp never infers it (preset.cpp:371); llamafit says it explicitly
    n = model.hparams.n_layer_all
    if model.has_tensor(f"blk.{n - 1}.nextn.eh_proj.weight"):
        return "draft-mtp"
    return None


def has_embedded_mtp(model: ModelInfo) -> bool:
    return model.hparams.n_nextn > 0 and detect_kind(model) == "draft-mtp" and model.hparams.n_layer > 0


def find_sidecars(model_path: str) -> dict[str, str]:
    """Drafter sidecars beside a local model, by kind: files named like llama.cpp's find_best_sibling
    looks for them (``mtp-``, ``dspark-``, ``dflash-``, ``eagle3-``; case-sensitive), the closest quant
    bits to the model winning (common/download.cpp:531-624)."""
    directory = os.path.dirname(os.path.abspath(model_path))
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return {}
    ref = quant_bits(os.path.basename(model_path))
    out: dict[str, str] = {}
    for kind, keyword in SIDECARS:
        cands = [n for n in names if n.endswith(".gguf") and keyword in n and "mmproj" not in n]
        cands = [n for n in cands if not re.search(r"-0000[2-9]-of-|-000[1-9]\d-of-", n)]  # first shards only
        if not cands:
            continue
        # the closest quant bits win, a tag without a number counting as 0 (download.cpp:501-511);
        # ties go to the first name in order, as llama.cpp keeps the first of equals
        best = min(cands, key=lambda n: abs(quant_bits(n) - ref))
        out[kind] = os.path.join(directory, best)
    return out
