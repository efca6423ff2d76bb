"""``python -m commands``: the ``codespec`` command without its console script."""

import sys

from commands.cli import main

sys.exit(main())
