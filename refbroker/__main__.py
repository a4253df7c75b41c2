"""``python -m refbroker``: same as the ``txlog-refbroker`` console script."""
from refbroker.cli import console_main

console_main()
