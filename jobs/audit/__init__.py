"""One audit run: plan -> read -> reconstruct -> write.

``run`` (``run_audit``) is the pipeline; ``state`` writes an incremental run's carried state; ``guard``
checks command-line paths and holds the exclusive lock on ``--out``; ``summary`` is what a run prints at its
end.  Takes parsed options from ``jobs.main``; hands on Delta tables under ``--out`` and an ``AuditSummary``.
"""
