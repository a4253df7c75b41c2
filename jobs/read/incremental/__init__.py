"""``audit --incremental``: continue from the previous completed run instead of re-reading the CommitLog.

``plan`` decides whether and where a run continues (the previous run and its state); ``read`` puts the
carried rows before this run's own read from the resume offset.  The state itself is written by
``jobs.audit.state``.
"""
