"""The revisions, ``000N_<slug>.py``, in order (see :mod:`labswarm.db.migrate` for how to add one)."""
