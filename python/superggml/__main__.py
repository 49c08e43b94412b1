"""python -m superggml: the command line (superggml --help)."""

import sys

from .cli import main

sys.exit(main())
