"""``txlog-bench``: benchmarks and the fuzz campaign, above every layer they measure.

``cli`` is the command line; ``audit`` and ``incremental`` time the Spark audit at scale; ``fuzz`` runs the
decoders over damaged copies of stores made by ``mutants``.
"""
