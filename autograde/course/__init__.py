"""The nbgrader course: `make release` builds the assignment, `make grade` grades it, and the
exchange targets hand it out and back on a shared machine (a JupyterHub).

One source of truth: the source assignment (source/<part>/) is built afresh every time from a
commit (HEAD unless told otherwise): its notebooks/ and the learner's files its items read,
never from a working copy an instructor may have tried the lab in. The graders' hidden tests live
in autograde/grading/registry.py (each item's `hidden`), not in notebooks/ (which learners of the
repository run): the release writes them into the grade cells of source/ only, and nbgrader
writes the student version (release/<part>/) without them. Grading autogrades the graded
notebooks of every submission in submitted/<student>/<part>/, writes feedback, exports grades.csv
and prints each learner's score and the steps lost.

The course root (gradebook, source/, release/, submitted/, autograded/, feedback/, grades.csv)
is grading/ in the repository, git-ignored (or $DDP_LAB_COURSE_DIR); nbgrader always runs in
autograde/course/, the only place it reads nbgrader_config.py from. Grading runs the notebooks in
quick mode (DDP_LAB_QUICK=1): the training runs of the ungraded cells are tiny, the checks are not.

    python -m autograde.course release [--from REV|files] [--part PART]
    python -m autograde.course grade [--part PART]
    python -m autograde.course release-exchange|collect|return-feedback [--exchange DIR] [--part PART] [-- NBGRADER_ARGS]

PART is a part of the course (autograde/grading/registry.py's PARTS), each an assignment of its own:
ddp_lab (the default), processes_talk, launching, scaling, inside_ddp or optimizers.

Modules: `assignment.py` builds a part's source assignment from a commit, with the hidden tests;
`nbgrader_run.py` runs nbgrader with its log filtered; `grading.py` releases, grades and runs the
exchange commands; `cli.py` is the command line; `nbgrader_config.py` is nbgrader's configuration.
"""
