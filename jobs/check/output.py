"""What ``check`` prints and the files it writes for CI systems (a :class:`jobs.check.evaluate.CheckReport` in, text
out; Spark-free).

* stdout: one line per result (status, check, broker, value, previous value, the deciding condition) and a
  one-line summary ``txaudit check: run R: N evaluated, P passed, W warned, F failed, E errors -> STATUS``.
* ``--json FILE``: ``{"success", "exit_code", "run_id", "out", "checks_file", "statistics": {"evaluated",
  "passed", "warned", "failed", "errors"}, "results": [check_results rows]}`` -- Great Expectations'
  ``success`` / ``statistics`` shape; ``success`` is false when a check failed or errored (warnings pass).
* ``--junit-xml FILE``: one ``<testcase>`` per result (``classname`` txaudit.check.<broker or all>, name the
  check and its broker); FAIL -> ``<failure>``, ERROR -> ``<error>``, WARN passes with its message in
  ``<system-out>`` (as every result does), samples in the failure text.
"""
from __future__ import annotations

import json
import math
import os
import xml.etree.ElementTree as ET
from typing import List

from jobs.check.checks import fmt_num
from schemas.quality import ALL_INSTANCE

_OUTCOME = {0: "PASS", 1: "WARN", 2: "FAIL", 3: "ERROR"}


def _cut(s: str, n: int) -> str:
    return s if len(s) <= n else s[: n - 1] + "~"


def format_results(report) -> str:
    rows = [("STATUS", "CHECK", "BROKER", "VALUE", "PREVIOUS", "CONDITION")]
    for r in report.results:
        rows.append((r.status, _cut(r.check, 48), _cut(r.broker, 20), fmt_num(r.value),
                     fmt_num(r.previous_value), r.condition or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(5)]
    lines = ["  ".join(f"{c:<{w}}" for c, w in zip(row[:5], widths, strict=True)) + "  " + row[5]
             for row in rows]
    for r in report.results:
        if r.status in ("WARN", "FAIL", "ERROR"):
            lines.append(f"{r.status} {r.check} [{r.broker}]: {r.message}"
                         + (f"; samples: {', '.join(r.samples)}" if r.samples else ""))
    return "\n".join(line.rstrip() for line in lines)


def summary_line(report) -> str:
    s = report.statistics
    return (f"txaudit check: run {report.run.run_id}: {s['evaluated']} evaluated, {s['passed']} passed, "
            f"{s['warned']} warned, {s['failed']} failed, {s['errors']} errors -> "
            f"{_OUTCOME[report.exit_code]} (exit {report.exit_code})")


def _json_num(x):
    return None if x is None or (isinstance(x, float) and (math.isnan(x) or math.isinf(x))) else x


def json_document(report) -> dict:
    stats = report.statistics
    return {
        "success": stats["failed"] == 0 and stats["errors"] == 0,
        "exit_code": report.exit_code,
        "run_id": report.run.run_id,
        "run_date": report.run.run_date.isoformat(),
        "brokers": list(report.run.brokers),
        "checks_file": report.checks.path,
        "statistics": stats,
        "results": [dict(r.as_row(report.run.run_id), value=_json_num(r.value),
                         previous_value=_json_num(r.previous_value)) for r in report.results],
        "tables": dict(report.tables),
    }


def _atomic_write(path: str, data: bytes) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def write_json(report, path: str) -> None:
    _atomic_write(path, (json.dumps(json_document(report), indent=2, sort_keys=False) + "\n").encode())


def junit_xml(report) -> bytes:
    stats = report.statistics
    seconds = f"{report.seconds.get('total', 0.0):.3f}"
    suites = ET.Element("testsuites", name="txaudit check", tests=str(stats["evaluated"]),
                        failures=str(stats["failed"]), errors=str(stats["errors"]), time=seconds)
    suite = ET.SubElement(suites, "testsuite", name=f"txaudit.check.{report.run.run_id}",
                          tests=str(stats["evaluated"]), failures=str(stats["failed"]),
                          errors=str(stats["errors"]), skipped="0", time=seconds)
    props = ET.SubElement(suite, "properties")
    for k, v in (("run_id", report.run.run_id), ("checks_file", report.checks.path),
                 ("brokers", ",".join(report.run.brokers))):
        ET.SubElement(props, "property", name=k, value=v)
    for r in report.results:
        scope = "all" if r.broker == ALL_INSTANCE else r.broker
        case = ET.SubElement(suite, "testcase", classname=f"txaudit.check.{scope}",
                             name=f"{r.check} [{r.broker}]", time="0")
        detail: List[str] = [r.message, f"metric {r.metric} = {fmt_num(r.value)}"]
        if r.previous_value is not None:
            detail.append(f"previous value {fmt_num(r.previous_value)}")
        if r.samples:
            detail.append("samples: " + ", ".join(r.samples))
        if r.status == "FAIL":
            failure = ET.SubElement(case, "failure", message=r.message, type=r.condition or "fail")
            failure.text = "\n".join(detail)
        elif r.status == "ERROR":
            ET.SubElement(case, "error", message=r.message, type="ERROR").text = "\n".join(detail)
        ET.SubElement(case, "system-out").text = f"{r.status}: " + "\n".join(detail)
    ET.indent(suites)
    return ET.tostring(suites, encoding="utf-8", xml_declaration=True)


def write_junit(report, path: str) -> None:
    _atomic_write(path, junit_xml(report) + b"\n")


__all__ = ["format_results", "summary_line", "json_document", "write_json", "junit_xml", "write_junit"]
