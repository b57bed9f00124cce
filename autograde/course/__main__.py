"""`python -m autograde.course release|grade|...`: see autograde/course/cli.py."""
import sys

from autograde.course.cli import main

sys.exit(main())
