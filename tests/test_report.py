"""The HTML report (jobs/report*.py) and the walkthrough notebook.

Outputs come from in-process ``run_audit`` on the session ``spark``: a demo store audited twice (two as-ofs:
a trend, and an earlier run to rebuild) and the three real-broker fixtures audited together (one broker
each).  Every assertion about numbers recomputes them from the Delta tables with pyarrow, independently of
``jobs.report.data``.
"""
from __future__ import annotations

import html
import html.parser
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pyarrow.compute as pc
import pytest

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "data" / "fixtures"
VERSIONS = ("rocketmq-3.1.4", "rocketmq-4.9.8", "rocketmq-5.3.3")
AS_OFS = ("2026-11-21T12:00:00Z", "2026-11-22T12:00:00Z")
DEMO_TX = 120
ALWAYS = ("run", "states", "prepared", "flags", "store-map", "trend")


def _opts(stores, out, as_of, *extra):
    from jobs.main import parse_args

    args = ["audit", "--out", str(out), "--as-of", as_of, *extra]
    for s in stores:
        args += ["--store", str(s)]
    return parse_args(args)[1]


@pytest.fixture(scope="module")
def demo_out(spark, tmp_path_factory):
    """The demo store (5.1+ crashy) audited at two as-ofs into one --out; the first run's page as written by
    the audit itself is kept before the second run refreshes the directory."""
    from jobs.audit.run import epoch_ms, run_audit
    from jobs.demo import generate_demo_store
    from jobs.main import parse_as_of

    base = tmp_path_factory.mktemp("report-demo")
    gen = generate_demo_store(str(base), epoch_ms(parse_as_of(AS_OFS[0])), transactions=DEMO_TX)
    out = base / "out"
    first = run_audit(spark, _opts([gen.store_dir], out, AS_OFS[0], "--broker", "demo"), print_summary=False)
    first_page = (out / "report" / f"{first.run_id}.html").read_bytes()
    second = run_audit(spark, _opts([gen.store_dir], out, AS_OFS[1], "--broker", "demo"), print_summary=False)
    return {"out": out, "runs": (first.run_id, second.run_id), "first_page": first_page}


@pytest.fixture(scope="module")
def fixtures_out(spark, tmp_path_factory):
    """The three real-broker stores in one audit (broker = fixture name)."""
    from jobs.audit.run import run_audit

    out = tmp_path_factory.mktemp("report-fixtures") / "out"
    extra = [a for v in VERSIONS for a in ("--broker", v)]
    s = run_audit(spark, _opts([FIXTURES / v / "store" for v in VERSIONS], out, AS_OFS[0], *extra),
                  print_summary=False)
    return {"out": out, "runs": (s.run_id,)}


@pytest.fixture(params=["demo", "fixtures"])
def audited(request):
    return request.getfixturevalue(f"{request.param}_out")


# ------------------------------------------------------------------------------------------------------------
# helpers: parse the page, recompute from the tables
# ------------------------------------------------------------------------------------------------------------

class _Refs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.refs, self.tags, self.ids, self.metrics = [], Counter(), [], {}
        self._metric = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        self.tags[tag] += 1
        for k in ("src", "href", "srcset", "data", "action", "poster", "background"):
            if k in a:
                self.refs.append((tag, k, a[k]))
        if tag == "section":
            self.ids.append(a.get("id"))
        self._metric = a.get("data-metric")

    def handle_data(self, data):
        if self._metric is not None and data.strip():
            self.metrics[self._metric] = int(data.strip().replace(",", ""))
            self._metric = None


def _parse(page: Path) -> _Refs:
    p = _Refs()
    p.feed(page.read_text(encoding="utf-8"))
    return p


def _rows(out, table, run_id):
    from deltalake import DeltaTable

    return DeltaTable(str(Path(out) / table)).to_pyarrow_table(filters=[("run_id", "=", run_id)])


def _page(out, run_id) -> Path:
    return Path(out) / "report" / f"{run_id}.html"


# ------------------------------------------------------------------------------------------------------------
# tests
# ------------------------------------------------------------------------------------------------------------

@pytest.mark.spark
def test_every_run_has_a_page_and_the_index_links_them(audited):
    out = audited["out"]
    for rid in audited["runs"]:
        assert _page(out, rid).is_file()
    index = _parse(out / "report" / "index.html")
    assert {v for t, k, v in index.refs if k == "href"} == {f"{r}.html" for r in audited["runs"]}


