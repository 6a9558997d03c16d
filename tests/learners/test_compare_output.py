"""Where ``labswarm compare`` writes when not told (the dashboard's ``/ui/compare`` lists ``<home>/compare``)."""

from __future__ import annotations

import calendar
from pathlib import Path

from labswarm.compare.run import default_output


def test_the_default_output_is_a_stamped_folder_of_the_managers_home_when_there_is_one(tmp_path: Path) -> None:
    now = calendar.timegm((2026, 11, 23, 12, 30, 5, 0, 0, 0))
    assert default_output(tmp_path, now) == tmp_path / "compare" / "20261123-123005"
    assert default_output(tmp_path / "no-home", now) == Path("compare")  # no manager home here: ./compare
