"""``python -m replicate script.py [args]`` (or ``-m module``): run a script so that a failure on
any rank ends the whole job (see ``replicate/launch/bootstrap.py``)."""

import sys

from replicate.launch.bootstrap import main
from replicate.launch.shadow import check

if __name__ == "__main__":
    check("python -m replicate")
    sys.exit(main())
