#!/usr/bin/env bash
# Submit the RocketMQ TxAudit job with the pyspark package's own bin/spark-submit (inside the project's venv).
#
#   ./spark-submit.sh [spark options] audit --store DIR [--store DIR2 ...] --out DIR [--as-of ISO-8601]
#                     [--mode indexed|full] [--conf-file FILE] [--include-bodies] [--broker NAME ...]
#                     [--profile NAME|auto] [--run-id ID] [spark options]
#   ./spark-submit.sh [spark options] demo [--out DIR] [...]
#   ./spark-submit.sh dump ...                     (txlog-dump: decode store files, no Spark)
#   ./spark-submit.sh check [--checks FILE] [--json FILE] [--junit-xml FILE] --out DIR [audit options]
#                     (data-quality checks; without --store no JVM starts; exit 0 pass 1 warn 2 fail 3 error)
#   ./spark-submit.sh report --out DIR [--run-id ID]  (HTML report of a finished run, no Spark)
#   ./spark-submit.sh repair --store DIR --out AUDIT_OUT --into NEWDIR [...]   (repair a copy, no Spark)
#   ./spark-submit.sh recover --out AUDIT_OUT --namesrv HOST:PORT [--decisions FILE] [--send] [...]
#                     (send the audit's recovery requests to a live broker, no Spark; dry run unless --send)
#
# Spark options (--master, --conf k=v, --driver-memory, --executor-memory, --num-executors, --packages, --jars,
# --py-files, --files, --driver-java-options, ...) may stand before or after the subcommand and go to spark-submit.
# --with-jars delta[,s3a] (or env TXAUDIT_WITH_JARS=delta,s3a) adds the jars scripts/fetch-jars.sh put in
# ${TXAUDIT_CACHE:-~/.cache/txaudit}/jars/<set>/ with --jars: `delta` = delta-spark (+ its session extension and
# catalog, so delta.writer=auto|spark writes through Spark), `s3a` = hadoop-aws + the AWS SDK bundle (s3a://).
# A requested set that was not fetched is exit 2 + one line; without --with-jars nothing is added.
# The script bootstraps .venv, validates the job's arguments before any JVM starts (exit 2 + one line on error),
# zips the project's packages for --py-files, points Log4j2 at conf/log4j2.properties and runs jobs/main.py.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${TXAUDIT_VENV:-$ROOT/.venv}"
VENV_PY="$VENV/bin/python"
BUILD_DIR="${TXAUDIT_BUILD_DIR:-$ROOT/build}"
PROG="txaudit"

# check: misuse is exit 3 (2 means "a check failed" there)
usage_error() { echo "$PROG: error: $*" >&2; [ "${SUB:-}" = check ] && exit 3; exit 2; }

usage() {
    sed -n '2,12p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    echo "Run './spark-submit.sh audit --help' for the audit options."
}

# spark-submit options that take a value / are flags
VALUE_OPTS=" --with-jars --master --deploy-mode --class --name --jars --packages --exclude-packages --repositories --py-files
 --files --archives --conf -c --properties-file --driver-memory --driver-java-options --driver-library-path
 --driver-class-path --driver-cores --executor-memory --executor-cores --total-executor-cores --num-executors
 --proxy-user --principal --keytab --queue --remote "
FLAG_OPTS=" --supervise --verbose -v "

SPARK_ARGS=()
APP_ARGS=()
SUB=""
MASTER=""
USER_PYFILES=""
USER_FILES=""
USER_DRIVER_JAVA=""
USER_EXEC_JAVA=""
HAVE_PROGRESS_CONF=0
HAVE_EXTENSIONS=0
DELTA_PACKAGE=0
HAVE_NAME=0
WANT_HELP=0
USER_JARS=""
WITH_JARS="${TXAUDIT_WITH_JARS:-}"

