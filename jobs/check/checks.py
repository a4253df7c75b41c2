"""The checks file of the CI data-quality mode (YAML, ``yaml.safe_load``) and the evaluation of its checks.

Format (Soda-style warn/fail thresholds; every key but ``name`` / ``metric`` and one condition is optional)::

    checks:
      - name: no transaction committed twice     # unique within the file
        metric: flag.DUPLICATE_COMMIT            # jobs/check/metrics.py registry
        fail: "> 0"
      - name: check-back backlog did not jump
        metric: check_back
        warn_change: "> 50%"                     # against the previous run of the same broker(s) in --out
        broker: broker-a                         # a name, a list of names, "each" or "*" (default: "*")
        description: free text, ignored

Conditions: ``> n``, ``>= n``, ``< n``, ``<= n``, ``= n``, ``!= n``, ``between a and b``, ``not between a and
b`` (inclusive bounds).  ``warn`` / ``fail`` test the metric's value; ``warn_change`` / ``fail_change`` test
its change against the previous run: ``value - previous`` for plain numbers, ``(value - previous) /
previous x 100`` when the numbers carry ``%`` (a rise from 0 is +infinity %, 0 -> 0 is 0 %).  ``%`` on a
``warn`` / ``fail`` condition is allowed for ``share.*`` metrics (fractions: ``> 5%`` means ``> 0.05``).

Everything wrong with the file is a :class:`ChecksFileError` naming the file, the check and the key; it is
raised before any store is read (``spark-submit.sh`` validates the file before a JVM starts).

Result status: FAIL when a fail condition holds, else WARN when a warn condition holds, else PASS; a change
condition without a previous run does not hold (the message says so).  ERROR when the check cannot be
evaluated on this run (a broker the run does not have).
"""
from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from jobs.check.metrics import SHARE, UnknownMetricError, check_metric_name
from schemas.quality import ALL_INSTANCE, ENTITY_ALL, ENTITY_BROKER
from txlog_io.errors import UsageError

LEVELS = ("fail", "warn")
CONDITION_KEYS = ("fail", "warn", "fail_change", "warn_change")     # evaluation order: most severe first
CHECK_KEYS = frozenset({"name", "metric", "broker", "description", *CONDITION_KEYS})
TOP_KEYS = frozenset({"checks"})
EACH = "each"

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_CMP = re.compile(rf"^(>=|<=|!=|==|>|<|=)\s*({_NUM})\s*(%?)$")
_BETWEEN = re.compile(rf"^(not\s+)?between\s+({_NUM})\s*(%?)\s+and\s+({_NUM})\s*(%?)$", re.IGNORECASE)


class ChecksFileError(UsageError):
    """The checks file cannot be used: unreadable, not YAML, or a check that is wrong (names file, check,
    key)."""


@dataclass(frozen=True)
class Condition:
    """A parsed condition: ``op`` in >, >=, <, <=, =, !=, between, not between."""

    text: str
    op: str
    a: float
    b: Optional[float] = None
    percent: bool = False

    def holds(self, x: float) -> bool:
        if x is None or (isinstance(x, float) and math.isnan(x)):
            return False
        a = self.a
        if self.op == ">":
            return x > a
        if self.op == ">=":
            return x >= a
        if self.op == "<":
            return x < a
        if self.op == "<=":
            return x <= a
        if self.op == "=":
            return x == a
        if self.op == "!=":
            return x != a
        inside = min(a, self.b) <= x <= max(a, self.b)
        return inside if self.op == "between" else not inside


def parse_condition(text) -> Condition:
    """``"> 0"`` -> Condition; ValueError with the reason otherwise."""
    if isinstance(text, bool) or not isinstance(text, (str, int, float)):
        raise ValueError(f"expected a condition string such as \"> 0\" or \"between 1 and 5\", got {text!r}")
    if not isinstance(text, str):
        raise ValueError(f"a bare number is not a condition; write e.g. \"> {text}\" or \"= {text}\"")
    t = " ".join(text.split())
    m = _CMP.match(t)
    if m:
        op = "=" if m.group(1) == "==" else m.group(1)
        return Condition(t, op, float(m.group(2)), None, bool(m.group(3)))
    m = _BETWEEN.match(t)
    if m:
        if bool(m.group(3)) != bool(m.group(5)):
            raise ValueError(f"{text!r}: both bounds or neither must carry %")
        op = "not between" if m.group(1) else "between"
        return Condition(t, op, float(m.group(2)), float(m.group(4)), bool(m.group(3)))
    raise ValueError(f"cannot parse condition {text!r}: expected '> n', '>= n', '< n', '<= n', '= n', "
                     f"'!= n', 'between a and b' or 'not between a and b' (n may end with % in *_change)")


@dataclass(frozen=True)
class Check:
    index: int                                   # 1-based position in the file
    name: str
    metric: str
    brokers: Tuple[str, ...]                     # ("*",), ("each",) or names
    conditions: Tuple[Tuple[str, Condition], ...]   # (key, condition), most severe first
    description: str = ""

    @property
    def level(self) -> str:
        return "fail" if any(k.startswith("fail") for k, _ in self.conditions) else "warn"

    @property
    def has_change(self) -> bool:
        return any(k.endswith("_change") for k, _ in self.conditions)

    def conditions_text(self) -> str:
        return "; ".join(f"{k}: {c.text}" for k, c in self.conditions)


