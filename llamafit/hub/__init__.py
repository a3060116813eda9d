"""Models on the Hugging Face Hub: select files as llama-server's ``-hf`` does, size them from their
headers without downloading weights, share the Hugging Face cache, and download only what a plan uses."""
