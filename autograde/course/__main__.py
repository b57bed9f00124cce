"""`python -m autograde.course release|grade|...`: see autograde/course/__init__.py."""
import sys

from autograde.course import main

sys.exit(main())
