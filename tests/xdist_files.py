"""How the suite's test files are spread over pytest-xdist workers (``./run-tests.sh`` runs ``-n 2``).

* A test file is one unit of work (as ``--dist loadfile``): a module's fixtures, the expensive stores and
  audits they build, are built once, in one worker.
* Units are handed out in collection order, which :func:`order_items` makes longest file first (the measured
  table :data:`LONGEST_FIRST`), so that no long file starts last and keeps one worker busy alone at the end.
* test_realbroker.py goes to worker gw0 only: gw0 alone started its broker runs in the background when the
  tests were collected (conftest's ``pytest_collection_finish``), and only gw0's process holds them.  gw0
  reaches the file in its place of the order; another worker skips it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Dict, List

#: the test files that take longest (whole-suite runs, seconds summed over a file's setup, calls and
#: teardown), longest first; files not named here follow in collection order.  Only the order matters: a
#: stale entry costs some balance, never a test.
LONGEST_FIRST = (
    "test_delta_spark.py",            # 394 s (serial run at load 6-8, 2026-11-28)
    "test_realbroker.py",             # gw0's, after its first file: its broker runs are done by then
    "test_audit_e2e.py",              # 297 s
    "test_recover_realbroker.py",
    "test_incremental.py",
    "test_full_read.py",              # 150 s
    "test_standalone_cluster.py",
    "test_dledger_audit.py",          # 109 s
    "test_indexed_read.py",
    "test_indexed_indexfile.py",
    "test_datasources.py",            # 51 s
    "test_cq_past_end.py",            # 50 s
    "test_check_e2e.py",              # 49 s
    "test_exit_status.py",            # 45 s
    "test_crash_safety.py",           # 42 s
)

#: the file only worker gw0 runs (see the module docstring)
PINNED_FILE = "test_realbroker.py"
PINNED_WORKER = "gw0"


def order_items(items: list) -> None:
    """Reorder ``items`` in place: the files of :data:`LONGEST_FIRST` first, in its order, then the rest in
    collection order; the tests of a file keep their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    position: Dict[str, int] = {}
    for it in items:
        position.setdefault(str(it.path), len(position))

    def key(it) -> tuple:
        return (rank.get(Path(str(it.path)).name, len(rank)), position[str(it.path)])

    items.sort(key=key)          # stable: a file's tests keep their order


def _worker_no(node) -> int:
    gw = node.gateway.id
    return int(gw[2:]) if gw.startswith("gw") and gw[2:].isdigit() else 1 << 30


def make_scheduler(config, log):
    """A file-at-a-time scheduler keeping collection order, with :data:`PINNED_FILE` for gw0 only."""
    from xdist.scheduler import LoadScopeScheduling

    class FileScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return nodeid.split("::", 1)[0]

        def schedule(self) -> None:
            self.config.option.loadscopereorder = False      # collection order is already longest first
            # the first units go out in node order: gw0 first, so that it starts on the longest file rather
            # than on its pinned one (whose broker runs have only just started)
            self.assigned_work = dict(sorted(self.assigned_work.items(), key=lambda kv: _worker_no(kv[0])))
            super().schedule()

        @staticmethod
        def _pinned(scope: str) -> bool:
            return Path(scope).name == PINNED_FILE

        def _pin_node_alive(self) -> bool:
            return any(n.gateway.id == PINNED_WORKER for n in self.nodes)

        def _reschedule(self, node) -> None:
            if node.shutting_down:
                return
            if self.workqueue and not self._takeable(node) and self._pending_of(self.assigned_work[node]) == 0:
                # only gw0's file is left: this worker is done (gw0 shuts down in its own time)
                node.shutdown()
                return
            if self.workqueue and not self._takeable(node):
                return
            super()._reschedule(node)

        def _takeable(self, node) -> List[str]:
            mine = node.gateway.id == PINNED_WORKER or not self._pin_node_alive()
            return [s for s in self.workqueue if mine or not self._pinned(s)]

        def _assign_work_unit(self, node) -> None:
            takeable = self._takeable(node)
            if not takeable:
                return
            scope = takeable[0]
            self.workqueue.move_to_end(scope, last=False)     # the base class pops the queue's first unit
            super()._assign_work_unit(node)
            if not self.workqueue:
                for other in self.nodes:
                    if other is not node and not self._pending_of(self.assigned_work[other]):
                        other.shutdown()

    return FileScheduling(config, log)
