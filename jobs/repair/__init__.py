"""``repair``: the recovery job, from an audit run's work lists (driver only, no Spark).

``run`` copies a store and applies the offline repairs the reference broker's encoders write; ``requests``
writes the requests an operator sends to the live broker.
"""
