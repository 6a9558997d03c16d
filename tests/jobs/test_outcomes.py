"""The verdict on an ended attempt (:mod:`labswarm.jobs.lifecycle.outcomes`) from the job's restart policy, read in
one place (:func:`restart_policy`) from the stored manifest: its user exit codes decide the user-fault test and
the verdict alike; a policy changed in the manifest is what the next decision reads. The decisions themselves run
through real jobs in test_service.py, test_lifecycle.py and test_learner_memory_limit.py."""

from __future__ import annotations

from labswarm.jobs import ErrorCode, Fault, RestartPolicy
from labswarm.jobs.lifecycle.outcomes import _user_fault, _verdict, restart_policy, take_restart
from labswarm.jobs.records.models import JobRow, LearnerRow


def test_the_stored_policy_decides_the_user_fault_and_the_verdict_alike() -> None:
    job = JobRow(manifest={"restart": {"user_exit_codes": [3], "max_restarts_user": 2}})
    policy = restart_policy(job)
    assert policy == RestartPolicy(user_exit_codes=[3], max_restarts_user=2)
    assert _user_fault(policy, 3) and not _user_fault(policy, 1) and not _user_fault(policy, -9)
    ended, hung, undeployed = LearnerRow(killed=None), LearnerRow(killed="hung"), LearnerRow(killed="deploy")
    verdict = _verdict(policy, [ended, ended], 3)
    assert verdict is not None and (verdict.code, verdict.fault) == (ErrorCode.LEARNER_EXIT, Fault.USER)
    verdict = _verdict(policy, [ended], 1)  # not declared the user's by this policy
    assert verdict is not None and (verdict.code, verdict.fault) == (ErrorCode.LEARNER_CRASHED, Fault.PLATFORM)
    verdict = _verdict(policy, [ended, hung], 3)  # killed by the watchdog: the platform's, whatever the code
    assert verdict is not None and verdict.code is ErrorCode.LEARNER_HUNG
    verdict = _verdict(policy, [undeployed], None)
    assert verdict is not None and verdict.code is ErrorCode.DEPLOY_FAILED
    assert _verdict(policy, [ended], 0) is None
    job.manifest = {"restart": {}}  # changed (labswarm jobs set): the next decision reads the defaults
    assert restart_policy(job) == RestartPolicy() and _user_fault(restart_policy(job), 1)


def test_take_restart_counts_within_each_budget_alone() -> None:
    """The one budget check of the lifecycle (an attempt's end, an asynchronous learner's restart, a shard's
    revival): a restart is counted in its fault's budget while one is left and allowed; otherwise nothing is counted
    and the budget's state is the failure reason."""
    job = JobRow(restarts_user=0, restarts_platform=0)
    policy = RestartPolicy(max_restarts_user=1, max_restarts_platform=2)
    assert take_restart(job, policy, Fault.USER) is None and (job.restarts_user, job.restarts_platform) == (1, 0)
    assert take_restart(job, policy, Fault.USER) == "user restarts used: 1 of 1" and job.restarts_user == 1
    assert take_restart(job, policy, Fault.PLATFORM, allowed=False) == "platform restarts used: 0 of 2"
    assert take_restart(job, policy, Fault.PLATFORM) is None and take_restart(job, policy, Fault.PLATFORM) is None
    assert take_restart(job, policy, Fault.PLATFORM) == "platform restarts used: 2 of 2"
    assert (job.restarts_user, job.restarts_platform) == (1, 2)
