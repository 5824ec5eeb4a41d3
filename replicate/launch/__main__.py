"""``python -m replicate.launch -n N script.py [args...]``: see ``launcher``."""

import sys

from .launcher import main
from .shadow import check

if __name__ == "__main__":
    check("python -m replicate.launch")
    sys.exit(main())