@pytest.mark.spark
def test_page_has_every_section(audited):
    for rid in audited["runs"]:
        p = _parse(_page(audited["out"], rid))
        assert tuple(i for i in p.ids if i != "checks") == ALWAYS
        assert "checks" not in p.ids                       # no check_results table under this --out
        assert p.tags["svg"] >= 3                          # state bars, store map, ... as inline charts
        assert "img" not in p.tags


def _charts(page: Path) -> list:
    """Every inline ``<svg>`` of a page, parsed as a standalone XML document."""
    from xml.etree import ElementTree as ET

    return [ET.fromstring(m) for m in re.findall(r"<svg\b.*?</svg>", page.read_text(encoding="utf-8"), re.S)]


@pytest.mark.spark
def test_charts_are_valid_sized_and_labelled_svg(audited):
    ns = "{http://www.w3.org/2000/svg}"
    for rid in audited["runs"]:
        charts = _charts(_page(audited["out"], rid))
        assert len(charts) >= 3
        ids = [el.get("id") for svg in charts for el in svg.iter() if el.get("id")]
        assert len(ids) == len(set(ids))                   # inlined together: no id twice on the page
        for svg in charts:
            w, h = float(svg.get("width")), float(svg.get("height"))
            assert 200 <= w <= 800 and 100 <= h <= 2000, (w, h)
            assert svg.get("viewBox") == f"0 0 {svg.get('width')} {svg.get('height')}"
            assert svg.get("role") == "img"
            title, desc = svg.find(f"{ns}title"), svg.find(f"{ns}desc")
            assert title is not None and title.text and desc is not None and desc.text
            assert svg.get("aria-labelledby") == f"{title.get('id')} {desc.get('id')}"
            texts = [t.text for t in svg.iter(f"{ns}text")]
            assert len(texts) >= 4 and all(texts)          # tick labels, axis label, legend / categories
            marks = [el for el in svg.iter() if el.tag in (f"{ns}rect", f"{ns}circle", f"{ns}polyline")]
            assert len(marks) >= 2                         # the background plus at least one data mark
            for el in svg.iter():                         # every mark inside the drawing
                for k, bound in (("x", w), ("x1", w), ("x2", w), ("cx", w), ("width", w),
                                 ("y", h), ("y1", h), ("y2", h), ("cy", h), ("height", h)):
                    v = el.get(k)
                    if v is not None and not v.endswith("%"):
                        assert -1 <= float(v) <= bound + 1, (el.tag, k, v, w, h)


@pytest.mark.spark
def test_page_references_nothing_outside_itself(audited):
    out = audited["out"]
    pages = set(os.listdir(out / "report"))
    for rid in audited["runs"]:
        page = _page(out, rid)
        text = page.read_text(encoding="utf-8")
        p = _parse(page)
        assert not {"script", "link", "iframe", "object", "embed"} & set(p.tags)
        assert "@import" not in text and not re.search(r"url\((?!data:)", text)
        for tag, attr, value in p.refs:
            if attr == "href":                              # navigation to a sibling report page only
                assert "/" not in value and ":" not in value and value in pages, value
            else:
                raise AssertionError((tag, attr, value[:60]))
        for svg in re.findall(r"<svg\b.*?</svg>", text, re.S):
            # SVG links only to its own elements; the namespace declarations are not fetched
            for ref in re.findall(r'(?:xlink:)?href="([^"]*)"', svg):
                assert ref.startswith("#"), ref
            assert not re.findall(r"https?://(?!www\.w3\.org/(?:2000/svg|1999/xlink))", svg)
            assert "<image" not in svg and "<foreignObject" not in svg


