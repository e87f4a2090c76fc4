"""The speculative step and what it needs: sampling and acceptance, the controller, its costs, keys,
stats."""