spark_opt() {   # $1 = option, $2 = value
    case "$1" in
        --master) MASTER="$2"; SPARK_ARGS+=("$1" "$2") ;;
        --py-files) USER_PYFILES="${USER_PYFILES:+$USER_PYFILES,}$2" ;;
        --files) USER_FILES="${USER_FILES:+$USER_FILES,}$2" ;;
        --driver-java-options) USER_DRIVER_JAVA="${USER_DRIVER_JAVA:+$USER_DRIVER_JAVA }$2" ;;
        --name) HAVE_NAME=1; SPARK_ARGS+=("$1" "$2") ;;
        --jars) USER_JARS="${USER_JARS:+$USER_JARS,}$2" ;;
        --with-jars) WITH_JARS="${WITH_JARS:+$WITH_JARS,}$2" ;;
        --packages)
            case "$2" in *io.delta:delta-spark*|*io.delta:delta-core*) DELTA_PACKAGE=1 ;; esac
            SPARK_ARGS+=("$1" "$2") ;;
        --conf|-c)
            case "$2" in
                *=*) ;;
                *) usage_error "$1 expects key=value, got '$2'" ;;
            esac
            local key="${2%%=*}" val="${2#*=}"
            case "$key" in
                spark.executor.extraJavaOptions) USER_EXEC_JAVA="${USER_EXEC_JAVA:+$USER_EXEC_JAVA }$val" ;;
                spark.driver.extraJavaOptions) USER_DRIVER_JAVA="${USER_DRIVER_JAVA:+$USER_DRIVER_JAVA }$val" ;;
                spark.submit.pyFiles) USER_PYFILES="${USER_PYFILES:+$USER_PYFILES,}$val" ;;
                spark.jars) USER_JARS="${USER_JARS:+$USER_JARS,}$val" ;;
                *)
                    [ "$key" = spark.master ] && MASTER="$val"
                    [ "$key" = spark.ui.showConsoleProgress ] && HAVE_PROGRESS_CONF=1
                    [ "$key" = spark.sql.extensions ] && HAVE_EXTENSIONS=1
                    [ "$key" = spark.app.name ] && HAVE_NAME=1
                    SPARK_ARGS+=("--conf" "$2") ;;
            esac ;;
        *) SPARK_ARGS+=("$1" "$2") ;;
    esac
}

while [ $# -gt 0 ]; do
    arg="$1"
    name="${arg%%=*}"
    if [[ "$arg" == --*=* ]] && [[ "$VALUE_OPTS" == *" $name "* ]]; then
        spark_opt "$name" "${arg#*=}"; shift; continue
    fi
    if [[ "$VALUE_OPTS" == *" $arg "* ]]; then
        [ $# -ge 2 ] || usage_error "option $arg needs a value"
        spark_opt "$arg" "$2"; shift 2; continue
    fi
    if [[ "$FLAG_OPTS" == *" $arg "* ]]; then
        SPARK_ARGS+=("$arg"); shift; continue
    fi
    if [ -z "$SUB" ]; then
        case "$arg" in
            -h|--help) usage; exit 0 ;;
            audit|demo|dump|check|report|repair|recover) SUB="$arg" ;;
            -*) usage_error "unknown option before the subcommand: $arg" \
                            "(subcommands: audit, demo, check, report, repair, recover, dump)" ;;
            *) usage_error "unknown subcommand: $arg (expected audit, demo, check, report, repair, recover or dump)" ;;
        esac
    else
        case "$arg" in -h|--help) WANT_HELP=1 ;; esac
        APP_ARGS+=("$arg")
    fi
    shift
done
[ -n "$SUB" ] || usage_error "missing subcommand: audit, demo, check, report, repair, recover or dump (see ./spark-submit.sh --help)"

"$ROOT/scripts/bootstrap.sh" || { [ "$SUB" = check ] && exit 3; exit 1; }

