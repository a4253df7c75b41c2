"""Reference broker: writes realistic RocketMQ store directories whose true transaction outcomes are known.

Pure Python, no Spark.  Every byte of every store format is written through txlog_io's encoders (one encoder
per format in the project); this package adds the broker's behaviour: version profiles (refbroker.profiles),
Java HashMap property order (refbroker.javaorder), the store with its mapped files, consume-queue dispatch,
statetable/redolog, config files and checkpoint (refbroker.store), transaction semantics on a simulated clock
(refbroker.broker), scenarios and the streamed workload (refbroker.workload), post-run faults
(refbroker.faults) and the ground-truth ledger (refbroker.ledger).

Entry points:

* ``refbroker.generate(profile, scenario, transactions, seed, out_dir, **sizes) -> GenerateResult``
* ``txlog-refbroker generate ...`` / ``python -m refbroker generate ...`` (refbroker.cli)
* ``refbroker.Broker`` + ``refbroker.Producer`` for hand-written sequences (the tests' hypothesis machine).
"""
from refbroker.broker import COMMIT, ROLLBACK, UNKNOWN, Broker, CheckRequest, Producer
from refbroker.generate import GenerateResult, Run, generate
from refbroker.profiles import PROFILE_NAMES, PROFILES, Profile, get_profile
from refbroker.workload import SCENARIOS, get_scenario

__all__ = ["generate", "GenerateResult", "Run", "Broker", "Producer", "CheckRequest", "Profile", "PROFILES",
           "PROFILE_NAMES", "get_profile", "SCENARIOS", "get_scenario", "COMMIT", "ROLLBACK", "UNKNOWN"]