@pytest.mark.spark
def test_numbers_equal_the_tables(audited):
    out = audited["out"]
    for rid in audited["runs"]:
        m = _parse(_page(out, rid)).metrics
        tx = _rows(out, "transactions", rid)
        run = _rows(out, "audit_runs", rid).to_pylist()[0]
        states = Counter(zip(tx.column("broker").to_pylist(), tx.column("state").to_pylist(), strict=True))
        assert m["transactions"] == tx.num_rows == run["transactions"]
        for (b, s), n in states.items():
            assert m[f"state.{b}.{s}"] == n
        for b in run["brokers"]:
            assert m[f"broker.{b}"] == sum(n for (bb, _), n in states.items() if bb == b)
        prepared = sum(n for (_, s), n in states.items() if s == "PREPARED")
        assert m["prepared"] == prepared == dict(run["state_counts"]).get("PREPARED", 0)
        assert m["prepared_rows"] == prepared
        if prepared:
            p = tx.filter(pc.equal(tx.column("state"), "PREPARED"))
            past = [d is not None and d <= a for d, a in zip(p.column("deadline_ms").to_pylist(),
                                                               p.column("as_of_ms").to_pylist(), strict=True)]
            assert m["past_deadline"] == sum(past)
        flags = Counter(f for fl in tx.column("flags").to_pylist() for f in fl)
        assert {k[5:]: v for k, v in m.items() if k.startswith("flag.")} == dict(flags) == \
            dict(run["flag_counts"])
        for logical, metric in (("check_back_worklist", "check_back"), ("recovery_worklist", "recovery"),
                                ("audit_anomalies", "findings")):
            assert m[metric] == _rows(out, logical, rid).num_rows == dict(run["table_rows"])[logical]
        an = _rows(out, "audit_anomalies", rid)
        by_code = Counter(zip(an.column("code").to_pylist(), an.column("source").to_pylist(), strict=True))
        shown = {k: v for k, v in m.items() if k.startswith("finding.")}
        listed = {(c, s): n for (c, s), n in by_code.items() if f"finding.{c}.{s}" in shown}
        assert len(shown) == len(listed) == min(len(by_code), 40)
        assert all(shown[f"finding.{c}.{s}"] == n for (c, s), n in listed.items())


_MEASURE = """<pre id="measure"></pre><script>
const out = [...document.querySelectorAll("svg.chart")].map(svg => {
  const box = svg.getBoundingClientRect();
  const texts = [...svg.querySelectorAll("text")];
  const outside = texts.filter(t => { const r = t.getBoundingClientRect();
    return r.left < box.left - 1 || r.right > box.right + 1 || r.top < box.top - 1 || r.bottom > box.bottom + 1; });
  const marks = [...svg.querySelectorAll("rect, circle, polyline, line")].slice(1)
    .map(m => m.getBBox()).filter(b => b.width > 0 || b.height > 0);
  return {title: svg.querySelector("title").textContent, width: box.width, height: box.height,
          texts: texts.length, drawn: texts.filter(t => t.getComputedTextLength() > 0).length,
          outside: outside.map(t => t.textContent), marks: marks.length};
});
document.getElementById("measure").textContent = JSON.stringify(out);
</script>"""


