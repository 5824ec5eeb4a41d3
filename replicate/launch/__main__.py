"""``python -m replicate.launch -n N script.py [args...]``: see ``launcher``."""

import sys

from .launcher import main

if __name__ == "__main__":
    sys.exit(main())
