"""The llama.cpp layer: its libraries, a model and its context, devices. Nothing above it is
imported here.

Which modules call into llama.cpp: native.py loads llama_cpp (before numpy), routes its log, binds
symbols of its own (`bind`) and loads llama-cpp-python's high-level `Llama` for the benchmarks'
baseline; engine.py (`Model`: contexts, batches, decodes, outputs), vocab.py (`Facts`: tokens, text,
metadata) and memory.py (a vocabulary-only load to count layers) call llama_cpp; devices.py binds
libggml itself with ctypes (devices, RPC, the abort hook) and asks llama_cpp for its version.
outputs.py is plain types. Above this layer, drafters/mtp.py's `MtpContext` calls llama_cpp for a
context of its own over a Model's public handles (`llama_model`, `llama_context`,
`add_decode_listener`).
"""
