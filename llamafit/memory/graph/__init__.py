"""Replicas of ggml's graph allocator (galloc) and scheduler (sched), the graph builders of the model classes
llama.cpp builds, and which graph a model replays (replay).

Modules:

* ``galloc``: ggml's graph building and graph allocator, for the compute buffer;
* ``sched``: ggml_backend_sched over several backends, for the compute buffers;
* ``replay``: which models' reserve graphs are replayed, and with what shape;
* ``recipe``: what every graph builder offers the replay (a ``Recipe``, one registry);
* ``shapes``: the shape each builder takes, read from a model;
* ``routing``: how a MoE layer routes its tokens, as each builder passes it;
* ``trunk``: what llama.cpp's text graphs share: their start and end, feed-forward blocks, recurrent states;
* ``attention``: a transformer with a KV cache;
* ``transformers``: the plain transformer families ``attention`` builds, each read from a model;
* ``gemma4``: Gemma 4 (per-layer inputs, layers reading an earlier layer's cache) and its assistant;
* ``gemma3n``: Gemma 3n (AltUp's streams, LAuReL, per-layer inputs);
* ``mla``: DeepSeek-V2/V3-style MLA;
* ``dsv4``: DeepSeek-V4;
* ``hybrid``: Qwen3.5-style hybrids (gated delta-net and gated attention);
* ``layered``: hybrids whose every layer is one kind (LFM2, Nemotron-H, Granite-4.0-H);
* ``mamba``: pure Mamba models;
* ``mtp``: MTP heads over the NextN block;
* ``dflash``: DFlash and DSpark drafters;
* ``sampling``: backend sampling in the reserve graph.
"""
