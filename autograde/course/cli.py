"""`python -m autograde.course release|grade|scores|release-exchange|collect|return-feedback|
release-solutions|withhold`: the Makefile's instructor targets."""
from __future__ import annotations

import argparse
import os

from autograde import settings
from autograde.course.assignment import EXCHANGE_DEFAULT, WORKING_COPY, CourseError
from autograde.course.grading import EXCHANGE_COMMANDS, exchange, grade, release, scores
from autograde.course.withheld import release_solutions, solutions_assignment, withhold
from autograde.grading import registry


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograde.course", description="The DDP Lab's nbgrader course.")
    commands = parser.add_subparsers(dest="command", required=True)
    make_release = commands.add_parser("release", help="build source/ from a commit and the student version release/")
    make_release.add_argument("--from", dest="rev", default="HEAD", metavar="REV",
                              help=f"the commit to release (default HEAD); '{WORKING_COPY}': the files as they are")
    make_grade = commands.add_parser("grade", help="autograde submitted/, write feedback/, export grades.csv")
    make_grade.add_argument("--jobs", type=_positive, default=None, metavar="N",
                            help="learners graded at once (default: one per core)")
    make_grade.add_argument("--notebook", default=None, metavar="PATTERN",
                            help="grade only these notebooks (e.g. 03_steps_0_to_2; default: every graded one)")
    make_scores = commands.add_parser("scores", help="feedback/ and grades.csv again from the gradebook, without "
                                      "autograding (after grading answers by hand in the formgrader)")
    make_solutions = commands.add_parser("release-solutions", help=f"hand the part's solutions to every learner "
                                         f"through the exchange (the assignment {solutions_assignment('PART')})")
    make_solutions.add_argument("--from", dest="rev", default="HEAD", metavar="REV",
                                help=f"the commit to take them from (default HEAD); '{WORKING_COPY}': the files as they are")
    make_withhold = commands.add_parser("withhold", help="as root: the course's solutions/, tests/, .git and grading/ "
                                        "readable by the class's instructors only (the hub does it when it starts)")
    make_withhold.add_argument("--class", dest="class_file", default=None, metavar="FILE",
                               help="the class's settings: its course, instructors and instructors_group "
                                    "(default $DDP_LAB_CLASS, else deploy/jupyterhub/class.toml)")
    subcommands = [make_release, make_grade, make_scores]
    for name, nbgrader_command in [*EXCHANGE_COMMANDS.items(), ("release-solutions", "release_assignment")]:
        sub = make_solutions if name == "release-solutions" else commands.add_parser(
            name, help=f"nbgrader {nbgrader_command} through the exchange")
        subcommands.append(sub)
        sub.add_argument("--exchange", default=os.environ.get(settings.EXCHANGE) or EXCHANGE_DEFAULT,
                         help=f"the exchange folder, nbgrader's Exchange.root (default {EXCHANGE_DEFAULT})")
        sub.add_argument("nbgrader_args", nargs="*", help="more options for nbgrader, after --, e.g. -- --force")
    for sub in subcommands:
        sub.add_argument("--part", default=registry.FIRST, choices=list(registry.PART),
                         help=f"the part of the course, an assignment of its own (default {registry.FIRST})")
    args = parser.parse_args(argv)
    try:
        if args.command == "release":
            release(args.rev, args.part)
        elif args.command == "grade":
            grade(args.part, args.jobs, args.notebook)
        elif args.command == "scores":
            scores(args.part)
        elif args.command == "release-solutions":
            release_solutions(args.part, args.exchange, args.rev, tuple(args.nbgrader_args))
        elif args.command == "withhold":
            from autograde.course.hub.settings import SettingsError, load

            try:
                s = load(args.class_file)
            except SettingsError as err:
                raise CourseError(str(err)) from None
            print(withhold(s.course, s.instructors_group, s.instructors))
        else:
            exchange(EXCHANGE_COMMANDS[args.command], args.exchange, args.nbgrader_args, args.part)
    except CourseError as err:
        parser.exit(1, f"error: {err}\n")
    return 0
