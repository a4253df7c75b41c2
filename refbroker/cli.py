"""``txlog-refbroker``: generate reference stores from the command line.

    txlog-refbroker generate --profile 5.1+ --scenario crashy --transactions N [--background-messages M]
                             [--commitlog-file-mb S] [--cq-file-units U] [--msg-bytes B] --seed S --out DIR
                             [--snapshot-every N]
    txlog-refbroker verify DIR        # decode DIR/store, check it against DIR/ledger.jsonl (1: problems)
    txlog-refbroker profiles          # the version profiles and their broker defaults (JSON)
    txlog-refbroker scenarios         # the scenario presets

``generate`` writes DIR/store, DIR/ledger.jsonl and DIR/summary.json and prints a one-line result (or the
summary as JSON with --json).  Exit status: 0 ok, 1 verify found problems, 2 usage error.
"""
from __future__ import annotations

import argparse
import json
import sys

from refbroker.profiles import PROFILE_NAMES, PROFILES
from refbroker.workload import SCENARIOS, describe_scenarios
from txlog_io.errors import TxlogError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="txlog-refbroker", description="RocketMQ reference broker: writes "
                                     "real store directories with known transaction outcomes")
    sub = parser.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="generate a store, its ledger and summary")
    gen.add_argument("--profile", required=True, choices=PROFILE_NAMES)
    gen.add_argument("--scenario", required=True, choices=tuple(SCENARIOS))
    gen.add_argument("--transactions", type=int, required=True)
    gen.add_argument("--background-messages", type=int, default=None,
                     help="ordinary messages (default: 2 per transaction)")
    gen.add_argument("--commitlog-file-mb", type=float, default=None,
                     help="CommitLog mapped file size in MiB (default 1024, the broker default)")
    gen.add_argument("--cq-file-units", type=int, default=None,
                     help="consume-queue file size in 20-byte units (default 300000)")
    gen.add_argument("--msg-bytes", type=int, default=None, help="typical message body size (default 1024)")
    gen.add_argument("--tx-interval-ms", type=int, default=None,
                     help="simulated time between transactional sends (default 10)")
    gen.add_argument("--dledger", metavar="SELF_ID", default=None,
                     help="write a DLedger (Raft) CommitLog store, dledger-SELF_ID/ (4.5+ profiles)")
    gen.add_argument("--snapshot-every", dest="snapshot_every", type=int, default=None, metavar="N",
                     help="also copy the store every N transactions to OUT/snapshots/NNN/store (one growing "
                          "store; the ledger lines so far next to each)")
    gen.add_argument("--seed", type=int, required=True)
    gen.add_argument("--out", required=True, help="output directory (store/, ledger.jsonl, summary.json)")
    gen.add_argument("--json", action="store_true", help="print the summary as JSON")
    ver = sub.add_parser("verify", help="decode a generated DIR and check it against its ledger")
    ver.add_argument("out", help="directory written by generate (store/ and ledger.jsonl)")
    sub.add_parser("profiles", help="print the version profiles as JSON")
    sub.add_parser("scenarios", help="list the scenario presets")
    return parser


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "profiles":
        print(json.dumps({name: p.to_dict() for name, p in PROFILES.items()}, indent=2))
        return 0
    if args.command == "scenarios":
        print(describe_scenarios())
        return 0
    if args.command == "verify":
        from refbroker.verify import main as verify_main

        try:
            return verify_main([args.out])
        except TxlogError as exc:
            print(f"txlog-refbroker: error: {exc}", file=sys.stderr)
            return 2
    from refbroker.generate import generate

    try:
        profile = args.profile
        if args.dledger:
            from refbroker.profiles import get_profile

            profile = get_profile(profile).with_(dledger_self_id=args.dledger)
        result = generate(
            profile,
            args.scenario,
            args.transactions,
            args.seed,
            args.out,
            snapshot_every=args.snapshot_every,
            background_messages=args.background_messages,
            commitlog_file_mb=args.commitlog_file_mb,
            cq_file_units=args.cq_file_units,
            msg_bytes=args.msg_bytes,
            tx_interval_ms=args.tx_interval_ms,
        )
    except TxlogError as exc:
        print(f"txlog-refbroker: error: {exc}", file=sys.stderr)
        return 2
    s = result.summary
    if args.json:
        print(json.dumps(s, indent=2))
    else:
        store = s["store"]
        print(
            f"{result.store_dir}: {store['records']} records, {store['record_bytes'] / (1 << 20):.1f} MiB in "
            f"{store['commitlog_files']} CommitLog file(s); {s['transactions']} transactions "
            f"{s['outcomes']}; faults {s['faults']}; {s['timing']['seconds']} s "
            f"({s['timing']['record_mb_per_s']} MiB/s)"
        )
    return 0


def console_main() -> None:
    """The console script: :func:`main`, its status the process's exit status (txlog_io.process_exit)."""
    from txlog_io import process_exit

    process_exit.run(main)


if __name__ == "__main__":
    console_main()
