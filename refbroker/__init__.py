"""Reference broker: writes realistic RocketMQ store directories whose true transaction outcomes are known.

Pure Python, no Spark.  Every byte of every store format is written through txlog_io's encoders (one encoder
per format in the project); this package adds the broker's behaviour: version profiles (refbroker.profiles),
Java HashMap property order (refbroker.javaorder), the store with its consume-queue dispatch, config files
and checkpoint (refbroker.store) and its mapped-file writers for the CommitLog, consume queues and the 3.x
statetable/redolog (refbroker.mappedfiles), transaction semantics on a simulated clock (refbroker.broker,
with one module per part of the broker: refbroker.events, .producer, .systopics, .configmanagers, .produce,
.transaction, .checkservice, .statetable, .recovery), scenarios and the streamed workload
(refbroker.workload), post-run faults (refbroker.faults) and the ground-truth ledger (refbroker.ledger).

Entry points:

* ``refbroker.generate(profile, scenario, transactions, seed, out_dir, **sizes) -> GenerateResult``
* ``txlog-refbroker generate ...`` / ``python -m refbroker generate ...`` (refbroker.cli)
* ``refbroker.Broker`` + ``refbroker.Producer`` for hand-written sequences (the tests' hypothesis machine).
"""
from refbroker.broker import Broker
from refbroker.generate import GenerateResult, Run, generate
from refbroker.producer import COMMIT, ROLLBACK, UNKNOWN, CheckRequest, Producer
from refbroker.profiles import PROFILE_NAMES, PROFILES, Profile, get_profile
from refbroker.workload import SCENARIOS, get_scenario

__all__ = ["generate", "GenerateResult", "Run", "Broker", "Producer", "CheckRequest", "Profile", "PROFILES",
           "PROFILE_NAMES", "get_profile", "SCENARIOS", "get_scenario", "COMMIT", "ROLLBACK", "UNKNOWN"]
