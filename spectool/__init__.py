"""spectool: speculative decoding for fast local generation over llama.cpp."""

__version__ = "0.1.0"
