#!/usr/bin/env bash
# Single-host Ceph cluster with an S3 endpoint (radosgw) on 127.0.0.1, for CI and tests.
#
#   bash .ci/ceph.sh start      install packages if missing, build and start the cluster, write $DIR/s3.env
#   bash .ci/ceph.sh stop       stop every daemon of this cluster (data is lost: the OSD is memstore)
#   bash .ci/ceph.sh stop-rgw   stop radosgw only (simulates an S3 outage; data stays in the OSD)
#   bash .ci/ceph.sh start-rgw  start radosgw again and wait until it answers
#   bash .ci/ceph.sh status     print whether the cluster and the endpoint are up (exit 0 when up)
#
# Environment:
#   DATAHUB_CEPH_DIR   state dir (config, keyrings, mon/mgr/osd data, logs), default /tmp/datahub-ceph
#   DATAHUB_CEPH_PORT  S3 port on 127.0.0.1, default 7480
#
# One mon, one mgr, one memstore OSD (pool size 1) and one radosgw, all bound to 127.0.0.1.
# cephx is on: radosgw cannot log in with auth none (error -13), see /work/shared/DESIGN.md.
set -euo pipefail

DIR="${DATAHUB_CEPH_DIR:-/tmp/datahub-ceph}"
PORT="${DATAHUB_CEPH_PORT:-7480}"
CONF="$DIR/ceph.conf"
MARKER="$DIR/.datahub-ceph"
ENV_FILE="$DIR/s3.env"
LOCK_FILE="${DIR%/}.lock"
ENDPOINT="http://127.0.0.1:$PORT"
REGION="us-east-1"
# Fixed test credentials: this cluster only listens on loopback and holds throwaway data.
S3_UID="datahub"
S3_ACCESS_KEY="DATAHUBTESTACCESSKEY"
S3_SECRET_KEY="datahubTestSecretKey0000000000000000000000"
MEMSTORE_BYTES=$((4 * 1024 * 1024 * 1024))
PACKAGES=(ceph-mon ceph-osd ceph-mgr radosgw ceph-common)
DAEMONS=(mon.a mgr.x osd.0 client.rgw.a)
START_TIMEOUT_S=120

log() { printf '[ceph.sh] %s\n' "$*" >&2; }

die() {
    log "ERROR: $*"
    if [[ -d "$DIR/log" ]]; then
        local f
        for f in "$DIR"/log/{mon.a,mgr.x,osd.0-mkfs,osd.0,client.rgw.a}.{log,out}; do
            [[ -s "$f" ]] || continue
            log "---- last lines of $f ----"
            tail -n 12 "$f" >&2 || true
        done
    fi
    exit 1
}

ceph_cli() { timeout 60 ceph -c "$CONF" --connect-timeout 15 "$@"; }

install_packages() {
    local missing=0 bin
    for bin in ceph-mon ceph-osd ceph-mgr radosgw ceph ceph-authtool monmaptool radosgw-admin curl; do
        command -v "$bin" >/dev/null 2>&1 || missing=1
    done
    ((missing == 0)) && return 0
    [[ "$(id -u)" == 0 ]] || die "Ceph packages are missing and installing them needs root: apt-get install ${PACKAGES[*]}"
    log "installing ${PACKAGES[*]} (apt-get)"
    apt-get update -qq >/dev/null || die "apt-get update failed"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${PACKAGES[@]}" curl >/dev/null \
        || die "apt-get install ${PACKAGES[*]} failed"
}

