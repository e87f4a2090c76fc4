"""The llama.cpp layer: its libraries, a model and its context, devices. Nothing above it is imported here."""
