#!/usr/bin/env bash
# lightfed on a real Flower deployment, on loopback: one SuperLink + N SuperNodes, each its own process,
# then `flwr run .` for each method given; every process started here is stopped on exit (trap).
#
#   scripts/flower_deploy_demo.sh [options] METHOD[:KEY=VALUE...] ...
#     e.g. scripts/flower_deploy_demo.sh --check-local fedavg flite:rounds=1 fedspzo:rounds=1
#
#   --config FILE    lightfed run config (TOML, as `lightfed run --config`); default: tiny fmnist, 2 clients
#   --set KEY=VALUE  a run setting for every method (repeatable), e.g. --set rounds=2
#   --nodes N        SuperNodes to start (default: the config's `clients`); node k gets partition-id=k
#   --tls            TLS everywhere, with a CA and a certificate for 127.0.0.1 made here
#   --auth           SuperNode authentication: an EC P-384 key per node, registered with `flwr supernode register`
#   --check-local    also run each method on the in-process engine and require an identical result
#   --work DIR       logs, certificates and results (default: a new folder under /tmp, kept)
#   --faults SPEC    inject client faults (LIGHTFED_FLOWER_FAULTS, e.g. raise@1:0); see docs/flower.md
#   --disconnect K@R SIGKILL SuperNode K (with its children) once round R's message reached it
# Results: DIR/results/<method>/ (config.json, metrics.jsonl, summary.json), logs in DIR/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
BIN="$ROOT/.venv/bin"
PY="$BIN/python"

CONFIG="" NODES="" TLS=0 AUTH=0 CHECK=0 WORK="" FAULTS="" DISCONNECT=""
SETS=() SPECS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --config) CONFIG="$2"; shift 2 ;;
    --set) SETS+=(--set "$2"); shift 2 ;;
    --nodes) NODES="$2"; shift 2 ;;
    --tls) TLS=1; shift ;;
    --auth) AUTH=1; shift ;;
    --check-local) CHECK=1; shift ;;
    --work) WORK="$2"; shift 2 ;;
    --faults) FAULTS="$2"; shift 2 ;;
    --disconnect) DISCONNECT="$2"; shift 2 ;;
    -h|--help) sed -n 2,20p "$0"; exit 0 ;;
    -*) echo "unknown option $1" >&2; exit 2 ;;
    *) SPECS+=("$1"); shift ;;
  esac
