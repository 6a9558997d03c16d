"""The schemas (pydantic) of what a user writes: the experiment file, its training section, job manifests."""
