"""`spectool serve`: the OpenAI-compatible server over the session layer, folder by role as
llama-server's tools/server/ (spectool/server/README is docs/layout.md)."""
