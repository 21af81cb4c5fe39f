#!/bin/sh
# Install the Berth agent on a GPU host: user, virtualenv, config, systemd unit, enable.
#
#   sudo ./install.sh --api-url https://API --pool lab-a [--host-id NAME] [--executor process|docker|podman]
#                     [--region R] [--artifacts-bucket B --data-bucket B]
#                     [--wheels DIR] [--prefix /opt/berth-agent] [--no-start]
#
# --wheels DIR installs offline from a directory of wheels (pip --no-index); otherwise from the index.
# An existing /etc/berth-agent/config.yaml is never overwritten. ROOT=/some/dir installs into a
# staging tree instead of / (no user, no pip, no systemctl): used by the tests and by image builders.
set -eu

ROOT=${ROOT:-}
PREFIX=/opt/berth-agent
API_URL=
POOL=
HOST_ID=$(hostname -s 2>/dev/null || hostname)
EXECUTOR=process
REGION=us-east-1
ARTIFACTS_BUCKET=
DATA_BUCKET=
WHEELS=
START=yes
HERE=$(cd "$(dirname "$0")" && pwd)

die() { echo "install.sh: $*" >&2; exit 2; }

while [ $# -gt 0 ]; do
  case "$1" in
    --api-url) API_URL=$2; shift 2 ;;
    --pool) POOL=$2; shift 2 ;;
    --host-id) HOST_ID=$2; shift 2 ;;
    --executor) EXECUTOR=$2; shift 2 ;;
    --region) REGION=$2; shift 2 ;;
    --artifacts-bucket) ARTIFACTS_BUCKET=$2; shift 2 ;;
    --data-bucket) DATA_BUCKET=$2; shift 2 ;;
    --wheels) WHEELS=$2; shift 2 ;;
    --prefix) PREFIX=$2; shift 2 ;;
    --no-start) START=no; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *) die "unknown option $1" ;;
  esac
done
case "$EXECUTOR" in process|docker|podman|kubernetes) ;; *) die "--executor must be process, docker, podman or kubernetes" ;; esac
[ -n "$API_URL" ] || die "--api-url is required"
[ -n "$POOL" ] || die "--pool is required"

if [ -z "$ROOT" ]; then
  [ "$(id -u)" -eq 0 ] || die "run as root"
  if ! id berth-agent >/dev/null 2>&1; then
    useradd --system --home-dir /var/lib/berth-agent --no-create-home --shell /usr/sbin/nologin \
      --comment "Berth agent" berth-agent
  fi
  if [ "$EXECUTOR" = docker ] && getent group docker >/dev/null; then
    usermod -aG docker berth-agent
  fi
  python3 -m venv "$PREFIX"
  if [ -n "$WHEELS" ]; then
    "$PREFIX/bin/pip" install --no-index --find-links "$WHEELS" "berth[agent]"
  else
    "$PREFIX/bin/pip" install "berth[agent]"
  fi
fi

CONF="$ROOT/etc/berth-agent"
UNIT_DIR="$ROOT/etc/systemd/system"
install -d -m 0750 "$CONF"
# 0711: a process job (its own uid) may traverse to its own 0700 directory, never list the others.
install -d -m 0711 "$ROOT/var/lib/berth-agent" "$ROOT/var/lib/berth-agent/work" "$ROOT/var/cache/berth-agent"
if [ ! -e "$CONF/config.yaml" ]; then
  umask 027
  cat > "$CONF/config.yaml" <<YAML
# Berth agent configuration (docs/agent.md); BERTH_AGENT_* variables override any field.
api_url: $API_URL
region: $REGION
pool: $POOL
host_id: $HOST_ID
executor: $EXECUTOR
work_dir: /var/lib/berth-agent/work
cache_dir: /var/cache/berth-agent
cache_max_gib: 100
gpus:
  discovery: nvml
datasets: {}
drain_timeout_s: 3600
cancel_grace_s: 30
YAML
  if [ -n "$ARTIFACTS_BUCKET" ] && [ -n "$DATA_BUCKET" ]; then
    printf 'artifacts_bucket: %s\ndata_bucket: %s\n' "$ARTIFACTS_BUCKET" "$DATA_BUCKET" >> "$CONF/config.yaml"
  else
    printf '# artifacts_bucket: <the stack output>\n# data_bucket: <the stack output>\n' >> "$CONF/config.yaml"
  fi
fi
install -d -m 0755 "$UNIT_DIR" "$UNIT_DIR/berth-agent.service.d"
sed "s#/opt/berth-agent/bin/berth-agent#$PREFIX/bin/berth-agent#" "$HERE/berth-agent.service" \
  > "$UNIT_DIR/berth-agent.service"
chmod 0644 "$UNIT_DIR/berth-agent.service"
DROPIN="$UNIT_DIR/berth-agent.service.d/executor.conf"
case "$EXECUTOR" in
  process) cat > "$DROPIN" <<'UNIT'
# process executor: the agent gives each job a uid of its own, which needs root and these capabilities.
[Service]
User=root
Group=root
CapabilityBoundingSet=CAP_SETUID CAP_SETGID CAP_CHOWN CAP_FOWNER CAP_KILL CAP_DAC_OVERRIDE
UNIT
  ;;
  docker) cat > "$DROPIN" <<'UNIT'
# docker executor: the agent talks to the docker socket (root-equivalent; prefer podman).
[Service]
SupplementaryGroups=docker
UNIT
  ;;
  podman) cat > "$DROPIN" <<'UNIT'
# rootless podman: user namespaces for the containers.
[Service]
RestrictNamespaces=
UNIT
  ;;
  kubernetes) cat > "$DROPIN" <<'UNIT'
# kubernetes executor: the agent only talks to the cluster API; no local job processes.
[Service]
UNIT
  ;;
esac
chmod 0644 "$DROPIN"

if [ -z "$ROOT" ]; then
  chown -R root:berth-agent "$CONF"
  systemctl daemon-reload
  if [ "$START" = yes ]; then
    systemctl enable --now berth-agent.service
  else
    systemctl enable berth-agent.service
  fi
fi
echo "berth-agent installed (executor: $EXECUTOR, config: $CONF/config.yaml)"
