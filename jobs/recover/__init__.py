"""The ``recover`` command: sends an audit run's recovery requests to a live broker (see jobs.recover.run)."""