pid_of() { # daemon name -> pid if that daemon runs, else nothing
    local f="$DIR/run/$1.pid" pid
    [[ -s "$f" ]] || return 1
    pid="$(<"$f")"
    [[ "$pid" =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null || return 1
    # A stale pid file may point at an unrelated process that reused the pid.
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$CONF" || return 1
    echo "$pid"
}

s3_answers() { # true when radosgw answers an S3 request (anonymous ListBuckets answers 200)
    local code
    code="$(curl -s -o /dev/null -w '%{http_code}' --max-time 3 "$ENDPOINT/" 2>/dev/null)" || return 1
    [[ "$code" == 200 || "$code" == 403 ]]
}

all_running() {
    local d
    for d in "${DAEMONS[@]}"; do pid_of "$d" >/dev/null || return 1; done
}

stop_daemon() { # daemon name: SIGTERM, then SIGKILL after 10 s
    local pid i
    pid="$(pid_of "$1")" || { rm -f "$DIR/run/$1.pid"; return 0; }
    kill -TERM "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        log "$1 (pid $pid) ignored SIGTERM for 10 s, sending SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        sleep 0.5
    fi
    rm -f "$DIR/run/$1.pid"
}

stop_all() {
    local d pid
    for d in client.rgw.a osd.0 mgr.x mon.a; do stop_daemon "$d"; done
    # Daemons that lost their pid file are still found by the config path on their command line;
    # this only matches processes of this state dir, never another cluster.
    for pid in $(pgrep -f -- "-c $CONF( |$)" || true); do
        [[ "$pid" == "$$" ]] && continue
        log "killing leftover process $pid ($(tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | cut -c1-80))"
        kill -KILL "$pid" 2>/dev/null || true
    done
    rm -f "$ENV_FILE"
}

launch() { # daemon name, command...: start a daemon that forks into the background
    local name="$1"
    shift
    # 9>&-: the daemon must not inherit the lock, or every later command would wait for it.
    "$@" 9>&- </dev/null >>"$DIR/log/$name.out" 2>&1
}

wait_for() { # seconds description command...: poll until command succeeds
    local seconds="$1" what="$2" deadline
    shift 2
    deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || die "timed out after ${seconds}s waiting for $what"
        sleep 0.5
    done
}

write_conf() {
    local fsid="$1"
    cat >"$CONF" <<EOF
# Written by .ci/ceph.sh: a throwaway single-host test cluster on 127.0.0.1.
[global]
fsid = $fsid
mon initial members = a
mon host = [v2:127.0.0.1:3300,v1:127.0.0.1:6789]
public addr = 127.0.0.1
public network = 127.0.0.0/8
ms bind ipv4 = true
ms bind ipv6 = false
auth cluster required = cephx
auth service required = cephx
auth client required = cephx
keyring = $DIR/keys/\$name.keyring
run dir = $DIR/run
pid file = $DIR/run/\$name.pid
admin socket = $DIR/run/\$name.asok
log file = $DIR/log/\$name.log
mon cluster log file = $DIR/log/cluster.log
crash dir = $DIR/crash
exec dir = $DIR/run
# One OSD: replicas of size 1, small pools, no autoscaler churn.
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
mon warn on insecure global id reclaim allowed = false
# /tmp may be on a nearly full disk; the mon refuses to run below mon data avail crit (default 5 %).
mon data avail crit = 1
mon data avail warn = 2

[mon]
mon data = $DIR/mon/ceph-\$id

[mgr]
mgr data = $DIR/mgr/ceph-\$id

[osd]
osd data = $DIR/osd/ceph-\$id
osd objectstore = memstore
memstore device bytes = $MEMSTORE_BYTES

[client.rgw.a]
rgw frontends = beast endpoint=127.0.0.1:$PORT
rgw data = $DIR/rgw/ceph-a
EOF
}

build_cluster() {
    local fsid osd_uuid osd_id
    if [[ -e "$DIR" && ! -e "$MARKER" && -n "$(ls -A "$DIR" 2>/dev/null)" ]]; then
        die "$DIR exists, is not empty and was not made by .ci/ceph.sh; refusing to wipe it (set DATAHUB_CEPH_DIR)"
    fi
    rm -rf "$DIR"
    mkdir -p "$DIR"/{keys,run,log,crash,mon/ceph-a,mgr/ceph-x,osd/ceph-0,rgw/ceph-a}
    touch "$MARKER"
    fsid="$(cat /proc/sys/kernel/random/uuid)"
    write_conf "$fsid"

    log "creating keyrings and the monitor"
    ceph-authtool --create-keyring "$DIR/keys/mon.keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
    ceph-authtool --create-keyring "$DIR/keys/client.admin.keyring" --gen-key -n client.admin \
        --cap mon 'allow *' --cap osd 'allow *' --cap mds 'allow *' --cap mgr 'allow *' >/dev/null
    cp "$DIR/keys/mon.keyring" "$DIR/keys/mon.a.keyring"
    ceph-authtool "$DIR/keys/mon.a.keyring" --import-keyring "$DIR/keys/client.admin.keyring" >/dev/null
    monmaptool --create --fsid "$fsid" --addv a '[v2:127.0.0.1:3300,v1:127.0.0.1:6789]' \
        "$DIR/monmap" >/dev/null
    ceph-mon -c "$CONF" --mkfs -i a --monmap "$DIR/monmap" --keyring "$DIR/keys/mon.a.keyring" \
        || die "ceph-mon --mkfs failed"
    launch mon.a ceph-mon -c "$CONF" -i a || die "ceph-mon failed to start"
    wait_for 30 "the monitor to form a quorum" ceph_cli mon stat

    log "starting mgr"
    ceph_cli auth get-or-create mgr.x mon 'allow profile mgr' osd 'allow *' mds 'allow *' \
        -o "$DIR/keys/mgr.x.keyring" || die "creating the mgr key failed"
    launch mgr.x ceph-mgr -c "$CONF" -i x || die "ceph-mgr failed to start"

    log "creating the memstore OSD"
    osd_uuid="$(cat /proc/sys/kernel/random/uuid)"
    osd_id="$(ceph_cli osd new "$osd_uuid")" || die "ceph osd new failed"
    [[ "$osd_id" == 0 ]] || die "expected OSD id 0, the monitor gave $osd_id"
    ceph_cli auth get-or-create osd.0 mon 'allow profile osd' mgr 'allow profile osd' osd 'allow *' \
        -o "$DIR/keys/osd.0.keyring" || die "creating the osd key failed"
    ceph-osd -c "$CONF" -i 0 --mkfs --osd-uuid "$osd_uuid" >"$DIR/log/osd.0-mkfs.log" 2>&1 \
        || die "ceph-osd --mkfs failed (see $DIR/log/osd.0-mkfs.log)"
    launch osd.0 ceph-osd -c "$CONF" -i 0 || die "ceph-osd failed to start"
    wait_for 60 "osd.0 to come up" osd_is_up

    log "creating the radosgw key"
    ceph_cli auth get-or-create client.rgw.a mon 'allow rw' osd 'allow rwx' mgr 'allow rw' \
        -o "$DIR/keys/client.rgw.a.keyring" || die "creating the radosgw key failed"
}

osd_is_up() { ceph_cli osd stat -f json 2>/dev/null | grep -q '"num_up_osds":1'; }

start_rgw() {
    if pid_of client.rgw.a >/dev/null; then
        wait_for "$START_TIMEOUT_S" "radosgw to answer on $ENDPOINT" s3_answers
        return 0
    fi
    if s3_answers; then
        die "something else already answers on $ENDPOINT; free port $PORT or set DATAHUB_CEPH_PORT"
    fi
    pid_of osd.0 >/dev/null && pid_of mon.a >/dev/null \
        || die "the cluster is not running; run: bash .ci/ceph.sh start"
    log "starting radosgw on $ENDPOINT"
    launch client.rgw.a radosgw -c "$CONF" -n client.rgw.a || die "radosgw failed to start"
    wait_for "$START_TIMEOUT_S" "radosgw to answer on $ENDPOINT" s3_answers
}

configure_rgw() { # the S3 user and the zonegroup API name; radosgw-admin works on RADOS, radosgw need not run
    # The first radosgw-admin call also creates the default realm-less zonegroup and zone.
    if ! timeout 60 radosgw-admin -c "$CONF" user info --uid "$S3_UID" >/dev/null 2>&1; then
        timeout 60 radosgw-admin -c "$CONF" user create --uid "$S3_UID" --display-name "$S3_UID" \
            --access-key "$S3_ACCESS_KEY" --secret-key "$S3_SECRET_KEY" >/dev/null \
            || die "radosgw-admin user create failed"
    fi
    # s3fs sends CreateBucketConfiguration LocationConstraint=<region> whenever a region is set, and radosgw
    # accepts only its zonegroup's API name ("default" out of the box): name it after the test region.
    timeout 60 radosgw-admin -c "$CONF" zonegroup modify --rgw-zonegroup default --api-name "$REGION" \
        >/dev/null || die "radosgw-admin zonegroup modify --api-name $REGION failed"
}

write_env_file() {
    cat >"$ENV_FILE.tmp" <<EOF
DATAHUB_TEST_S3_ENDPOINT=$ENDPOINT
DATAHUB_TEST_S3_KEY=$S3_ACCESS_KEY
DATAHUB_TEST_S3_SECRET=$S3_SECRET_KEY
DATAHUB_TEST_S3_REGION=$REGION
EOF
    mv "$ENV_FILE.tmp" "$ENV_FILE"
}

cmd_start() {
    local began=$SECONDS
    if all_running && s3_answers && [[ -s "$ENV_FILE" ]]; then
        log "already running: $ENDPOINT (env file $ENV_FILE)"
        return 0
    fi
    # Only radosgw is down (an outage a test made, or a crash): start it alone, never wipe the OSD's data.
    if [[ -s "$ENV_FILE" ]] && pid_of mon.a >/dev/null && pid_of mgr.x >/dev/null && pid_of osd.0 >/dev/null \
        && ! pid_of client.rgw.a >/dev/null && ! s3_answers; then
        start_rgw
        log "radosgw restarted in $((SECONDS - began))s: $ENDPOINT (env file $ENV_FILE)"
        return 0
    fi
    install_packages
    [[ "$(id -u)" == 0 ]] || die "start needs root (the daemons run as root from $DIR)"
    if s3_answers && ! pid_of client.rgw.a >/dev/null; then
        die "something else already answers on $ENDPOINT; free port $PORT or set DATAHUB_CEPH_PORT"
    fi
    # Memstore keeps data in RAM, so a half-running or stopped cluster is rebuilt from scratch.
    if [[ -e "$MARKER" ]]; then stop_all; fi
    build_cluster
    configure_rgw
    start_rgw
    write_env_file
    log "up in $((SECONDS - began))s: $ENDPOINT (env file $ENV_FILE)"
}

cmd_status() {
    local d pid up=0
    for d in "${DAEMONS[@]}"; do
        if pid="$(pid_of "$d")"; then echo "$d: running (pid $pid)"; else echo "$d: stopped"; up=1; fi
    done
    if s3_answers; then echo "s3: $ENDPOINT answers"; else echo "s3: $ENDPOINT does not answer"; up=1; fi
    if ((up == 0)); then echo "ceph: up"; else echo "ceph: down"; fi
    return "$up"
}

main() {
    local cmd="${1:-}"
    case "$cmd" in
    start | stop | stop-rgw | start-rgw) ;;
    status)
        cmd_status
        return
        ;;
    *)
        echo "usage: bash .ci/ceph.sh start|stop|stop-rgw|start-rgw|status" >&2
        return 2
        ;;
    esac
    mkdir -p "$(dirname "$LOCK_FILE")"
    # One command at a time per state dir (e.g. several pytest workers calling start at once).
    exec 9>"$LOCK_FILE"
    if ! flock -w 300 9; then
        log "ERROR: another .ci/ceph.sh has held $LOCK_FILE for more than 300 s"
        exit 1
    fi
    case "$cmd" in
    start) cmd_start ;;
    stop)
        stop_all
        log "stopped"
        ;;
    stop-rgw)
        stop_daemon client.rgw.a
        log "radosgw stopped"
        ;;
    start-rgw)
        start_rgw
        log "radosgw up: $ENDPOINT"
        ;;
    esac
}

main "$@"
