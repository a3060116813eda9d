"""Backend sampling in the reserve graph: the padded logits and each sampled row's sampler chain.

A context with backend samplers (the target's with ``-bs``, a drafter's own top-k) builds them into its
graph (``build_sampling``, llama-graph.cpp:3897-3990): the logits padded by a row, then for each output
row of a sequence (a sequence without outputs samples a dummy row) the chain's ``backend_apply`` ops
in order (src/llama-sampler.cpp), and the selected results (``sampled``, ``probs``, ``logits``,
``candidates``) expanded; an active row's results are graph outputs (llm_graph_result::set_outputs).

Each sampler's ops are mirrored by shape: top-k (1477-1499), top-p (1627-1700), min-p (1826-1862),
temperature (2036-2064), dist (1274-1335). The chain stops at the first sampler that cannot run on the
backend (llama_sampler_chain_backend_init, 733-770): the rest is sampled on the host.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from llamafit.memory.graph.galloc import I32, Graph, Tensor

# a sampler the chain runs on the backend: (name, parameter); names: top_k (k), top_p, min_p, temp (t),
# dist
Step = tuple[str, float]


@dataclass(frozen=True)
class Samplers:
    """The backend samplers of a reserve: one chain per sequence."""

    n_outputs: int  # the reserve's outputs (ubatch_prepare_reserve gives them out in sequence order)
    rows_per_seq: int  # n_outputs_max_per_seq
    chain: tuple[Step, ...]


DRAFT_CHAIN: tuple[Step, ...] = (("top_k", 10),)  # common/speculative.cpp:585-597, 1101-1117


def backend_samplers(g: Graph, logits: Tensor, n_seqs: int, s: Samplers) -> None:
    """Expand the padded logits and every row's chain (llama-context.cpp:2470-2510 for the rows)."""
    V, T = logits.ne[0], logits.ne[1]
    padded = Graph.op("pad", (V, T + 1), logits)
    left = s.n_outputs
    for _ in range(n_seqs):
        rows = min(T // n_seqs, s.rows_per_seq, left)
        left -= rows
        for _ in range(max(1, rows)):
            _row(g, Graph.view(padded, (V,)), s.chain, active=rows > 0)


def _row(g: Graph, row: Tensor, chain: tuple[Step, ...], *, active: bool) -> None:
    logits: Tensor = row
    candidates: Tensor | None = None
    probs: Tensor | None = None
    sampled: Tensor | None = None
    for name, p in chain:
        n = _n(logits)
        flat = Graph.reshape(logits, (n,))
        if name == "top_k":
            top = Graph.op("top_k", (min(int(p), n),), flat, esize=I32)
            candidates = top if candidates is None else _gather(candidates, top)
            logits = Graph.get_rows(Graph.reshape(flat, (1, n)), top)
        elif name == "top_p":
            order = Graph.op("argsort", (n,), flat, esize=I32)
            ordered = Graph.reshape(Graph.get_rows(Graph.reshape(flat, (1, n)), order), (n,))
            soft = Graph.like("soft_max", ordered)
            candidates = order if candidates is None else _gather(candidates, order)
            mask = Graph.like("unary", Graph.like("scale", Graph.op("cumsum", (n,), soft)))  # step(1 - cdf + p)
            idx = Graph.like("clamp", Graph.op("sum", (1,), mask))
            ones = Graph.like("scale", idx)
            mask = Graph.reshape(Graph.set_rows(Graph.reshape(mask, (1, n)), ones, _cast(idx)), (n,))
            logits = Graph.like("add", ordered, Graph.like("log", mask))
        elif name == "min_p":
            top = Graph.op("argmax", (1,), flat, esize=I32)
            threshold = Graph.like("scale", Graph.get_rows(Graph.reshape(flat, (1, n)), top))
            bias = Graph.like("log", Graph.like("unary", Graph.like("sub", flat, threshold)))
            logits = Graph.like("add", flat, bias)
        elif name == "temp":
            if p <= 0:  # greedy: the most probable token (llama_sampler_backend_temp_sampling)
                top = Graph.op("argmax", (1,), flat, esize=I32)
                candidates = top if candidates is None else _gather(candidates, top)
                logits = Graph.get_rows(Graph.reshape(flat, (1, n)), top)
            else:
                logits = Graph.like("scale", logits)
        elif name == "dist":
            uniform = Graph.input((1,))
            probs = Graph.like("soft_max", flat)
            diff = Graph.like("sub", Graph.op("cumsum", (n,), probs), uniform)
            idx = Graph.like("clamp", Graph.op("sum", (1,), Graph.like("unary", diff)))
            sampled = _cast(Graph.like("scale", idx))
            if candidates is not None:
                sampled = _gather(candidates, sampled)
    # ggml_build_forward_select, in build_sampling's order; the logits at least (the row itself when no
    # sampler runs on the backend), so the padded copy is always in the graph
    results = [t for t in (sampled, probs, logits, candidates) if t is not None]
    for t in results:
        g.expand(t)
        if active:
            t.is_output = True


def _n(t: Tensor) -> int:
    return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]


def _gather(candidates: Tensor, ids: Tensor) -> Tensor:
    """``ggml_get_rows(ggml_reshape_2d(candidates, 1, n), ids)``: the candidates re-ordered or cut."""
    n = _n(candidates)
    return Graph.get_rows(Graph.reshape(candidates, (1, n)), ids)


def _cast(t: Tensor) -> Tensor:
    """``ggml_cast(t, GGML_TYPE_I32)``: a new tensor (GGML_OP_CPY) of the same shape."""
    return Graph.op("cpy", t.ne, t, esize=I32)


