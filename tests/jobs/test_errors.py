"""Error codes and the classification of learner exits into user and platform faults."""

from __future__ import annotations

import re

import pytest

from labswarm.jobs import DEFAULT_USER_EXIT_CODES, ERROR_TEXT, ErrorCode, Fault, RestartPolicy, classify_exit

DEFAULT = RestartPolicy().user_exit_codes


def test_codes_follow_the_ffdl_model() -> None:
    for code in ErrorCode:
        assert re.fullmatch(r"[CS]1\d\d", code.value), code
        assert code.fault is (Fault.USER if code.value[0] == "C" else Fault.PLATFORM)
        assert code.text == ERROR_TEXT[code] and code.text
    assert set(ERROR_TEXT) == set(ErrorCode)
    assert len({c.value for c in ErrorCode}) == len(ErrorCode)
    assert {c.fault for c in ErrorCode} == {Fault.USER, Fault.PLATFORM}


@pytest.mark.parametrize(("exit_code", "killed", "codes", "expected", "fault"), [
    (1, False, DEFAULT, ErrorCode.LEARNER_EXIT, Fault.USER),               # an uncaught Python exception
    (2, False, DEFAULT, ErrorCode.LEARNER_EXIT, Fault.USER),
    (127, False, DEFAULT, ErrorCode.COMMAND_NOT_FOUND, Fault.USER),
    (126, False, DEFAULT, ErrorCode.COMMAND_NOT_EXECUTABLE, Fault.USER),
    (3, False, DEFAULT, ErrorCode.LEARNER_CRASHED, Fault.PLATFORM),         # not declared the user's
    (1, False, [], ErrorCode.LEARNER_CRASHED, Fault.PLATFORM),              # the manifest decides
    (-9, False, DEFAULT, ErrorCode.LEARNER_SIGNALLED, Fault.PLATFORM),      # e.g. the out-of-memory killer
    (137, False, DEFAULT, ErrorCode.LEARNER_SIGNALLED, Fault.PLATFORM),     # 128 + SIGKILL through a shell
    (137, False, [137], ErrorCode.LEARNER_EXIT, Fault.USER),                # declared: the user's
    (-9, True, DEFAULT, ErrorCode.LEARNER_HUNG, Fault.PLATFORM),            # the watchdog's kill
    (0, True, DEFAULT, ErrorCode.LEARNER_HUNG, Fault.PLATFORM),
    (None, True, DEFAULT, ErrorCode.LEARNER_HUNG, Fault.PLATFORM),
    (None, False, DEFAULT, ErrorCode.LEARNER_LOST, Fault.PLATFORM),
])
def test_classify_exit(exit_code: int | None, killed: bool, codes: list[int], expected: ErrorCode,
                       fault: Fault) -> None:
    verdict = classify_exit(exit_code, killed_by_platform=killed, user_exit_codes=codes)
    assert verdict is not None
    assert (verdict.code, verdict.fault) == (expected, fault)


def test_a_clean_exit_is_no_fault() -> None:
    assert classify_exit(0, killed_by_platform=False, user_exit_codes=DEFAULT) is None


def test_the_detail_names_the_exit() -> None:
    assert classify_exit(-9, killed_by_platform=False, user_exit_codes=DEFAULT).detail == \
        "exit code -9: killed by SIGKILL"
    assert classify_exit(139, killed_by_platform=False, user_exit_codes=DEFAULT).detail == \
        "exit code 139: killed by SIGSEGV"
    assert classify_exit(3, killed_by_platform=False, user_exit_codes=DEFAULT).detail == "exit code 3"
    assert "watchdog" in classify_exit(-15, killed_by_platform=True, user_exit_codes=DEFAULT).detail


def test_the_manifest_default_user_codes() -> None:
    assert tuple(DEFAULT) == DEFAULT_USER_EXIT_CODES
