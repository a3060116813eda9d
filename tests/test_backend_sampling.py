"""Backend sampling (-bs, and a drafter's own samplers) against the real llama-server: the sampler chain
each output row runs in the graph, the padded logits it reads, the sampled buffers in the output buffer."""

from __future__ import annotations

from pathlib import Path

import pytest

from llamafit.memory.graph.sampling import backend_chain
from llamafit.server.binary import ServerBinary
from llamafit.serving.compare import compare
from llamafit.units import MiB
from tests import factory
from tests.test_speculative_vs_server import plan_and_load

SHAPES = {
    "qwen3_4b": factory.qwen3_4b,
    "gemma3_4b": factory.gemma3_4b,
    "codestral": factory.mamba_codestral_7b,
    "q35mtp": lambda: factory.qwen35(
        name="Qwen3.5-style MTP",
        n_layer=24,
        n_nextn=1,
        n_embd=2048,
        n_head=16,
        n_head_kv=2,
        head_dim=256,
        n_ff=6144,
        n_vocab=151936,
        w="q4_K",
    ),
    "mla": lambda: factory.deepseek2(n_layer=6, n_vocab=102400),
}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bs")
    return {name: make().write(d / f"{name}.gguf") for name, make in SHAPES.items()}


CASES = [
    # (shape, flags, --spec): ngram-mod verifies 65 rows per slot, every one sampled on the backend
    ("qwen3_4b", ["-c", "8192", "-np", "2"], "ngram-mod"),
    ("qwen3_4b", ["-c", "8192"], "off"),
    ("qwen3_4b", ["-c", "4096", "-np", "2", "--top-k", "0"], "ngram-mod"),  # top-p sorts the whole vocabulary
    ("qwen3_4b", ["-c", "4096", "-np", "2", "--temp", "0"], "ngram-mod"),  # greedy
    ("qwen3_4b", ["-c", "4096", "-np", "2", "--mirostat", "2"], "ngram-mod"),
    ("qwen3_4b", ["-c", "4096", "-np", "2", "--repeat-penalty", "1.1"], "ngram-mod"),  # all on the host
    ("qwen3_4b", ["-c", "4096", "-np", "2", "--sampler-seq", "kmt", "--top-k", "20"], "ngram-mod"),
    ("gemma3_4b", ["-c", "8192", "-np", "2"], "ngram-simple"),
    ("codestral", ["-c", "4096", "-np", "2"], "ngram-mod"),
    ("q35mtp", ["-c", "4096", "-np", "2"], "draft-mtp"),
    ("q35mtp", ["-c", "4096"], "ngram-mod"),
    ("mla", ["-c", "4096", "-np", "3"], "ngram-mod"),
    ("mla", ["-c", "4096", "-fa", "off"], "off"),
]


@pytest.mark.server
@pytest.mark.parametrize(("shape", "args", "spec"), CASES)
def test_backend_sampling_is_priced_as_loaded(
    server_bin: ServerBinary, files: dict[str, Path], shape: str, args: list[str], spec: str
) -> None:
    """With -bs every slot's sampler chain is in the graph: the logits padded by a row (75 MiB for 130
    verification rows of a 152k vocabulary: a 42 % under-estimate before) and each row's ops; the output
    buffer keeps each row's probabilities, sampled token and candidates too (4x the logits)."""
    p, log, _ = plan_and_load(server_bin, files[shape], [*args, "-bs", "-nr"], spec=spec)
    contexts = [("target", p.footprint)] + ([("mtp", p.draft_footprint)] if spec == "draft-mtp" else [])
    for context, fp in contexts:
        assert fp is not None
        rows = [r for r in compare(fp, log, context) if r.kind in ("compute", "output")]
        assert {r.kind for r in rows} == {"compute", "output"}, context
        for r in rows:
            assert r.actual_mib is not None and abs(r.predicted / MiB - r.actual_mib) <= 0.006, (context, r)


def test_the_chain_follows_the_flags_then_the_model_then_the_defaults() -> None:
    default = (("top_k", 40), ("top_p", 0.95), ("min_p", 0.05), ("temp", 0.8), ("dist", 0.0))
    assert backend_chain({}, ()) == default
    model = {"general.sampling.top_k": 20, "general.sampling.temp": 0.6}
    assert backend_chain(model, ())[0] == ("top_k", 20) and ("temp", 0.6) in backend_chain(model, ())
    assert backend_chain(model, (("--top-k", "64"),))[0] == ("top_k", 64)  # the user's flag wins
    assert backend_chain({}, (("--samplers", "top_k;temperature"),)) == (("top_k", 40), ("temp", 0.8), ("dist", 0.0))
    assert backend_chain({}, (("--sampler-seq", "mk"),)) == (("min_p", 0.05), ("top_k", 40), ("dist", 0.0))
    # a sampler the backend does not take ends the prefix: the rest, dist included, runs on the host
    assert backend_chain({}, (("--repeat-penalty", "1.1"),)) == ()
    assert backend_chain({}, (("--typical", "0.9"),)) == (("top_k", 40),)
    assert backend_chain({}, (("--mirostat", "2"),)) == (("temp", 0.8),)
    assert backend_chain({}, (("--temp", "1"), ("--top-k", "0"))) == (("top_p", 0.95), ("min_p", 0.05), ("dist", 0.0))
