"""The speculative loop: draft -> verify -> accept -> observe -> emit, as Step events, over a
drafter it is given."""
