"""Clients of the jobs service: the HTTP client, following a job's event stream, its plots."""