def _browser():
    """A headless Chromium: one on PATH, else the one scripts/fetch-browser.sh installs (as root, with apt-get)."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if shutil.which(name):
            return shutil.which(name)
    r = subprocess.run([str(ROOT / "scripts" / "fetch-browser.sh")], capture_output=True, text=True, timeout=900)
    return r.stdout.strip() or None if r.returncode == 0 else None


@pytest.mark.spark
def test_charts_render_in_a_real_browser(audited, tmp_path):
    """Headless Chromium lays the page out (a copy with a measuring script appended; the report itself has
    none): every chart has a size, its text is drawn and inside the chart, its marks have a extent."""
    browser = _browser()
    if browser is None:
        pytest.skip("no chromium on PATH and scripts/fetch-browser.sh could not install one (needs root and apt-get)")
    for rid in audited["runs"]:
        page = _page(audited["out"], rid)
        expected = len(_charts(page))
        probe = tmp_path / f"probe-{rid}.html"
        probe.write_text(page.read_text(encoding="utf-8").replace("</body>", _MEASURE + "</body>"),
                         encoding="utf-8")
        r = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                            "--no-first-run", "--disable-background-networking", "--disable-component-update",
                            "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1300,2000",
                            "--dump-dom", probe.as_uri()], capture_output=True, text=True, timeout=180)
        m = re.search(r'<pre id="measure">(.*?)</pre>', r.stdout, re.S)
        assert r.returncode == 0 and m, r.stderr[-2000:]
        charts = json.loads(html.unescape(m.group(1)))
        assert len(charts) == expected >= 3
        for c in charts:
            assert c["width"] >= 200 and c["height"] >= 100, c
            assert c["texts"] >= 4 and c["drawn"] == c["texts"], c
            assert not c["outside"], c
            assert c["marks"] >= 1, c


@pytest.mark.spark
def test_store_map_places_commitlog_findings_in_their_files(fixtures_out):
    from jobs.report.data import gather

    d = gather(str(fixtures_out["out"]))
    assert [m.broker for m in d.store_maps] == list(VERSIONS)
    for m in d.store_maps:
        assert m.files_recorded and m.files, m.broker
        bases = [b for b, _ in m.files]
        assert bases == sorted(bases)
        for off, base in zip(m.findings["offset"], m.findings["file_base"], strict=True):
            if base is not None and base == base:
                assert base <= off


@pytest.mark.spark
def test_rebuilding_an_earlier_run_is_identical(demo_out):
    from jobs.report.write import write_report

    first, second = demo_out["runs"]
    page = write_report(str(demo_out["out"]), first)
    assert Path(page).read_bytes() == demo_out["first_page"]
    trend = _parse(Path(page))
    assert f"{second}.html" not in {v for _, _, v in trend.refs}      # the trend stops at the run
    latest = _parse(_page(demo_out["out"], second))
    assert f"{first}.html" in {v for _, _, v in latest.refs}


@pytest.mark.spark
def test_check_results_rendered_when_the_table_exists(demo_out, tmp_path):
    import shutil

    import pyarrow as pa
    from deltalake import write_deltalake

    from jobs.report.write import write_report

    out = tmp_path / "out"
    shutil.copytree(demo_out["out"], out)
    rid = demo_out["runs"][1]
    rows = pa.table({"run_id": [rid] * 3, "check": ["prepared_max", "findings_max", "tx_min"],
                     "metric": ["prepared", "findings", "transactions"], "broker": ["demo"] * 3,
                     "level": ["error", "warn", "error"], "status": ["FAIL", "WARN", "PASS"],
                     "value": [5.0, 2.0, 120.0], "condition": ["<= 0", "<= 1", ">= 1"],
                     "previous_value": [None, 2.0, 120.0], "message": ["too many", "some", "ok"],
                     "samples": [["a", "b"], [], []]})
    write_deltalake(str(out / "check_results"), rows, partition_by=["run_id"])
    p = _parse(Path(write_report(str(out), rid)))
    assert p.ids[-1] == "checks"
    assert (p.metrics["check.FAIL"], p.metrics["check.WARN"], p.metrics["check.PASS"]) == (1, 1, 1)


@pytest.mark.spark
def test_report_subcommand_without_spark(demo_out, tmp_path):
    first = demo_out["runs"][0]
    env = dict(os.environ, TXAUDIT_SPARK_MASTER="")
    r = subprocess.run(["bash", str(ROOT / "spark-submit.sh"), "report", "--out", str(demo_out["out"]),
                        "--run-id", first], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(_page(demo_out["out"], first))
    assert _page(demo_out["out"], first).read_bytes() == demo_out["first_page"]
    assert "SparkContext" not in r.stderr and "spark" not in r.stderr.lower()
    bad = subprocess.run(["bash", str(ROOT / "spark-submit.sh"), "report", "--out", str(demo_out["out"]),
                          "--run-id", "nope"], capture_output=True, text=True, env=env, timeout=300)
    assert bad.returncode == 1 and bad.stderr.strip().splitlines()[-1].startswith("txaudit: error: report:")


def test_report_and_no_report_arguments(tmp_path):
    from jobs.main import ReportOptions, main, parse_args

    store = FIXTURES / VERSIONS[2] / "store"
    _, a = parse_args(["audit", "--store", str(store), "--out", str(tmp_path / "o"), "--no-report"])
    assert a.report is False
    _, a = parse_args(["audit", "--store", str(store), "--out", str(tmp_path / "o")])
    assert a.report is True
    _, r = parse_args(["report", "--out", str(tmp_path)])
    assert r == ReportOptions(out=str(tmp_path), run_id=None)
    assert main(["report", "--out", str(tmp_path / "missing")]) == 2
    assert main(["report", "--out", str(tmp_path)]) == 1          # no audit_runs table: one-line error


def test_failing_report_does_not_fail_the_audit(tmp_path, capsys):
    from jobs.audit.run import write_run_report

    assert write_run_report(str(tmp_path), "r1") is None
    err = capsys.readouterr().err
    assert err.startswith("txaudit: warning: report not written:") and err.count("\n") == 1


_NOTEBOOK_RUNNER = """
import sys
import nbformat
from nbclient import NotebookClient
src, dst, cwd = sys.argv[1:4]
nb = nbformat.read(src, as_version=4)
try:
    NotebookClient(nb, timeout=900, kernel_name="python3", resources={"metadata": {"path": cwd}}).execute()
