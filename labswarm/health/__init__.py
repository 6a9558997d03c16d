"""The health controller: monitors → time series → one controller per session → the session's publish rate."""
