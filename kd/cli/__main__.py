"""``python -m kd.cli``: the same as ``kdw``."""

import sys

from kd.cli.commands import main

sys.exit(main())
