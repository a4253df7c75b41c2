"""``python -m txlog_io`` = ``txlog-dump``."""
from txlog_io.cli import console_main

console_main()
