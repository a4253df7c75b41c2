"""Indexed mode: read the transaction queues and indexes, and scan the CommitLog only where they cannot answer.

``plan`` derives queue gaps from a few numbers per queue, ``gaps`` the CommitLog ranges to scan and their
INDEX_INCOMPLETE findings, ``tails`` the records hiding behind an idle queue's end, ``lookup`` the COMMIT
records found through the IndexFiles, ``read`` the one Spark job that does all of it.
"""
