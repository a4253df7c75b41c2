"""``report``: the HTML report of an audit run, from its Delta tables only (no Spark, no store).

``data`` gathers what the page shows, ``plots`` draws the charts, ``html`` renders the page, ``write`` puts
``OUT/report/<run_id>.html`` and the index in place.
"""
