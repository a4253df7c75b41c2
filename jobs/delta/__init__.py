"""The Delta tables of a run: ``sink`` writes them (delta-rs, or delta-spark when its classes are present),
``tables`` reads a finished run's tables back on the driver (deltalake + pyarrow, no Spark)."""
