"""Alembic's folder of labswarm's migrations (``env.py``, ``versions/``); run through :mod:`labswarm.db.migrate`."""
