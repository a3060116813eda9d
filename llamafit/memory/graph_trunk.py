"""What every llama.cpp text graph begins and ends with, for the replays (``graph_attention``,
``graph_mamba``).

The start is ``build_inp_embd`` (``src/llama-graph.cpp:2413-2533``): the token rows, the embedding
input and the mixed path are all in the graph (``ggml_build_forward_select`` expands the three), so the
unused embedding input and the mixed path's copy are allocated and never freed. The end is the output
norm and the logits, both graph outputs (``llm_graph_result::set_outputs``, llama-graph.cpp:1396-1403).
"""

from __future__ import annotations

from llamafit.memory.galloc import I32, I64, Graph, Tensor


def rms_norm(x: Tensor) -> Tensor:
    """build_norm(x, w, NULL, LLM_NORM_RMS): the norm, then the weight (in place)."""
    return Graph.like("mul", Graph.like("rms_norm", x), Graph.weight((x.ne[0],)))


def input_embeddings(g: Graph, n_embd: int, n_vocab: int, n_tokens: int) -> Tensor:
    """The token rows (the selected input) after every input of build_inp_embd is expanded."""
    tok_embd = Graph.weight((n_embd, n_vocab))
    rows = Graph.get_rows(tok_embd, Graph.input((n_tokens,), I32))
    dup = Graph.like("dup", Graph.input((n_embd, n_tokens)))
    mixed_rows = Graph.get_rows(tok_embd, Graph.input((n_tokens,), I32))
    mixed = Graph.set_rows(dup, mixed_rows, Graph.input((n_tokens,), I64))
    for t in (rows, Graph.input((n_embd, n_tokens)), mixed):
        g.expand(t)
    return rows


def output_head(g: Graph, hidden: Tensor, n_vocab: int) -> None:
    """The output norm and the logits, expanded last and marked as outputs (never freed or reused)."""
    embd = rms_norm(hidden)
    logits = Graph.mul_mat(Graph.weight((hidden.ne[0], n_vocab)), embd)
    g.expand(logits)
    embd.is_output = logits.is_output = True
