"""The ``rocketmq_*`` Spark data sources (``pyspark.sql.datasource``) over broker store files.

Takes store roots and options (``options``: parsed once on the driver); hands on DataFrames whose schemas are
``schemas.sources``.  Each reader decodes with ``txlog_io`` on the executors; nothing here knows about
transactions.
"""
