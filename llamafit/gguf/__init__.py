"""GGUF files: read as llama.cpp reads them (bounded, lazy, header only), checked as it checks them at load, and
written for the demo and the tests.

Modules:

* ``reader``: the bounded, lazy GGUF header reader;
* ``ahead``: how much of a header a read over the network asks for next;
* ``extents``: where a local file's vocabulary ends, remembered so a later read jumps over it;
* ``model``: a model as llama.cpp sees it: every shard's header, the hparams, the tensor table;
* ``hparams``: the hyper-parameters the memory model needs, resolved as llama.cpp resolves them;
* ``tensors``: what a tensor's name says: its layer and its op;
* ``archs``: the architectures llama.cpp b11434 knows (generated);
* ``naming``: what llama.cpp reads from a file's name: split shards, the quant tag, drafter sidecars;
* ``checks``: what llama.cpp checks when it loads a model;
* ``mmproj``: a multimodal projector as clip.cpp reads it;
* ``writer``: GGUF files written with ``gguf.GGUFWriter``;
* ``demo_model``: the embedded demo model;
* ``ggml``: ggml tensor types, their block and byte sizes.
"""
