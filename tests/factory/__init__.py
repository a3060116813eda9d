"""A GGUF factory for the tests: small real models and shape-faithful sparse copies of public models.

Each builder returns the metadata and tensor list that the matching ``src/models/<arch>.cpp``
``load_arch_tensors`` asks for, so the real llama-server loads the file. Shapes of public models come
from their published configs (config.json on the Hub).

The builders live by family in this package's modules, named as the graph builders of
``llamafit.memory.graph`` that replay them (attention, gemma, mla, hybrid, layered, mamba; drafters; projectors);
every one is importable from here."""

from llamafit.gguf.writer import TensorSpec
from tests.factory.attention import (
    cohere,
    dense,
    dots1,
    ernie45_moe,
    exaone4,
    gemma3,
    gemma3_4b,
    glm4,
    glm4moe,
    glm45_air,
    gpt_oss,
    gpt_oss_20b,
    gpt_oss_120b,
    granite,
    llama4,
    llama31_8b,
    moe,
    phi3,
    qwen2moe,
    qwen3_0_6b,
    qwen3_4b,
    qwen3_8b,
    qwen3vl,
)
from tests.factory.base import (
    Shape,
    bpe_vocab,
    gpu,
    with_vocab,
    write_split,
)
from tests.factory.drafters import dflash, dspark_qwen3_4b, eagle3, gemma4_assistant
from tests.factory.gemma import gemma3n, gemma4
from tests.factory.hybrid import qwen3next, qwen35, qwen35_mtp_2b
from tests.factory.layered import (
    granite_4_h_micro,
    granite_4_h_tiny,
    granite_hybrid,
    lfm2,
    lfm2_1_2b,
    lfm2_8b_a1b,
    nemotron_3_nano_30b_a3b,
    nemotron_h,
    nemotron_nano_9b_v2,
)
from tests.factory.mamba import mamba, mamba2, mamba_codestral_7b
from tests.factory.mla import deepseek2, deepseek4, dspark_dsv4, glm_dsa
from tests.factory.projectors import gemma3_siglip_896, siglip_mmproj

__all__ = [
    "Shape",
    "TensorSpec",
    "bpe_vocab",
    "cohere",
    "deepseek2",
    "deepseek4",
    "dense",
    "dflash",
    "dots1",
    "dspark_dsv4",
    "dspark_qwen3_4b",
    "eagle3",
    "ernie45_moe",
    "exaone4",
    "gemma3",
    "gemma3_4b",
    "gemma3_siglip_896",
    "gemma3n",
    "gemma4",
    "gemma4_assistant",
    "glm4",
    "glm4moe",
    "glm45_air",
    "glm_dsa",
    "gpt_oss",
    "gpt_oss_20b",
    "gpt_oss_120b",
    "gpu",
    "granite",
    "granite_4_h_micro",
    "granite_4_h_tiny",
    "granite_hybrid",
    "lfm2",
    "lfm2_1_2b",
    "lfm2_8b_a1b",
    "llama4",
    "llama31_8b",
    "mamba",
    "mamba2",
    "mamba_codestral_7b",
    "moe",
    "nemotron_3_nano_30b_a3b",
    "nemotron_h",
    "nemotron_nano_9b_v2",
    "phi3",
    "qwen2moe",
    "qwen3_0_6b",
    "qwen3_4b",
    "qwen3_8b",
    "qwen3next",
    "qwen3vl",
    "qwen35",
    "qwen35_mtp_2b",
    "siglip_mmproj",
    "with_vocab",
    "write_split",
]
