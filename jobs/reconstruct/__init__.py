"""The reconstruction: every transaction's state, flags and work-list entries from its evidence.

Spark-free (numpy + pyarrow): ``params`` (topics, profiles, thresholds), ``flags`` (the documented codes),
``groups`` (column helpers), ``evidence`` (evidence rows and their linking), ``rules`` (per-transaction
rules), ``split`` (transaction ranges over the driver's cores) and ``reducer`` (one broker's reduce).  The
only Spark module is ``spark``: the thin wrapper that feeds DataFrames in and hands DataFrames on.
Takes the read's evidence; hands on the reconstruction's output tables (``schemas.recon``).
"""
