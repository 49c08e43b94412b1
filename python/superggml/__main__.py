"""python -m superggml: the command line (superggml --help)."""

import sys

from .commands.cli import main

sys.exit(main())
