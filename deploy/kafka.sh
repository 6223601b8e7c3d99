#!/usr/bin/env bash
# Real Apache Kafka (KRaft, single node) on 127.0.0.1 for tests and local runs, from the
# Maven Central jars (no tarball, no container).
#
#   deploy/kafka.sh fetch            download the pinned server jars into the cache (Maven)
#   deploy/kafka.sh start [DIR]      format storage in DIR and start; prints bootstrap=HOST:PORT
#   deploy/kafka.sh stop  [DIR]      stop the broker started in DIR
#
# Environment: KAFKA_VERSION (default 3.9.1), KAFKA_CACHE (default ~/.cache/gpuwarden/kafka),
# KAFKA_PORT (default: a free port), KAFKA_HEAP (default 512m), KAFKA_START_TIMEOUT (60 s).
set -euo pipefail

KAFKA_VERSION=${KAFKA_VERSION:-3.9.1}
SCALA_VERSION=2.13
CACHE=${KAFKA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gpuwarden/kafka}
LIBS=$CACHE/$KAFKA_VERSION/libs
HERE=$(cd "$(dirname "$0")" && pwd)

log() { printf '[kafka] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

fetch() {
    if [ -s "$LIBS/kafka_${SCALA_VERSION}-${KAFKA_VERSION}.jar" ]; then return 0; fi
    command -v mvn >/dev/null || die "mvn not found (apt-get install maven)"
    local tmp; tmp=$(mktemp -d)
    sed "s/@KAFKA_VERSION@/$KAFKA_VERSION/" "$HERE/kafka-pom.xml" > "$tmp/pom.xml"
    log "fetching kafka_${SCALA_VERSION} $KAFKA_VERSION jars with Maven"
    mkdir -p "$LIBS.partial"
    (cd "$tmp" && mvn -q -B dependency:copy-dependencies -DoutputDirectory="$LIBS.partial") \
        || die "maven could not fetch the Kafka jars"
    rm -rf "$LIBS"; mv "$LIBS.partial" "$LIBS"; rm -rf "$tmp"
    log "jars cached in $LIBS"
}

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

start() {
    local dir=${1:-$CACHE/run}
    fetch
    mkdir -p "$dir"
    if [ -s "$dir/kafka.pid" ] && kill -0 "$(cat "$dir/kafka.pid")" 2>/dev/null; then
        echo "bootstrap=$(cat "$dir/bootstrap")"; return 0
    fi
    local port=${KAFKA_PORT:-$(free_port)} cport; cport=$(free_port)
    rm -rf "$dir/data"
    cat > "$dir/server.properties" <<PROPS
process.roles=broker,controller
node.id=1
controller.quorum.voters=1@127.0.0.1:$cport
listeners=PLAINTEXT://127.0.0.1:$port,CONTROLLER://127.0.0.1:$cport
advertised.listeners=PLAINTEXT://127.0.0.1:$port
controller.listener.names=CONTROLLER
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs=$dir/data
num.partitions=1
offsets.topic.replication.factor=1
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=false
log.retention.hours=1
PROPS
    cat > "$dir/log4j.properties" <<PROPS
log4j.rootLogger=WARN, file
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$dir/server.log
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=[%d] %p %m (%c)%n
PROPS
    local cp="$LIBS/*"
    local jopts="-Xmx${KAFKA_HEAP:-512m} -Xms128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Dlog4j.configuration=file:$dir/log4j.properties"
    # shellcheck disable=SC2086
    java $jopts -cp "$cp" kafka.tools.StorageTool format -t "$(java -cp "$cp" kafka.tools.StorageTool random-uuid 2>/dev/null)" \
        -c "$dir/server.properties" --ignore-formatted >"$dir/format.log" 2>&1 || die "storage format failed: $(cat "$dir/format.log")"
    # shellcheck disable=SC2086
    setsid java $jopts -cp "$cp" kafka.Kafka "$dir/server.properties" </dev/null >"$dir/stdout.log" 2>&1 &
    echo $! > "$dir/kafka.pid"
    echo "127.0.0.1:$port" > "$dir/bootstrap"
    local end=$(( $(date +%s) + ${KAFKA_START_TIMEOUT:-60} ))
    until python3 - "$port" <<'PY' 2>/dev/null
import socket, sys
socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=0.5).close()
PY
    do
        kill -0 "$(cat "$dir/kafka.pid")" 2>/dev/null || die "broker exited: $(tail -20 "$dir/stdout.log" "$dir/server.log" 2>/dev/null)"
        [ "$(date +%s)" -lt "$end" ] || die "broker did not listen within ${KAFKA_START_TIMEOUT:-60}s"
        sleep 0.3
    done
    log "Apache Kafka $KAFKA_VERSION (KRaft) on 127.0.0.1:$port, data in $dir"
    echo "bootstrap=127.0.0.1:$port"
}

stop() {
    local dir=${1:-$CACHE/run} pid
    [ -s "$dir/kafka.pid" ] || return 0
    pid=$(cat "$dir/kafka.pid")
    if kill -0 "$pid" 2>/dev/null; then
        kill "$pid"
        for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
    fi
    rm -f "$dir/kafka.pid"
    log "stopped"
}

case "${1:-}" in
    fetch) fetch ;;
    start) start "${2:-}" ;;
    stop) stop "${2:-}" ;;
    *) echo "usage: $0 fetch|start [DIR]|stop [DIR]" >&2; exit 2 ;;
esac
