"""The jobs service: submission, control, reports, queries, the event stream, tables, the ``/v1/jobs`` routes."""