if [ "$SUB" = check ]; then
    # without --store, check reads the Delta tables under --out on the driver: no JVM is needed
    has_store=0
    for a in ${APP_ARGS[@]+"${APP_ARGS[@]}"}; do
        case "$a" in --store|--store=*) has_store=1 ;; esac
    done
    if [ "$has_store" = 0 ]; then
        [ ${#SPARK_ARGS[@]} -eq 0 ] \
            || echo "$PROG: warning: check without --store runs without Spark; Spark options ignored" >&2
        export TXAUDIT_CONF_DIR="${TXAUDIT_CONF_DIR:-$ROOT/conf}"
        exec "$VENV_PY" "$ROOT/jobs/main.py" check ${APP_ARGS[@]+"${APP_ARGS[@]}"}
    fi
fi

if [ "$SUB" = dump ]; then
    [ -f "$ROOT/txlog_io/cli.py" ] || { echo "$PROG: error: dump: txlog_io.cli is not available yet" >&2; exit 1; }
    [ ${#SPARK_ARGS[@]} -eq 0 ] || echo "$PROG: warning: dump runs without Spark; Spark options ignored" >&2
    exec "$VENV_PY" -m txlog_io.cli ${APP_ARGS[@]+"${APP_ARGS[@]}"}
fi

if [ "$SUB" = report ]; then
    # built from the Delta tables with deltalake on this machine: no JVM
    [ ${#SPARK_ARGS[@]} -eq 0 ] || echo "$PROG: warning: report runs without Spark; Spark options ignored" >&2
    exec "$VENV_PY" "$ROOT/jobs/main.py" report ${APP_ARGS[@]+"${APP_ARGS[@]}"}
fi

if [ "$SUB" = recover ]; then    # driver-only job (jobs/recover/run.py): no JVM
    [ ${#SPARK_ARGS[@]} -eq 0 ] || echo "$PROG: warning: recover runs without Spark; Spark options ignored" >&2
    exec "$VENV_PY" "$ROOT/jobs/main.py" recover ${APP_ARGS[@]+"${APP_ARGS[@]}"}
fi
if [ "$SUB" = repair ]; then    # driver-only job (jobs/repair/run.py): no JVM
    [ ${#SPARK_ARGS[@]} -eq 0 ] || echo "$PROG: warning: repair runs without Spark; Spark options ignored" >&2
    exec "$VENV_PY" "$ROOT/jobs/main.py" repair ${APP_ARGS[@]+"${APP_ARGS[@]}"}
fi

if [ "$WANT_HELP" = 1 ]; then
    exec "$VENV_PY" "$ROOT/jobs/main.py" "$SUB" ${APP_ARGS[@]+"${APP_ARGS[@]}"}
fi

# --with-jars: the fetched jar sets (scripts/fetch-jars.sh), checked before any JVM starts
JAR_CACHE="${TXAUDIT_CACHE:-$HOME/.cache/txaudit}/jars"
CACHED_JARS=""
SEEN_SETS=""
DELTA_JARS=0
IFS=',' read -r -a _sets <<<"$WITH_JARS"
for set in ${_sets[@]+"${_sets[@]}"}; do
    case "$set" in
        "") continue ;;
        delta) DELTA_JARS=1 ;;
        s3a) ;;
        *) usage_error "--with-jars: unknown jar set '$set' (expected delta, s3a)" ;;
    esac
    [ -f "$JAR_CACHE/$set/.complete" ] \
        || usage_error "--with-jars $set: not fetched into $JAR_CACHE/$set (run scripts/fetch-jars.sh $set)"
    case " $SEEN_SETS " in *" $set "*) continue ;; esac
    SEEN_SETS="$SEEN_SETS $set"
    for j in "$JAR_CACHE/$set"/*.jar; do CACHED_JARS="${CACHED_JARS:+$CACHED_JARS,}$j"; done
done

# pre-check: parse and validate the job's arguments without starting a JVM (exit 2 + one line on error); it
# prints the driver JVM options a short run wants (C1-only JIT: jobs/session.py QUICK_JIT)
export TXAUDIT_CONF_DIR="${TXAUDIT_CONF_DIR:-$ROOT/conf}"
PRECHECK=$("$VENV_PY" "$ROOT/jobs/main.py" --validate-only "$SUB" ${APP_ARGS[@]+"${APP_ARGS[@]}"}) || exit $?
JIT_OPTS=$(printf '%s\n' "$PRECHECK" | grep -E -x -- '-XX:[A-Za-z0-9]+(=[A-Za-z0-9]+)?' | tr '\n' ' ' || true)
JIT_OPTS="${JIT_OPTS% }"
printf '%s\n' "$PRECHECK" | grep -v -E -x -- '-XX:[A-Za-z0-9]+(=[A-Za-z0-9]+)?|' || true

# the project's packages as one zip, so executors on a real cluster import the same code
mkdir -p "$BUILD_DIR"
PYZIP="$BUILD_DIR/txaudit-pyfiles.zip"
"$VENV_PY" - "$ROOT" "$PYZIP" <<'PY'
import os, sys, zipfile
root, target = sys.argv[1], sys.argv[2]
tmp = f"{target}.{os.getpid()}.tmp"
with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
    for pkg in ("txlog_io", "schemas", "jobs", "refbroker"):
        for d, dirs, files in os.walk(os.path.join(root, pkg)):
            dirs[:] = sorted(x for x in dirs if x != "__pycache__" and not x.startswith("."))
            for f in sorted(files):
                if f.endswith((".py", ".json", ".properties", ".xml")):
                    p = os.path.join(d, f)
                    zf.write(p, os.path.relpath(p, root))
os.replace(tmp, target)
PY

is_local=0
case "$MASTER" in ""|local|local\[*) is_local=1 ;; esac
if [ "$is_local" = 1 ]; then
    export SPARK_LOCAL_IP=127.0.0.1
    export PYSPARK_PYTHON="$VENV_PY"
else
    export PYSPARK_PYTHON="${PYSPARK_PYTHON:-$VENV_PY}"
fi
export PYSPARK_DRIVER_PYTHON="$VENV_PY"
export TXAUDIT_SPARK_MASTER="$MASTER"

LOG4J="$TXAUDIT_CONF_DIR/log4j2.properties"
DRIVER_JAVA="$USER_DRIVER_JAVA"
EXEC_JAVA="$USER_EXEC_JAVA"
FILES="$USER_FILES"
if [ -f "$LOG4J" ]; then
    case "$DRIVER_JAVA" in
        *log4j2.configurationFile*) ;;
        *) DRIVER_JAVA="${DRIVER_JAVA:+$DRIVER_JAVA }-Dlog4j2.configurationFile=file:$LOG4J" ;;
    esac
    case "$EXEC_JAVA" in
        *log4j2.configurationFile*) ;;
        *) EXEC_JAVA="${EXEC_JAVA:+$EXEC_JAVA }-Dlog4j2.configurationFile=log4j2.properties"
           FILES="${FILES:+$FILES,}$LOG4J" ;;
    esac
fi

# the JIT choice is ours only when the user's driver options make none
case "$DRIVER_JAVA" in
    *-XX:TieredStopAtLevel*|*-XX:-TieredCompilation*) ;;
    *) [ -n "$JIT_OPTS" ] && DRIVER_JAVA="${DRIVER_JAVA:+$DRIVER_JAVA }$JIT_OPTS" ;;
esac

EXTRA=(--py-files "$PYZIP${USER_PYFILES:+,$USER_PYFILES}")
[ -n "$DRIVER_JAVA" ] && EXTRA+=(--driver-java-options "$DRIVER_JAVA")
[ -n "$EXEC_JAVA" ] && EXTRA+=(--conf "spark.executor.extraJavaOptions=$EXEC_JAVA")
[ -n "$FILES" ] && EXTRA+=(--files "$FILES")
[ "$HAVE_NAME" = 1 ] || EXTRA+=(--name "txaudit-$SUB")
[ "$HAVE_PROGRESS_CONF" = 1 ] || EXTRA+=(--conf spark.ui.showConsoleProgress=true)
JARS="$CACHED_JARS${USER_JARS:+${CACHED_JARS:+,}$USER_JARS}"
[ -n "$JARS" ] && EXTRA+=(--jars "$JARS")
if { [ "$DELTA_PACKAGE" = 1 ] || [ "$DELTA_JARS" = 1 ]; } && [ "$HAVE_EXTENSIONS" = 0 ]; then
    EXTRA+=(--conf spark.sql.extensions=io.delta.sql.DeltaSparkSessionExtension
            --conf spark.sql.catalog.spark_catalog=org.apache.spark.sql.delta.catalog.DeltaCatalog)
fi

SPARK_SUBMIT="$("$VENV_PY" -c 'import os, pyspark; print(os.path.join(os.path.dirname(pyspark.__file__), "bin", "spark-submit"))')"
[ -x "$SPARK_SUBMIT" ] || { echo "$PROG: error: pyspark's spark-submit not found at $SPARK_SUBMIT" >&2; exit 1; }

exec "$SPARK_SUBMIT" ${SPARK_ARGS[@]+"${SPARK_ARGS[@]}"} "${EXTRA[@]}" \
    "$ROOT/jobs/main.py" "$SUB" ${APP_ARGS[@]+"${APP_ARGS[@]}"}
