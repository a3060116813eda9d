"""Models on the Hugging Face Hub: select files as llama-server's ``-hf`` does, size them from their headers
without downloading weights, share the Hugging Face cache, and download only what a plan uses.

Modules:

* ``resolve``: from ``owner/repo[:QUANT]`` to a model the planner can size;
* ``select``: which files of a repo ``-hf`` would use, decided as llama.cpp b11434 does;
* ``remote``: the Hub over the network, through huggingface_hub's public API;
* ``cache``: the Hugging Face cache shared with llama.cpp and huggingface_hub.
"""