@dataclass(frozen=True)
class ChecksFile:
    path: str
    checks: Tuple[Check, ...]


def _where(path: str, check: Optional[int] = None, name: Optional[str] = None, key: Optional[str] = None):
    parts = [f"checks file {path}"]
    if check is not None:
        parts.append(f"check #{check}" + (f" {name!r}" if name else ""))
    if key is not None:
        parts.append(f"key {key!r}")
    return ": ".join(parts)


def parse_checks(doc, path: str) -> ChecksFile:
    """The parsed YAML document -> ChecksFile; a ChecksFileError for anything wrong."""
    if not isinstance(doc, dict):
        raise ChecksFileError(f"{_where(path)}: expected a mapping with a 'checks' list at the top, got "
                              f"{type(doc).__name__}")
    unknown = sorted(set(map(str, doc)) - TOP_KEYS)
    if unknown:
        raise ChecksFileError(f"{_where(path, key=unknown[0])}: unknown top-level key (expected: checks)")
    items = doc.get("checks")
    if not isinstance(items, list) or not items:
        raise ChecksFileError(f"{_where(path, key='checks')}: expected a non-empty list of checks")
    checks, seen = [], {}
    for i, item in enumerate(items, 1):
        if not isinstance(item, dict):
            raise ChecksFileError(f"{_where(path, i)}: expected a mapping (name, metric, conditions), got "
                                  f"{item!r}")
        name = item.get("name")
        if not isinstance(name, str) or not name.strip():
            raise ChecksFileError(f"{_where(path, i, key='name')}: missing or empty check name")
        name = name.strip()
        bad = sorted(set(map(str, item)) - CHECK_KEYS)
        if bad:
            raise ChecksFileError(f"{_where(path, i, name, bad[0])}: unknown key (expected: "
                                  f"{', '.join(sorted(CHECK_KEYS))})")
        if name in seen:
            raise ChecksFileError(f"{_where(path, i, name, 'name')}: duplicate check name (also check "
                                  f"#{seen[name]})")
        seen[name] = i
        if "metric" not in item:
            raise ChecksFileError(f"{_where(path, i, name, 'metric')}: missing")
        try:
            metric = check_metric_name(item["metric"])
        except UnknownMetricError as e:
            raise ChecksFileError(f"{_where(path, i, name, 'metric')}: {e}") from None
        conds = []
        for key in CONDITION_KEYS:
            if key not in item:
                continue
            try:
                c = parse_condition(item[key])
            except ValueError as e:
                raise ChecksFileError(f"{_where(path, i, name, key)}: {e}") from None
            if c.percent and not key.endswith("_change") and not metric.startswith(SHARE):
                raise ChecksFileError(f"{_where(path, i, name, key)}: % is only meaningful in warn_change / "
                                      f"fail_change or on share.* metrics, got {c.text!r}")
            conds.append((key, c))
        if not conds:
            raise ChecksFileError(f"{_where(path, i, name)}: no condition: give at least one of "
                                  f"{', '.join(CONDITION_KEYS)}")
        brokers = item.get("broker", ALL_INSTANCE)
        if isinstance(brokers, str):
            brokers = [brokers]
        if not isinstance(brokers, list) or not brokers or \
                not all(isinstance(b, str) and b.strip() for b in brokers):
            raise ChecksFileError(f"{_where(path, i, name, 'broker')}: expected a broker name, a list of "
                                  f"names, 'each' or '*', got {item.get('broker')!r}")
        brokers = [b.strip() for b in brokers]
        if len(brokers) > 1 and ({ALL_INSTANCE, EACH} & set(brokers)):
            raise ChecksFileError(f"{_where(path, i, name, 'broker')}: '*' and 'each' stand alone, "
                                  f"not in a list")
        desc = item.get("description", "")
        checks.append(Check(i, name, metric, tuple(brokers), tuple(conds), str(desc or "")))
    return ChecksFile(path, tuple(checks))


