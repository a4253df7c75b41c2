"""``python -m refbroker``: same as the ``txlog-refbroker`` console script."""
import sys

from refbroker.cli import main

sys.exit(main())
