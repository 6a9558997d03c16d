"""The manager's database (SQLAlchemy): the declarative base every service's tables share, engine, sessions,
migrations (:mod:`labswarm.db.migrate`)."""

from labswarm.db.engine import Base, make_engine, make_sessionmaker, utcnow

__all__ = ["Base", "make_engine", "make_sessionmaker", "utcnow"]
