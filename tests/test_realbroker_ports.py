"""The real-broker harness's port handling: ports are picked below the kernel's ephemeral range, and a JVM
whose port was taken between the pick and its bind (BindException in its output) is started again on fresh
ports, with the reason kept; any other start failure is not retried."""
from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import realbroker as rb  # noqa: E402


def test_ports_are_picked_below_the_ephemeral_range():
    lo, hi = rb.port_range()
    eph_lo, _ = rb._ephemeral_range()
    assert hi <= eph_lo or (lo, hi) == (20000, 60000)
    for _ in range(20):
        p = rb.free_port_block(4)
        assert lo <= p and p + 3 < hi


@pytest.mark.realbroker
@pytest.mark.slow
def test_broker_whose_ha_port_was_taken_starts_again_on_fresh_ports(tmp_path):
    """The 5.3.3 broker binds its HA port (listenPort+1) on every interface in DefaultHAService; taken after
    the pick, the broker exits 255 before listening.  The harness starts it again on fresh ports."""
    try:
        rb.compile_workload("5.3.3")
    except rb.FetchUnavailable as e:
        pytest.skip(f"REAL-BROKER TEST SKIPPED: {e}")
    cluster = rb.Cluster("5.3.3", tmp_path / "c")
    taken = cluster.broker_port + 1
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("0.0.0.0", taken))
        s.listen(1)
        try:
            cluster.start()
        finally:
            cluster.close()
    assert cluster.broker_starts == 2 and cluster.broker_lives == 1
    assert cluster.broker_port + 1 != taken
    assert len(cluster.port_retries) == 1
    assert "broker start 1" in cluster.port_retries[0] and "BindException" in cluster.port_retries[0]
    first = (cluster.logs / "broker-1.out").read_text(errors="replace")
    assert "BindException: Address already in use" in first and "DefaultHAService" in first
    assert "boot success" in (cluster.logs / "broker-2.out").read_text(errors="replace")


def test_other_start_failures_are_not_retried(tmp_path):
    """A JVM that exits before listening without a bind failure raises at once (no fresh-port retry)."""
    log = tmp_path / "x.out"
    proc = rb._spawn("x", [sys.executable, "-c", "print('boom: no config'); raise SystemExit(3)"], log, {},
                     tmp_path)
    with pytest.raises(rb.HarnessError) as e:
        rb._wait_port(rb.free_port_block(1), proc, 30)
    assert not isinstance(e.value, rb.PortTaken) and "exited (3)" in str(e.value)
    log2 = tmp_path / "y.out"
    proc = rb._spawn("y", [sys.executable, "-c",
                           "print('java.net.BindException: Address already in use'); raise SystemExit(255)"],
                     log2, {}, tmp_path)
    with pytest.raises(rb.PortTaken):
        rb._wait_port(rb.free_port_block(1), proc, 30)
