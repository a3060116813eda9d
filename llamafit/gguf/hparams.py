"""Hyper-parameters the memory model needs, resolved from GGUF metadata as llama.cpp resolves them.

Generic keys follow ``src/llama-model.cpp:1315-1480`` (``load_hparams``); the per-architecture rules
(sliding-window patterns, which layers are recurrent) follow each ``src/models/<arch>.cpp``
``load_arch_hparams``. Per-layer values are expanded to ``n_layer_all`` entries.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from llamafit.errors import BadModelFileError
from llamafit.gguf.reader import ArrayInfo

# llm_arch_is_recurrent / llm_arch_is_hybrid / llm_arch_supports_rs_rollback (src/llama-arch.cpp:1110-1179)
RECURRENT_ARCHS = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
HYBRID_ARCHS = frozenset(
    {
        "jamba",
        "falcon-h1",
        "plamo2",
        "granitehybrid",
        "lfm2",
        "lfm2moe",
        "nemotron_h",
        "nemotron_h_moe",
        "qwen3next",
        "kimi-linear",
        "bailingmoe3",
        "kimi-k3",
        "glm5-next",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "minimax-01",
    }
)
RS_ROLLBACK_ARCHS = frozenset(
    {
        "kimi-k3",
        "qwen35",
        "qwen35moe",
        "qwen4exp",
        "deepseek4",
        "glm5-next",
        "nemotron_h",
        "nemotron_h_moe",
        "lfm2",
        "lfm2moe",
        "bailingmoe3",
    }
)
# create_memory returns no memory module for these (src/llama-model.cpp:2363-2380)
NO_MEMORY_ARCHS = frozenset(
    {
        "bert",
        "jina-bert-v2",
        "jina-bert-v3",
        "nomic-bert",
        "nomic-bert-moe",
        "neo-bert",
        "eurobert",
        "wavtokenizer-dec",
        "modern-bert",
        "gemma-embedding",
        "dream",
        "llada",
        "llada-moe",
        "rnd1",
        "clef",
    }
)
# Cache layouts (DSA/MSA indexers) modelled from llama.cpp's source but not yet held to a real load;
# deepseek32's and glm-dsa's DSA caches and DeepSeek-V4's caches and compressor states are
# (tests/test_memory_vs_server.py).
# The plan says so.
UNVERIFIED_MEMORY_ARCHS = frozenset({"dots3note", "minimax-m3", "hy_v4", "qwen4exp", "glm5-next"})

# Sliding-window rules: arch -> (default pattern, dense_first, default n_swa, needs n_swa > 0 in the file,
# chunked). From each src/models/<arch>.cpp (e.g. gemma3.cpp:7, openai-moe.cpp:9, llama4.cpp:19).
_SWA_RULES: dict[str, tuple[int, bool, int, bool, bool]] = {
    "gemma2": (2, False, 4096, False, False),
    "gemma3": (6, False, 0, True, False),
    "gemma3n": (5, False, 0, False, False),
    "gemma-embedding": (6, False, 0, False, False),
    "cohere2": (4, False, 0, False, False),
    "cohere2moe": (4, True, 0, False, False),
    "llama4": (4, False, 8192, False, True),
    "gpt-oss": (2, False, 0, False, False),
    "olmo2": (4, False, 0, True, False),
    "exaone4": (4, False, 4096, False, False),
    "exaone-moe": (4, False, 128, False, False),
    "afmoe": (4, False, 0, True, False),
    "mellum": (4, False, 0, True, False),
    "muse-glimmer": (4, False, 0, False, False),
    "plamo3": (8, False, 0, True, False),
    "smallthinker": (4, True, 4096, True, False),
    "laguna": (4, True, 0, True, False),
    "modern-bert": (3, True, 0, False, False),
    "dflash": (0, False, 0, True, False),  # only with a sliding_window in the file (dflash.cpp:92-99)
    "deepseek4": (0, False, 0, True, False),  # every layer, its NextN blocks too (deepseek4.cpp:67-75)
}


# GLM-5.2's indexer layout when the file carries no indexer.types (src/models/glm-dsa.cpp:6-27)
_GLM_5_2_INDEXER_TYPES = (1, 1) + (1, 0, 0, 0) * 19


@dataclass(frozen=True)
class Hparams:
    arch: str
    n_layer_all: int
    n_nextn: int
    n_embd: int
    n_ctx_train: int
    n_vocab: int
    n_head: tuple[int, ...]
    n_head_kv: tuple[int, ...]
    n_ff: tuple[int, ...]
    head_k: int
    head_v: int
    head_k_swa: int
    head_v_swa: int
    mla: bool
    swa_type: str  # "none" | "standard" | "chunked"
    n_swa: int
    is_swa: tuple[bool, ...]
    is_recr: tuple[bool, ...]
    n_layer_kv_from_start: int  # -1: every layer has its own KV
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int
    ssm_d_conv: int
    ssm_d_inner: int
    ssm_d_state: int
    ssm_n_group: int
    wkv_head_size: int
    token_shift_count: int
    shortconv_l_cache: int
    kda_head_dim: int
    head_la: int
    causal: bool
    has_pooling: bool
    n_layer_dense_lead: int = 0
    indexer_head_size: int = 0  # attention.indexer.key_length (DSA/MSA/DSV4 lightning indexer)
    indexer_top_k: int = 0
    is_indexer_full: tuple[bool, ...] = ()  # DSA layers that own an indexer cache
    compress_ratios: tuple[int, ...] = ()  # DeepSeek-V4 per-layer KV compression (4: CSA, 128: HCA)
    ssm_dt_rank: int = 0  # ssm.time_step_rank: Mamba-1's dt rank, Mamba-2's head count
    ssm_dt_b_c_rms: bool = False  # ssm.dt_b_c_rms: Falcon-Mamba's RMS norms on dt, B and C
    pooling_type: int = 0  # {arch}.pooling_type: 0 none, 1 mean, 2 cls, 3 last, 4 rank

    @property
    def n_layer(self) -> int:
        """``n_layer()``: blocks without the NextN/MTP blocks (src/llama-hparams.cpp:348-350)."""
        return self.n_layer_all - self.n_nextn

    @property
    def is_recurrent_arch(self) -> bool:
        return self.arch in RECURRENT_ARCHS

    @property
    def is_hybrid_arch(self) -> bool:
        return self.arch in HYBRID_ARCHS

    @property
    def has_memory(self) -> bool:
        return self.arch not in NO_MEMORY_ARCHS

    @property
    def supports_rs_rollback(self) -> bool:
        return self.arch in RS_ROLLBACK_ARCHS

    def head_k_at(self, il: int) -> int:
        return self.head_k_swa if self.is_swa[il] else self.head_k

    def head_v_at(self, il: int) -> int:
        return self.head_v_swa if self.is_swa[il] else self.head_v

    def n_embd_k_gqa(self, il: int) -> int:
        return self.head_k_at(il) * self.n_head_kv[il]

    def n_embd_v_gqa(self, il: int) -> int:
        return self.head_v_at(il) * self.n_head_kv[il]

    def n_embd_v_gqa_max(self) -> int:
        return max([self.n_embd_v_gqa(0), *(self.n_embd_v_gqa(il) for il in range(self.n_layer_all))])

    def has_kv(self, il: int) -> bool:
        return self.n_layer_kv_from_start < 0 or il < self.n_layer_kv_from_start

    def kv_layer(self, il: int) -> int:
        """The layer whose cache ``il`` attends over: its own, or where it has none (Gemma 3n's and Gemma 4's last
        layers) the last of its kind before them (llama-model.cpp:2796-2805)."""
        if self.has_kv(il):
            return il
        return self.n_layer_kv_from_start - (2 if self.is_swa[il] else 1)

    def n_embd_r(self) -> int:
        """Conv/shift state width (src/llama-hparams.cpp:208-232)."""
        if self.wkv_head_size:
            return self.token_shift_count * self.n_embd
        if self.shortconv_l_cache:
            return self.n_embd * (self.shortconv_l_cache - 1)
        if self.kda_head_dim:
            d_inner = self.n_head[0] * self.kda_head_dim
            return 3 * (self.ssm_d_conv - 1 if self.ssm_d_conv > 0 else 3) * d_inner
        conv = self.ssm_d_conv - 1 if self.ssm_d_conv > 0 else 0
        return conv * (self.ssm_d_inner + 2 * self.ssm_n_group * self.ssm_d_state)

    def n_embd_s(self) -> int:
        """Recurrent state width (src/llama-hparams.cpp:234-258)."""
        if self.wkv_head_size:
            return self.n_embd * self.wkv_head_size
        if self.kda_head_dim:
            return self.kda_head_dim * self.kda_head_dim * self.n_head[0]
        if self.head_la:
            return self.head_la * self.head_la * self.n_head[0]
        return self.ssm_d_state * self.ssm_d_inner


def _int(v: Any, key: str, src: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadModelFileError(f"{src}: {key} should be an integer, got {type(v).__name__}")
    return v


def _per_layer(kv: dict[str, Any], key: str, n: int, default: int, src: str) -> tuple[int, ...]:
    """``get_key_or_arr``: a scalar is broadcast; an array must cover every layer."""
    v = kv.get(key)
    if v is None:
        return (default,) * n
    if isinstance(v, list):
        if len(v) < n:
            raise BadModelFileError(f"{src}: {key} has {len(v)} entries for {n} layers")
        return tuple(_int(x, key, src) for x in v[:n])
    return (_int(v, key, src),) * n


def vocab_size(kv: dict[str, Any], arch: str) -> int:
    v = kv.get(f"{arch}.vocab_size")
    if isinstance(v, int):
        return v
    toks = kv.get("tokenizer.ggml.tokens")
    if isinstance(toks, ArrayInfo):
        return toks.length
    if isinstance(toks, list):
        return len(toks)
    return 0


def _flags(values: list[Any], n: int) -> list[bool]:
    """A per-layer flag array from the file, cut or padded with False to ``n`` layers."""
    return [bool(x) for x in values[:n]] + [False] * max(0, n - len(values))


def _largest(v: Any) -> int:
    """A count given once or per layer: its largest value (0 where it is neither)."""
    if isinstance(v, list) and v:
        return int(max(v))
    return v if isinstance(v, int) else 0


def resolve_hparams(kv: dict[str, Any], src: str) -> Hparams:
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise BadModelFileError(f"{src}: no general.architecture in the GGUF metadata")

    def g(name: str, default: int = 0) -> int:
        v = kv.get(f"{arch}.{name}", default)
        return _int(v, f"{arch}.{name}", src)

    if f"{arch}.block_count" not in kv:
        raise BadModelFileError(f"{src}: {arch}.block_count is missing", hint="is this a model file, not a projector?")
    n_all = g("block_count")
    if not 0 < n_all <= 512:  # LLAMA_MAX_LAYERS
        raise BadModelFileError(f"{src}: {arch}.block_count = {n_all} is out of range")
    n_nextn = g("nextn_predict_layers")
    if n_nextn > n_all:
        raise BadModelFileError(f"{src}: nextn_predict_layers ({n_nextn}) exceeds block_count ({n_all})")
    n_layer = n_all - n_nextn
    n_embd = g("embedding_length")
    n_head = _per_layer(kv, f"{arch}.attention.head_count", n_all, 0, src)
    n_head_kv = (
        _per_layer(kv, f"{arch}.attention.head_count_kv", n_all, 0, src)
        if f"{arch}.attention.head_count_kv" in kv
        else n_head
    )
    n_ff = _per_layer(kv, f"{arch}.feed_forward_length", n_all, 0, src)
    head0 = n_head[0]
    if head0 > 0:
        head_k = g("attention.key_length", n_embd // head0)
        head_v = g("attention.value_length", n_embd // head0)
    else:
        head_k = head_v = 0
    head_k_swa = g("attention.key_length_swa", head_k)
    head_v_swa = g("attention.value_length_swa", head_v)
    mla = f"{arch}.attention.key_length_mla" in kv and f"{arch}.attention.value_length_mla" in kv
    swa_type, n_swa, is_swa = _sliding_window(kv, arch, g("attention.sliding_window"), n_all, n_nextn)
    interval = g("full_attention_interval", 4) if arch in _INTERVAL_HYBRIDS else 4
    is_recr = _recurrent_layers(kv, arch, interval, n_all, n_layer, n_head_kv, n_ff)
    if arch == "lfm2" and swa_type != "none":
        is_swa = [not r for r in is_recr[:n_layer]] + [False] * n_nextn

    kv_from_start = {"gemma3n": 20, "gemma4": n_all - g("attention.shared_kv_layers")}.get(arch, -1)
    n_expert = g("expert_count")
    n_expert_used = _largest(kv.get(f"{arch}.expert_used_count", 0))
    n_ff_exp = _largest(kv.get(f"{arch}.expert_feed_forward_length", 0))

    indexer_full = _indexer_layers(kv, arch, g("context_length"), n_all, n_layer)
    ratios = kv.get(f"{arch}.attention.compress_ratios")
    compress = tuple(int(x) for x in ratios[:n_all]) if isinstance(ratios, list) else ()

    return Hparams(
        arch=arch,
        n_layer_all=n_all,
        n_nextn=n_nextn,
        n_embd=n_embd,
        n_ctx_train=g("context_length"),
        n_vocab=vocab_size(kv, arch),
        n_head=n_head,
        n_head_kv=n_head_kv,
        n_ff=n_ff,
        head_k=head_k,
        head_v=head_v,
        head_k_swa=head_k_swa,
        head_v_swa=head_v_swa,
        mla=mla,
        swa_type=swa_type,
        n_swa=n_swa,
        is_swa=tuple(is_swa),
        is_recr=tuple(is_recr),
        n_layer_kv_from_start=kv_from_start,
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        n_ff_exp=n_ff_exp,
        n_ff_shexp=g("expert_shared_feed_forward_length"),
        ssm_d_conv=g("ssm.conv_kernel"),
        ssm_d_inner=g("ssm.inner_size"),
        ssm_d_state=g("ssm.state_size"),
        ssm_n_group=g("ssm.group_count"),
        wkv_head_size=g("wkv.head_size"),
        token_shift_count=g("token_shift_count", 2),
        shortconv_l_cache=g("shortconv.l_cache"),
        kda_head_dim=g("kda.head_dim"),
        head_la=head_k if arch == "minimax-01" else 0,
        causal=bool(kv.get(f"{arch}.attention.causal", True)),
        has_pooling=int(kv.get(f"{arch}.pooling_type", 0) or 0) not in (0, -1),
        n_layer_dense_lead=g("leading_dense_block_count"),
        indexer_head_size=g("attention.indexer.key_length"),
        indexer_top_k=g("attention.indexer.top_k"),
        is_indexer_full=indexer_full,
        compress_ratios=compress,
        ssm_dt_rank=g("ssm.time_step_rank"),
        ssm_dt_b_c_rms=bool(kv.get(f"{arch}.ssm.dt_b_c_rms", False)),
        pooling_type=g("pooling_type"),
    )


def _sliding_window(kv: dict[str, Any], arch: str, n_swa: int, n_all: int, n_nextn: int) -> tuple[str, int, list[bool]]:
    """(swa_type, n_swa, is_swa) by each architecture's rule (``_SWA_RULES``; gemma4, its assistant and lfm2 by their
    own: gemma4.cpp:5-6, gemma4-assistant.cpp:6-7)."""
    swa_type = "none"
    is_swa = [False] * n_all
    rule = _SWA_RULES.get(arch)
    pattern_kv = kv.get(f"{arch}.attention.sliding_window_pattern")
    if arch in ("gemma4", "gemma4-assistant"):
        swa_type = "standard"
        if isinstance(pattern_kv, list):
            is_swa = _flags(pattern_kv, n_all)
    elif arch == "lfm2" and n_swa > 0:
        swa_type = "standard"
    elif rule is not None:
        pattern, dense_first, default_swa, needs_key, chunked = rule
        file_has = f"{arch}.attention.sliding_window" in kv
        if arch == "exaone4":  # SWA only for the 64-layer (32B) model (exaone4.cpp:2)
            active = n_all - n_nextn == 64
        elif needs_key:
            active = n_swa > 0
        else:  # llama4: an explicit sliding_window of 0 turns chunked attention off (llama4.cpp:6-12)
            active = not (chunked and file_has and n_swa == 0)
        if active:
            if chunked or arch == "smallthinker" or not file_has:
                n_swa = default_swa or n_swa
            swa_type = "chunked" if chunked else "standard"
            if isinstance(pattern_kv, list):
                is_swa = _flags(pattern_kv, n_all)
            else:
                if isinstance(pattern_kv, int) and not isinstance(pattern_kv, bool):
                    pattern = pattern_kv
                for il in range(n_all - n_nextn):
                    if dense_first:
                        is_swa[il] = pattern == 0 or il % pattern != 0
                    else:
                        is_swa[il] = pattern == 0 or il % pattern < pattern - 1
    if arch == "phi3":
        return "none", n_swa, [False] * n_all
    if arch == "deepseek4" and swa_type != "none":
        is_swa = [True] * n_all
    return swa_type, n_swa, is_swa


# hybrids with full attention every ``full_attention_interval`` layers unless the file lists them
_INTERVAL_HYBRIDS = frozenset({"qwen3next", "qwen35", "qwen35moe", "qwen4exp", "glm5-next"})
# hybrids whose attention layers carry no KV heads in the file (their recurrent layers have none)
_RECURRENT_WITHOUT_KV_HEADS = frozenset(
    {"jamba", "granitehybrid", "lfm2", "lfm2moe", "kimi-linear", "kimi-k3", "bailingmoe3", "minimax-01", "plamo2"}
)


def _recurrent_layers(
    kv: dict[str, Any],
    arch: str,
    interval: int,
    n_all: int,
    n_layer: int,
    n_head_kv: tuple[int, ...],
    n_ff: tuple[int, ...],
) -> list[bool]:
    """Which layers are recurrent, by each architecture's rule (``interval``: full_attention_interval)."""
    if arch in RECURRENT_ARCHS or arch == "falcon-h1":
        return [True] * n_all
    if arch in _INTERVAL_HYBRIDS:
        rl = kv.get(f"{arch}.attention.recurrent_layers")
        if isinstance(rl, list):
            return _flags(rl, n_all)
        interval = interval or 4
        return [il < n_layer and (il + 1) % interval != 0 for il in range(n_all)]
    if arch in ("nemotron_h", "nemotron_h_moe"):
        return [il < n_layer and n_head_kv[il] == 0 and n_ff[il] == 0 for il in range(n_all)]
    if arch in _RECURRENT_WITHOUT_KV_HEADS:
        return [il < n_layer and n_head_kv[il] == 0 for il in range(n_all)]
    return [False] * n_all


def _indexer_layers(kv: dict[str, Any], arch: str, n_ctx_train: int, n_all: int, n_layer: int) -> tuple[bool, ...]:
    """The layers with a full DSA/MSA indexer: GLM 5.2 (1M context) a fixed pattern, the others every trunk
    layer (glm-dsa.cpp:59-66), unless the file lists them."""
    if arch not in ("glm-dsa", "hy_v4", "dots3note", "deepseek32"):
        return ()
    if arch == "glm-dsa" and n_ctx_train >= 1048576:
        flags = _flags(list(_GLM_5_2_INDEXER_TYPES), n_all)
    else:
        flags = [True] * n_all
    types = kv.get(f"{arch}.attention.indexer.types")
    if isinstance(types, list):
        flags[: len(types)] = [bool(x) for x in types]
    elif isinstance(types, int) and not isinstance(types, bool):
        flags[:n_layer] = [bool(types)] * n_layer
    return tuple(flags[:n_all])
