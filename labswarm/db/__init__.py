"""The manager's database (SQLAlchemy): the declarative base every service's tables share, engine, sessions."""

from labswarm.db.engine import Base, make_engine, make_sessionmaker, utcnow

__all__ = ["Base", "make_engine", "make_sessionmaker", "utcnow"]
