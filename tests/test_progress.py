"""txlog_io.progress: a progress line on a terminal only (txlog-dump, txlog-refbroker generate)."""
from __future__ import annotations

import io
import json


class _Tty(io.StringIO):
    def isatty(self):
        return True


def test_silent_unless_terminal():
    from txlog_io.progress import Progress

    piped = io.StringIO()
    p = Progress("x", 10, stream=piped, interval=0, check_every=1)
    for i in range(10):
        p.update(i + 1)
    p.close()
    assert piped.getvalue() == ""


def test_terminal_line_redrawn_and_erased():
    from txlog_io.progress import Progress

    tty = _Tty()
    p = Progress("generate", 4, unit="tx", stream=tty, interval=0, check_every=1)
    for i in range(4):
        p.update(i + 1)
    text = tty.getvalue()
    assert "generate: 4 tx / 4 tx (100.0 %)" in text and text.count("\r") == 4
    p.close()
    assert tty.getvalue().endswith("\r") and "\n" not in tty.getvalue()


def test_dump_progress_only_on_terminal_and_json_lines_intact(tmp_path):
    from refbroker import generate
    from txlog_io.cli import _Out, dump_commitlog

    store = generate("5.1+", "clean", 30, 7, tmp_path / "s", commitlog_file_mb=1).store_dir
    for err, has_progress in ((io.StringIO(), False), (_Tty(), True)):
        out = io.StringIO()
        dump_commitlog([str(store)], _Out(verify=False, stdout=out, stderr=err), with_body=False)
        assert ("commitlog: " in err.getvalue()) == has_progress
        # records on stdout stay JSON lines; stderr's summaries are whole lines after the progress is erased
        assert all(json.loads(line) for line in out.getvalue().splitlines())
        for line in err.getvalue().split("\n"):
            line = line.rsplit("\r", 1)[-1].strip()
            if line:
                assert "summary" in json.loads(line)
