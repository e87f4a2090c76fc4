"""Model files: models.toml and references, downloads, the cache, vocabulary compatibility."""
