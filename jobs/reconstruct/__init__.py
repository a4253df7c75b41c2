"""The reconstruction: every transaction's state, flags and work-list entries from its evidence.

Spark-free (numpy + pyarrow): ``params`` (topics, profiles, thresholds), ``flags`` (the documented codes),
``groups`` (column helpers), ``evidence`` (evidence rows and their linking), ``damage`` (lost CommitLog
ranges and table damage), ``rules`` (per-transaction rules), ``uncertain`` (the findings of a state resting
on lost bytes), ``worklists`` (check-back and recovery rows), ``settle`` (final transactions an incremental
state carries), ``split`` (transaction ranges over the driver's cores), ``reducer`` (one broker's reduce)
and ``partitioned`` (its steps on one partition).  The Spark modules are ``spark`` (the thin wrapper that
feeds DataFrames in and hands DataFrames on), ``distributed`` (the reduce as joins and a shuffle by
transaction); ``local`` is the driver's fast path (Arrow already on the driver, no Spark).
Takes the read's evidence; hands on the reconstruction's output tables (``schemas.recon``).
"""
