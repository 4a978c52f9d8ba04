import sys

from .front.cli import main

sys.exit(main())