done
[[ ${#SPECS[@]} -gt 0 ]] || SPECS=(fedavg)
WORK="${WORK:-$(mktemp -d /tmp/lightfed-flower-XXXXXX)}"
mkdir -p "$WORK"/{logs,results,runs,home}
WORK="$(cd "$WORK" && pwd)"

# offline, loopback only, nothing installed at run time (docs/flower.md)
export FLWR_HOME="$WORK/home" FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1 FLWR_DISABLE_UPDATE_CHECK=1 \
       FLWR_TELEMETRY_ENABLED=0 RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 RAY_USAGE_STATS_ENABLED=0 HF_HUB_OFFLINE=1 \
       PATH="$BIN:$PATH" LIGHTFED_FLOWER_FAULTS="$FAULTS"

PGIDS=()
descendants() { local c; for c in $(pgrep -P "$1" 2>/dev/null); do echo "$c"; descendants "$c"; done; }
running() { local st; st=$(ps -o stat= -p "$1" 2>/dev/null) && [[ $st != Z* ]]; }   # zombies do not count
stop_all() {   # SIGTERM to every process started here (their groups, and children that made their own), then SIGKILL
  local g p t pids=()
  for g in "${PGIDS[@]}"; do pids+=($(pgrep -g "$g" 2>/dev/null) $(descendants "$g")); done
  [[ ${#pids[@]} -gt 0 ]] || { PGIDS=(); return 0; }
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for t in $(seq 100); do                         # up to 20 s for a graceful exit
    local alive=0
    for p in "${pids[@]}"; do running "$p" && alive=1; done
    [[ $alive == 0 ]] && break
    sleep 0.2
  done
  for p in "${pids[@]}"; do running "$p" && kill -KILL "$p" 2>/dev/null || true; done
  PGIDS=()
}
trap stop_all EXIT
trap 'exit 130' INT TERM
start() {   # start LOGNAME CMD...: in its own process group (the group id is its pid), so its children stop too
  local name="$1"; shift
  setsid "$@" > "$WORK/logs/$name.log" 2>&1 &
  PGIDS+=($!)
}

if [[ -z "$CONFIG" ]]; then
  CONFIG="$WORK/base.toml"
  cat > "$CONFIG" <<'EOF'
task = "fmnist"
clients = 2
rounds = 2
fraction = 1.0
batch_size = 8
local_steps = 2
lr = 1e-3
[task_options]
tiny = true
train_size = 64
test_size = 32
EOF
fi
CLIENTS=$("$PY" -c "import sys; from lightfed import config as C; print(C.from_dict({}, C.load_toml(sys.argv[1])).clients)" "$CONFIG")
NODES="${NODES:-$CLIENTS}"
read -r -a PORTS <<< "$("$PY" - "$((NODES + 1))" <<'EOF'
import socket, sys
socks = [socket.socket() for _ in range(int(sys.argv[1]))]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(" ".join(str(s.getsockname()[1]) for s in socks))
EOF
)"
LINK="127.0.0.1:${PORTS[0]}"

LINK_SEC=(--insecure) NODE_SEC=(--insecure)
CONN="insecure = true"
if [[ $TLS == 1 ]]; then
  "$PY" - "$WORK/certs" <<'EOF'
import datetime, ipaddress, sys
from pathlib import Path
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
d = Path(sys.argv[1]); d.mkdir(parents=True, exist_ok=True)
now = datetime.datetime.now(datetime.timezone.utc)
def pem(key):
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
ca_key = ec.generate_private_key(ec.SECP384R1())
ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lightfed demo CA")])
ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
      .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(minutes=5))
      .not_valid_after(now + datetime.timedelta(days=1))
      .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))
key = ec.generate_private_key(ec.SECP384R1())
cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
        .issuer_name(ca_name).public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                    x509.DNSName("localhost")]), critical=False)
        .sign(ca_key, hashes.SHA256()))
(d / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
(d / "server.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
(d / "server.key").write_bytes(pem(key))
EOF
  LINK_SEC=(--ssl-ca-certfile "$WORK/certs/ca.crt" --ssl-certfile "$WORK/certs/server.pem" --ssl-keyfile "$WORK/certs/server.key")
  NODE_SEC=(--root-certificates "$WORK/certs/ca.crt")
  CONN="root-certificates = \"$WORK/certs/ca.crt\""
fi
[[ $AUTH == 1 ]] && LINK_SEC+=(--enable-supernode-auth)

cat > "$FLWR_HOME/config.toml" <<EOF
[superlink]
default = "deploy"

[superlink.deploy]
address = "$LINK"
$CONN
EOF

echo "lightfed: SuperLink on $LINK, $NODES SuperNodes, work folder $WORK" >&2
# state in memory (the default): SQLite (--database FILE) locked up here under load with ~90 MB messages
start superlink "$BIN/flower-superlink" "${LINK_SEC[@]}" --host 127.0.0.1 --port "${PORTS[0]}" \
  --disable-runtime-dependency-installation
SCHEME=http; CURL=(-fsS)
[[ $TLS == 1 ]] && SCHEME=https && CURL=(-fsS --cacert "$WORK/certs/ca.crt")
for _ in $(seq 300); do curl "${CURL[@]}" "$SCHEME://$LINK/health" > /dev/null 2>&1 && break; sleep 0.2; done
curl "${CURL[@]}" "$SCHEME://$LINK/health" > /dev/null || { echo "SuperLink did not come up; see $WORK/logs/superlink.log" >&2; exit 1; }

for ((k = 0; k < NODES; k++)); do
  AUTH_ARGS=()
  if [[ $AUTH == 1 ]]; then
    "$PY" - "$WORK/keys/node$k" <<'EOF'
import sys
from pathlib import Path
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
p = Path(sys.argv[1]); p.parent.mkdir(parents=True, exist_ok=True)
k = ec.generate_private_key(ec.SECP384R1())
p.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()))
p.chmod(0o600)
p.with_suffix(".pub").write_bytes(k.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH))
EOF
    "$BIN/flwr" supernode register "$WORK/keys/node$k.pub" deploy --name "node$k" >> "$WORK/logs/register.log" 2>&1
    AUTH_ARGS=(--auth-supernode-private-key "$WORK/keys/node$k")
  fi
  start "supernode$k" "$BIN/flower-supernode" "${NODE_SEC[@]}" "${AUTH_ARGS[@]}" --superlink "$LINK" \
    --host 127.0.0.1 --port "${PORTS[$((k + 1))]}" --node-config "partition-id=$k num-partitions=$NODES"
