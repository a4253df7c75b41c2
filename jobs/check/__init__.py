"""``check``: the CI data-quality command over an audit run's tables.

``metrics`` computes the metrics, ``checks`` parses a checks file and evaluates its conditions,
``evaluate`` runs them on a run, ``output`` prints and writes the results for CI systems, ``cli`` is the
subcommand's options and exit codes.
"""
