"""`make gpu-check`'s report (autograde/tools/gpu_check.py), as far as it can be shown without GPUs:
the rows it makes of the tests it runs through pytest (tests/parts/lab/test_gpu_mistakes.py). That it says so in
one line where there is no GPU: tests/core/test_bad_input.py."""
from __future__ import annotations

from autograde.tools import gpu_check

# What pytest writes with -o junit_logging=system-out --junitxml (pytest 9): a skip, a pass, a failure.
JUNIT = """<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest"
errors="0" failures="1" skipped="1" tests="3"><testcase classname="test_x" name="test_m[a]" time="0.000"><skipped
type="pytest.skip" message="shows only in a run on GPUs (2 GPUs or more)">/tmp/test_x.py:4: shows only in a run on
GPUs (2 GPUs or more)</skipped><system-out>--------------------------------- Captured Out ---------------------------------

</system-out></testcase><testcase classname="test_x" name="test_m[b]" time="0.000"><system-out>--------------------------------- Captured Out ---------------------------------
something first
caught (Step 4): the process joined as rank 0

</system-out></testcase><testcase classname="test_x" name="test_m[c]" time="0.000"><failure message="AssertionError:
NOT caught (Step 6.5): all good&#10;  second line&#10;assert False">name = 'c'

&gt;       assert False
E       AssertionError: NOT caught (Step 6.5): all good

test_x.py:6: AssertionError</failure><system-out>--------------------------------- Captured Out ---------------------------------
</system-out></testcase></testsuite></testsuites>"""


def test_the_gpu_reports_rows_come_from_the_tests_outcomes() -> None:
    """A skip reads n/a with its reason (never a failure), a pass its printed detail, a failure FAIL."""
    assert gpu_check.junit_rows(JUNIT) == [
        ("test_m[a]", "n/a", "shows only in a run on GPUs (2 GPUs or more)"),
        ("test_m[b]", "pass", "caught (Step 4): the process joined as rank 0"),
        ("test_m[c]", "FAIL", "NOT caught (Step 6.5): all good"),
    ]
