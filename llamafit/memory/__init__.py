"""Memory: every byte llama.cpp allocates for one load, per device and per buffer (docs/memory-model.md).

Modules:

* ``footprint``: one load's memory: weights, memory module, compute, output, overhead;
* ``placement``: where each weight goes: layer to device, tensor to buffer type; the override builders;
* ``context``: context sizing as ``llama_context`` does it, the KV cache and recurrent state;
* ``compute``: the compute (scheduler) buffers and the host output buffer;
* ``phases``: the per-phase estimate of the compute buffers, for graphs no replay builds;
* ``graph``: replicas of ggml's allocator and scheduler and of llama.cpp's graph builders;
* ``tensor_split``: ``-sm tensor``'s memory, llama.cpp's Meta device;
* ``weight_ops``: the weights a backend refuses at load, kept on the host;
* ``backends``: what differs between the backends llama.cpp offloads to, by device name;
* ``mmproj``: the multimodal projector's weights and compute buffer;
* ``adapters``: LoRA adapters and control vectors;
* ``builds``: which llama.cpp build the memory model mirrors, and how sure a plan is for another;
* ``ggml_builds``: the builds that shipped each ggml version (generated);
* ``build_match``: how the build a plan is priced for relates to the server's;
* ``calibration``: the launch history: what past launches allocated, for the next plan.
"""
