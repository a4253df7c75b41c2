"""``python -m txlog_io`` = ``txlog-dump``."""
import sys

from txlog_io.cli import main

sys.exit(main())
