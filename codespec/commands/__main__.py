"""``python -m codespec.commands``: the ``codespec`` command without its console script."""

import sys

from codespec.commands.cli import main

sys.exit(main())
