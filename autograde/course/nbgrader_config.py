"""nbgrader's configuration for the DDP Lab course.

nbgrader reads this file only from the folder it runs in, so run nbgrader in autograde/course/
(`make release` and `make grade` do). The course's folders (source/, release/, submitted/,
autograded/, feedback/), gradebook.db and grades.csv are kept in the repository's grading/
(git-ignored), or under $DDP_LAB_COURSE_DIR when that is set.

The exchange (Exchange.root) is not set here: the exchange targets (`make release-exchange`,
`make collect`, `make return-feedback`) pass --Exchange.root from EXCHANGE, and the learners, whose
nbgrader never reads this file, name it on their own command line (docs/instructors.md).
"""

from autograde import settings

c = get_config()  # type: ignore[name-defined]  # noqa: F821 (nbgrader provides it)

c.CourseDirectory.course_id = "ddp-lab"  # autograde/course/assignment.py's COURSE_ID; learners pass --course=ddp-lab
c.CourseDirectory.root = str(settings.course_dir())
# The learner's work is the files they edit (fashion_mnist.py, exercises/...): without this,
# autograding silently replaces them with the starters from source/ and every submission is
# graded as if untouched.
from autograde.grading import registry  # noqa: E402

c.Autograde.exclude_overwriting = {part.id: part.files for part in registry.PARTS}
# A check cell runs the learner's script for real, several processes at a time: give it minutes.
c.Execute.timeout = 1800
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
# What the student version's answer cells read (nbgrader's default too): autograde/course/assignment.py's
from autograde.course.assignment import ANSWER_TEXT  # noqa: E402

c.ClearSolutions.text_stub = ANSWER_TEXT

# Every submission graded in a sandbox (autograde/course/sandbox.py): the notebook's kernel as an
# unprivileged user in bubblewrap, with the course's own cells (the learner's answers kept).
from nbconvert.preprocessors import ClearMetadataPreprocessor  # noqa: E402
from nbgrader.preprocessors import (  # noqa: E402
    AssignLatePenalties,
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    IgnorePattern,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
    SaveAutoGrades,
)

from autograde.course import sandbox  # noqa: E402

c.Autograde.sanitize_preprocessors = [ClearOutput, sandbox.RestoreCourseCells, DeduplicateIds, OverwriteKernelspec,
                                      OverwriteCells, CheckCellMetadata]
c.Autograde.autograde_preprocessors = [sandbox.SandboxedExecute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                       SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