done

if [[ -n "$DISCONNECT" ]]; then   # a watcher: kills node K abruptly once it received round R's train message
  DK="${DISCONNECT%@*}" DR="${DISCONNECT#*@}" DG="${PGIDS[$((DK + 1))]}"
  (
    until grep -A2 "ROUND $DR\]" "$WORK/logs/supernode$DK.log" 2>/dev/null | grep -q "train message"; do sleep 0.2; done
    sleep 1
    kill -KILL $(pgrep -g "$DG") $(descendants "$DG") 2>/dev/null || true
    echo "lightfed: SuperNode $DK killed in round $DR" >&2
  ) &
  PGIDS+=($!)
fi

FAILED=0
for spec in "${SPECS[@]}"; do
  IFS=: read -r -a parts <<< "$spec"
  method="${parts[0]}"
  extra=(--set "method=$method")
  for kv in "${parts[@]:1}"; do extra+=(--set "$kv"); done
  "$PY" -m lightfed.engine.flower_app run-config "$CONFIG" "${SETS[@]}" "${extra[@]}" \
    --engine-opt client_threads=1 --engine-opt server_threads=1 --engine-opt node_wait=120 \
    --out "$WORK/results/$method" > "$WORK/runs/$method.toml"
  echo "lightfed: flwr run . deploy ($method)" >&2
  t0=$(date +%s)
  timeout 900 "$BIN/flwr" run . deploy --run-config "$WORK/runs/$method.toml" --stream \
    > "$WORK/logs/run-$method.log" 2>&1 || true
  # the log stream may end before the run does: wait until the SuperLink says the run is finished
  RUN_ID=$(grep -o "started run [0-9]*" "$WORK/logs/run-$method.log" | grep -o "[0-9]*$" || true)
  for _ in $(seq 900); do
    [[ -n "$RUN_ID" ]] || break
    "$BIN/flwr" ls deploy --run-id "$RUN_ID" --format json 2>/dev/null | grep -q '"finished' && break
    sleep 1
  done
  grep "^lightfed:" "$WORK/logs/run-$method.log" >&2 || true
  if [[ ! -f "$WORK/results/$method/summary.json" ]]; then
    echo "lightfed: $method: no summary.json; see $WORK/logs/" >&2; FAILED=1; continue
  fi
  echo "lightfed: $method done in $(( $(date +%s) - t0 )) s" >&2
  if [[ $CHECK == 1 ]]; then
    OMP_NUM_THREADS=1 "$BIN/lightfed" run --config "$CONFIG" "${SETS[@]}" "${extra[@]}" --no-progress \
      --out "$WORK/results/$method-local" > "$WORK/logs/local-$method.log" 2>&1
    "$PY" -m lightfed.engine.flower_app compare "$WORK/results/$method" "$WORK/results/$method-local" || FAILED=1
  fi
done
stop_all
echo "lightfed: all SuperLink/SuperNode processes stopped; results in $WORK/results" >&2
exit $FAILED
