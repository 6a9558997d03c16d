"""The HTTP host: the FastAPI app that mounts every service's routes, the dashboard, /health and /metrics."""
