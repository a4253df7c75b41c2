"""The Spark jobs a piece of driver code ran, as Spark's own listener recorded them.

Spark's ``AppStatusStore`` (fed by the ``AppStatusListener`` on the listener bus, present also when the UI is
disabled) keeps every job with its description (``setJobDescription``; the audit sets ``txaudit <phase>``),
its call site (``name``), submission / completion time, stages and tasks.  :func:`job_mark` before and
:func:`jobs_since` after a call list the jobs in between; the bus is drained first, so a job that ended is
counted.  Only the last ``spark.ui.retainedJobs`` (default 1000) jobs are kept by the store.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List


@dataclass(frozen=True)
class SparkJob:
    job_id: int
    description: str        # setJobDescription at submission ("" when none)
    callsite: str           # the JobData name: the user-code call site Spark recorded
    seconds: float          # completion - submission (-1 when either is unknown)
    stages: int             # stages of the job, skipped ones included
    skipped_stages: int
    tasks: int              # tasks of the stages that ran
    status: str


def _drain(spark) -> None:
    spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()


def _opt(option, default=None):
    return option.get() if option.isDefined() else default


def _jobs(spark) -> List[SparkJob]:
    _drain(spark)
    seq = spark.sparkContext._jsc.sc().statusStore().jobsList(None)
    out = []
    for i in range(seq.size()):
        j = seq.apply(i)
        sub, end = _opt(j.submissionTime()), _opt(j.completionTime())
        secs = (end.getTime() - sub.getTime()) / 1000.0 if sub is not None and end is not None else -1.0
        out.append(SparkJob(int(j.jobId()), str(_opt(j.description(), "")), str(j.name()), secs,
                            int(j.stageIds().size()), int(j.numSkippedStages()),
                            int(j.numTasks()) - int(j.numSkippedTasks()), str(j.status())))
    return sorted(out, key=lambda r: r.job_id)


def job_mark(spark) -> int:
    """The id the next job will get (every job Spark ran so far has a lower one)."""
    jobs = _jobs(spark)
    return jobs[-1].job_id + 1 if jobs else 0


def jobs_since(spark, mark: int) -> List[SparkJob]:
    """The jobs submitted since ``mark`` (:func:`job_mark`), in submission order."""
    return [j for j in _jobs(spark) if j.job_id >= mark]


def phase_of(job: SparkJob) -> str:
    """The audit phase a job ran in, from its ``txaudit <phase>`` description ("-" when it had none)."""
    return job.description[len("txaudit "):] if job.description.startswith("txaudit ") else (
        job.description or "-")