finally:
    nbformat.write(nb, dst)
"""


@pytest.fixture(scope="module", autouse=True)
def notebook_process(request, tmp_path_factory):
    """The walkthrough notebook runs in its own kernel (its own SparkSession): started in a child process
    before the first test of the module when test_notebook_executes is selected, so that it runs while the
    in-process audits do (as test_audit_e2e does with the demo); killed if never awaited."""
    mine = [i for i in request.session.items if i.module is request.module]
    if not any(i.name == "test_notebook_executes" for i in mine) or \
            importlib.util.find_spec("nbclient") is None:
        yield None
        return
    work = tmp_path_factory.mktemp("notebook")
    path = ROOT / "notebooks" / "txaudit-walkthrough.ipynb"
    executed = work / "executed.ipynb"
    proc = subprocess.Popen([sys.executable, "-c", _NOTEBOOK_RUNNER, str(path), str(executed), str(path.parent)],
                            env=dict(os.environ, TXAUDIT_NOTEBOOK_DIR=str(work)), stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    t0 = time.monotonic()
    yield {"proc": proc, "path": path, "executed": executed, "work": work, "t0": t0}
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)


@pytest.mark.slow
def test_notebook_executes(notebook_process):
    nbformat = pytest.importorskip("nbformat")
    pytest.importorskip("nbclient")
    nb = nbformat.read(str(notebook_process["path"]), as_version=4)
    assert all(not c.get("outputs") and c.get("execution_count") is None
               for c in nb.cells if c.cell_type == "code"), "store the notebook without outputs"
    proc = notebook_process["proc"]
    log, _ = proc.communicate(timeout=1500)
    print(f"notebook executed in {time.monotonic() - notebook_process['t0']:.1f} s (started at module start)")
    assert proc.returncode == 0, log[-5000:]
    nb = nbformat.read(str(notebook_process["executed"]), as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("image/png" in o.get("data", {}) for o in outputs)          # the plot was drawn
    assert (notebook_process["work"] / "out" / "report" / "index.html").is_file()


def test_the_report_imports_no_plotting_library():
    """The audit imports the report modules at the end of a run: they draw their SVG themselves, so neither
    an import's cost nor a notebook's plotting backend is touched."""
    code = ("import sys, jobs.report.write, jobs.report.plots, jobs.audit.run; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('matplotlib', 'PIL')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT), timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_scatter_tooltips_and_dense_clouds():
    """Each point of a small scatter has a tooltip; a large one is one dot per 2 px cell, without tooltips."""
    from xml.etree import ElementTree as ET

    import numpy as np
    import pandas as pd

    from jobs.report.plots import MANY_POINTS, prepared_age_vs_deadline

    ns = "{http://www.w3.org/2000/svg}"
    rng = np.random.default_rng(7)
    for n in (40, 50_000):
        p = pd.DataFrame({"deadline_ms": np.ones(n), "age_ms": rng.uniform(0, 3e8, n),
                          "to_deadline_ms": rng.uniform(-1e8, 2e8, n)})
        svg = ET.fromstring(prepared_age_vs_deadline(p))
        dots = [c for g in svg.iter(f"{ns}g") for c in g.iter(f"{ns}circle")]
        tips = [c for c in dots if c.find(f"{ns}title") is not None]
        if n < MANY_POINTS:
            assert len(dots) == len(tips) == n                      # distinct points: one dot each
        else:
            assert MANY_POINTS < len(dots) < n and not tips
            assert {float(c.get("cx")) % 2 for c in dots} == {0.0}
        desc = svg.find(f"{ns}desc").text
        past = int((p["to_deadline_ms"] <= 0).sum())
        assert f"{n - past} before their deadline, {past} past it" in desc