# the sampler sequence llama-server builds (common.h:264-274), then dist; names as --samplers takes them
DEFAULT_SEQUENCE = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature")
_CHARS = {
    "d": "dry",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "s": "top_n_sigma",
    "m": "min_p",
    "t": "temperature",
    "x": "xtc",
    "i": "infill",
    "e": "penalties",
    "a": "adaptive_p",
}
_ALIASES = {
    "temp": "temperature",
    "typical_p": "typ_p",
    "typical": "typ_p",
    "nucleus": "top_p",
    "repetition": "penalties",
}
# common_params_sampling's defaults (common.h:227-256), and the GGUF keys a model may override them with
# (common.cpp:1124-1146: a value the user gives wins)
_DEFAULTS: dict[str, float] = {
    "top_k": 40,
    "top_p": 0.95,
    "min_p": 0.05,
    "xtc_probability": 0.0,
    "xtc_threshold": 0.1,
    "typ_p": 1.0,
    "temp": 0.8,
    "dynatemp_range": 0.0,
    "penalty_last_n": 64,
    "penalty_repeat": 1.0,
    "penalty_freq": 0.0,
    "penalty_present": 0.0,
    "dry_multiplier": 0.0,
    "mirostat": 0,
    "top_n_sigma": -1.0,
}
_FLAGS = {
    "--top-k": "top_k",
    "--top-p": "top_p",
    "--min-p": "min_p",
    "--xtc-probability": "xtc_probability",
    "--xtc-threshold": "xtc_threshold",
    "--typical": "typ_p",
    "--temp": "temp",
    "--dynatemp-range": "dynatemp_range",
    "--repeat-last-n": "penalty_last_n",
    "--repeat-penalty": "penalty_repeat",
    "--frequency-penalty": "penalty_freq",
    "--presence-penalty": "penalty_present",
    "--dry-multiplier": "dry_multiplier",
    "--mirostat": "mirostat",
    "--top-nsigma": "top_n_sigma",
}
SAMPLING_FLAGS = frozenset({*_FLAGS, "--samplers", "--sampler-seq"})
_MODEL_KEYS = {
    "top_k": "general.sampling.top_k",
    "top_p": "general.sampling.top_p",
    "min_p": "general.sampling.min_p",
    "xtc_probability": "general.sampling.xtc_probability",
    "xtc_threshold": "general.sampling.xtc_threshold",
    "temp": "general.sampling.temp",
    "penalty_last_n": "general.sampling.penalty_last_n",
    "penalty_repeat": "general.sampling.penalty_repeat",
    "mirostat": "general.sampling.mirostat",
}


def backend_chain(model_kv: Mapping[str, object], user: Sequence[tuple[str, str]]) -> tuple[Step, ...]:
    """The part of the target's sampler chain that runs on the backend with -bs (common/sampling.cpp:
    330-412 builds it, llama_sampler_chain_backend_init keeps the prefix the backend takes): disabled
    samplers are empty (on the backend, no ops); top-k, top-p, min-p, temperature and dist are mirrored;
    the first other one (typical, XTC, top-n-sigma, DRY, penalties over several rows, dynamic
    temperature, mirostat) ends the prefix. ``user``: the sampling flags given, last wins."""
    values = dict(_DEFAULTS)
    for name, key in _MODEL_KEYS.items():
        v = model_kv.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            values[name] = float(v)
    sequence: tuple[str, ...] = DEFAULT_SEQUENCE
    if isinstance(seq := model_kv.get("general.sampling.sequence"), str):
        sequence = tuple(_name(n) for n in seq.split(";") if n.strip())
    for flag, value in user:
        if flag in _FLAGS:
            try:
                values[_FLAGS[flag]] = float(value)
            except ValueError:
                continue
        elif flag == "--samplers":
            sequence = tuple(_name(n) for n in value.split(";") if n.strip())
        elif flag == "--sampler-seq":
            sequence = tuple(_CHARS.get(c, "?") for c in value)
    if values["mirostat"] != 0:  # temperature, then mirostat (host only)
        return (("temp", values["temp"]),) if values["temp"] != 1 else ()
    out: list[Step] = []
    for name in sequence:
        step = _step(name, values)
        if step is None:
            return tuple(out)
        if step[0]:
            out.append(step)
    return (*out, ("dist", 0.0))


def _name(n: str) -> str:
    n = n.strip().lower().replace("-", "_")
    return _ALIASES.get(n, n)


def _step(name: str, v: dict[str, float]) -> Step | None:
    """The chain step of one sampler type: ("", 0) when disabled (an empty sampler), None when it is one
    the backend does not take (or llamafit does not mirror), which ends the backend prefix."""
    empty: Step = ("", 0.0)
    if name == "top_k":
        return ("top_k", v["top_k"]) if v["top_k"] > 0 else empty
    if name == "top_p":
        return ("top_p", v["top_p"]) if v["top_p"] < 1 else empty
    if name == "min_p":
        return ("min_p", v["min_p"]) if v["min_p"] > 0 else empty
    if name == "temperature":
        if v["dynatemp_range"] > 0 and v["temp"] > 0:
            return None  # the entropy-driven temperature: not mirrored
        return empty if v["temp"] == 1 else ("temp", v["temp"])
    if name == "typ_p":
        return empty if v["typ_p"] >= 1 else None
    if name == "xtc":
        return empty if v["xtc_probability"] <= 0 or v["xtc_threshold"] > 0.5 else None
    if name == "top_n_sigma":
        return empty if v["top_n_sigma"] <= 0 else None
    if name == "dry":
        return empty if v["dry_multiplier"] == 0 else None
    if name == "penalties":
        off = v["penalty_last_n"] == 0 or (
            v["penalty_repeat"] == 1 and v["penalty_freq"] == 0 and v["penalty_present"] == 0
        )
        return empty if off else None
    return None
