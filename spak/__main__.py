"""`python -m spak` is the `spak` command."""
import sys

from spak.cli import main

sys.exit(main())