def load_checks(path: str) -> ChecksFile:
    """Read and validate a checks file (``yaml.safe_load``)."""
    import yaml

    path = os.path.abspath(path)
    try:
        with open(path, "rb") as fh:
            text = fh.read()
    except OSError as e:
        raise ChecksFileError(f"checks file {path}: cannot read: {e.strerror or e}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        hint = ""
        if mark is not None:
            line = text.decode("utf-8", "replace").splitlines()[mark.line:mark.line + 1]
            if line and re.search(r":\s*>", line[0]):
                hint = ' (a bare > starts a YAML block scalar: quote the condition, e.g. fail: "> 0")'
        raise ChecksFileError(f"checks file {path}: invalid YAML{at}: {problem}{hint}") from None
    return parse_checks(doc, path)


# ------------------------------------------------------------------------------------------------------------
# evaluation
# ------------------------------------------------------------------------------------------------------------

@dataclass
class CheckResult:
    """One row of check_results (schemas.quality.CHECK_RESULTS) before run_id / run_date are added."""

    check: str
    metric: str
    broker: str
    level: str
    status: str
    value: Optional[float]
    condition: Optional[str]
    previous_value: Optional[float]
    message: str
    samples: List[str] = field(default_factory=list)

    def as_row(self, run_id: str) -> dict:
        return {"run_id": run_id, "check": self.check, "metric": self.metric, "broker": self.broker,
                "level": self.level, "status": self.status, "value": self.value, "condition": self.condition,
                "previous_value": self.previous_value, "message": self.message, "samples": list(self.samples)}


def change(value: float, previous: float, percent: bool) -> float:
    if not percent:
        return value - previous
    if previous == 0:
        return 0.0 if value == 0 else math.copysign(math.inf, value)
    return (value - previous) / abs(previous) * 100.0


def fmt_num(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and (math.isinf(x) or math.isnan(x)):
        return str(x)
    if float(x).is_integer() and abs(x) < 1e15:
        return str(int(x))
    return f"{x:.6g}"


def _scopes(check: Check, brokers: Sequence[str]) -> List[Tuple[str, str, str]]:
    """``[(result broker column, metrics entity, metrics instance)]``."""
    if check.brokers == (ALL_INSTANCE,):
        return [(ALL_INSTANCE, ENTITY_ALL, ALL_INSTANCE)]
    if check.brokers == (EACH,):
        return [(b, ENTITY_BROKER, b) for b in brokers]
    return [(b, ENTITY_BROKER, b) for b in check.brokers]


def evaluate(checks: ChecksFile, metrics: Dict[Tuple[str, str, str], float], brokers: Sequence[str],
             previous, sampler) -> List[CheckResult]:
    """Results of every check in every scope.

    ``previous(entity, instance, name) -> (value or None, previous run id or None)``; ``sampler(metric,
    broker or None) -> [str]`` is asked only for WARN/FAIL results."""
    results = []
    for check in checks.checks:
        for broker, entity, instance in _scopes(check, brokers):
            if entity == ENTITY_BROKER and broker not in brokers:
                results.append(CheckResult(
                    check.name, check.metric, broker, check.level, "ERROR", None, check.conditions_text(),
                    None,
                    f"checks file {checks.path}: check #{check.index} {check.name!r}: key 'broker': broker "
                    f"{broker!r} is not in this run (brokers: {', '.join(brokers)})"))
                continue
            value = metrics.get((entity, instance, check.metric), 0.0)
            prev, prev_run = (None, None)
            if check.has_change:
                prev, prev_run = previous(entity, instance, check.metric)
            decided, notes = None, []
            for key, cond in check.conditions:
                if key.endswith("_change"):
                    if prev is None:
                        notes.append(f"{key} not evaluated: no previous run")
                        continue
                    delta = change(value, prev, cond.percent)
                    hit = cond.holds(delta)
                    sign = "+" if delta >= 0 else ""
                    shown = f"{delta:+.1f}%" if cond.percent else f"{sign}{fmt_num(delta)}"
                    if hit and decided is None:
                        decided = (key, cond, f"changed {shown} from {fmt_num(prev)} (run {prev_run})")
                else:
                    hit = cond.holds(value * 100.0 if cond.percent else value)   # share.*: 5% = 0.05
                    if hit and decided is None:
                        decided = (key, cond, "")
            label = f"{check.metric} = {fmt_num(value)}" + ("" if broker == ALL_INSTANCE else f" on {broker}")
            if decided is None:
                status, condition = "PASS", check.conditions_text()
                msg = label + (f", previous {fmt_num(prev)} (run {prev_run})" if prev is not None else "")
                msg += ": " + "; ".join(["all conditions pass"] + notes)
                smp: List[str] = []
            else:
                key, cond, why = decided
                status = "FAIL" if key.startswith("fail") else "WARN"
                condition = f"{key}: {cond.text}"
                msg = f"{label}{', ' + why if why else ''}: {condition} holds"
                smp = list(sampler(check.metric, None if broker == ALL_INSTANCE else broker))
            results.append(CheckResult(check.name, check.metric, broker, check.level, status, value,
                                       condition, prev, msg, smp))
    return results


def statistics(results: Sequence[CheckResult]) -> Dict[str, int]:
    n = {s: sum(1 for r in results if r.status == s) for s in ("PASS", "WARN", "FAIL", "ERROR")}
    return {"evaluated": len(results), "passed": n["PASS"], "warned": n["WARN"], "failed": n["FAIL"],
            "errors": n["ERROR"]}


def exit_code(results: Sequence[CheckResult]) -> int:
    """Soda's: 0 all passed, 1 a warning, 2 a failure, 3 a check could not be evaluated."""
    statuses = {r.status for r in results}
    if "ERROR" in statuses:
        return 3
    if "FAIL" in statuses:
        return 2
    if "WARN" in statuses:
        return 1
    return 0


__all__ = ["ChecksFile", "Check", "Condition", "CheckResult", "ChecksFileError", "load_checks",
           "parse_checks", "parse_condition", "evaluate", "statistics", "exit_code", "change", "fmt_num"]
