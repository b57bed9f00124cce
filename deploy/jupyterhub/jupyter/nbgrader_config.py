"""nbgrader settings of every class member's server on the hub (JUPYTER_CONFIG_PATH names this folder).

The exchange is the folder the hub's settings name (`exchange`, passed on as DDP_LAB_EXCHANGE): the
instructor releases into it and collects from it, learners fetch from it and submit into it.
"""
import os

c = get_config()  # type: ignore[name-defined]  # noqa: F821 (nbgrader provides it)

c.Exchange.root = os.environ.get("DDP_LAB_EXCHANGE", "/usr/local/share/nbgrader/exchange")
c.CourseDirectory.course_id = "ddp-lab"  # autograde/course/assignment.py's COURSE_ID
