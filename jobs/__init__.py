"""The Spark side of the audit, one package per stage, in the order the data flows.

``sources`` (store files as Spark data sources) -> ``read`` (the read plans: which records of a store an audit
needs, and how they reach the reconstruction) -> ``reconstruct`` (the transaction logic, Spark-free, and its
thin Spark wrapper) -> ``delta`` (the Delta sink and the driver-side table reader) -> ``audit`` (one run of
the audit: plan, read, reconstruct, write).  The commands sit above: ``check``, ``report``, ``repair`` and
``bench``; ``main`` parses a command line and dispatches.  ``config``, ``session`` and ``cli_options`` are
shared by every command.  Lower packages never import upper ones (``.importlinter`` states the order).
"""
