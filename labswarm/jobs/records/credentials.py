"""Each attempt's own API token: what its learners report with, and nothing else.

The lifecycle generates a token (:func:`~labswarm.auth.tokens.new_token`: 32 random bytes) when it deploys an
attempt, stores only its SHA-256 (``job_attempts.token_sha256``, hex) and hands the token to the attempt's learners
through their environment (:data:`~labswarm.deploy.learners.TOKEN_ENV`, the variable the learner's reporter reads;
never on their command line, never in their spec file: the launchers build that environment,
:func:`~labswarm.deploy.learners.learner_environment`). The manager's authenticator asks :func:`attempt_user` about
a token that no configured token matches (a scoped-token hook,
:meth:`labswarm.auth.authenticator.Authenticator.add_scoped`): the token of an attempt that has not ended is a
:class:`~labswarm.auth.tokens.User` whose ``scope`` is that attempt's report route,
``POST /v1/jobs/{id}/attempts/{n}/reports``, which is the only request it opens. When the attempt ends its digest
is cleared: the token is revoked.

So a learner holds no admin token: a manager configured with a tokens file alone (no ``LABSWARM_API_TOKEN``)
takes its learners' reports, and a learner (or the user's program a ``command`` learner runs, whose environment
has no token at all) cannot read or change another job.
"""

from __future__ import annotations

import hmac

from sqlalchemy import select
from sqlalchemy.orm import Session

from labswarm.auth.tokens import User, hash_token, new_token
from labswarm.jobs.records.models import AttemptRow


def report_scope(job_id: str, attempt: int) -> str:
    """The one request an attempt's token opens: ``"POST /v1/jobs/{job_id}/attempts/{attempt}/reports"``."""
    return f"POST /v1/jobs/{job_id}/attempts/{attempt}/reports"


def new_attempt_token() -> tuple[str, str]:
    """A fresh token for an attempt and its hex SHA-256 (what is stored)."""
    token = new_token()
    return token, hash_token(token).hex()


def attempt_user(db: Session, digest: bytes) -> User | None:
    """The learner whose attempt's token has SHA-256 ``digest`` (32 bytes), while that attempt has not ended.

    Every live attempt's digest is compared in constant time (``hmac.compare_digest``), whatever matches.

    Returns:
        ``User("learner:{job_id}:{attempt}", "user", scope=report_scope(...))``, or ``None``.
    """
    rows = db.execute(select(AttemptRow.job_id, AttemptRow.number, AttemptRow.token_sha256)
                      .where(AttemptRow.ended_at.is_(None), AttemptRow.token_sha256.is_not(None))).all()
    found = None
    for job_id, number, stored in rows:
        assert stored is not None, "the query keeps the attempts that have a digest"
        if hmac.compare_digest(digest, bytes.fromhex(stored)) and found is None:
            found = User(f"learner:{job_id}:{number}", "user", scope=report_scope(job_id, number))
    return found
