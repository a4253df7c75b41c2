"""The read plans: which records of a store an audit needs, and how they reach the reconstruction.

``frames``: the DataFrames of a store in full or indexed mode; ``full``: full mode's one-job read to Arrow on
the driver; ``indexed``: indexed mode's plan (queue gaps, COMMIT lookups, queue tails) and its one-job read;
``incremental``: where a continuation resumes and the rows it carries; ``inputs``: the record selection and
op bodies the reconstruction takes.  Takes a store and options from ``sources``; hands on evidence rows
(records, op bodies, units, findings) as DataFrames or Arrow tables.
"""
