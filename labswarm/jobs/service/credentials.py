"""Each attempt's own API token, under its former name: it lives in :mod:`labswarm.jobs.records.credentials` (the
lifecycle makes the token, the authenticator checks it), and the environment a learner starts with in
:mod:`labswarm.deploy.learners`. Kept for the callers outside the jobs package until they import from there."""

from labswarm.jobs.records.credentials import attempt_user, new_attempt_token, report_scope

__all__ = ["attempt_user", "new_attempt_token", "report_scope"]
