#!/usr/bin/env bash
# Runs deploy/slurm/ps.sbatch on a one-node Slurm cluster started here:
# munged, slurmctld and slurmd (Debian's slurm-wlm and munge) with their
# key, sockets, state, spool and logs in a new temporary directory and
# free ports, so nothing of a Slurm installation on this machine is used
# or touched. Submits the CTR example on less data with `sbatch --wait` and
# checks that the job succeeded and its output ends with the trainer's
# JSON summary, with the model close to the oracle, and that the job made
# its keys and ran with security on (TLS and CURVE). Then a job whose
# launch.worker_command ({config_dir}/strict_worker.py) parses its arguments
# strictly and writes no summary must succeed as well.
#
# Needs root (slurmd starts job steps as the submitting user, which only
# root can do); skips itself with a message otherwise. Every daemon and job
# process it started is stopped on exit, whether the test passed or not.
set -euo pipefail
R="$TEST_SRCDIR/$TEST_WORKSPACE"

if [ "$(id -u)" -ne 0 ]; then
  echo "SKIPPED: slurm_test needs root to run slurmctld and slurmd (running as uid $(id -u))"
  exit 0
fi
# The daemons live in sbin, which the test environment's PATH leaves out.
export PATH="$PATH:/usr/sbin:/sbin"
for c in munged munge slurmctld slurmd sbatch sinfo scancel; do
  command -v "$c" >/dev/null || {
    echo "FAIL: $c not found; deploy/install_deps.sh installs slurm-wlm and munge"; exit 1; }
done

# A short path: the munge socket's path must fit in sockaddr_un.
D="$(mktemp -d /tmp/ps-slurm.XXXXXX)"
chmod 700 "$D"
# Every process started below (daemons, sbatch, the job's tasks) carries
# this variable, so cleanup finds exactly those, also the ones slurmd
# detaches (slurmstepd).
MARK="PS_SLURM_TEST_MARK=$D"
DAEMON_PIDS=()

# Prints the pids of live processes carrying $MARK, except this shell.
marked_pids() {
  local f pid
  for f in /proc/[0-9]*/environ; do
    pid="${f#/proc/}"; pid="${pid%/environ}"
    [ "$pid" = "$$" ] && continue
    { tr '\0' '\n' < "$f"; } 2>/dev/null | grep -qxF "$MARK" && echo "$pid"
  done
  return 0
}

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  set +e
  if [ "$status" -ne 0 ]; then
    for f in "$D"/job.out "$D"/log/*.log "$D"/*.out; do
      [ -f "$f" ] || continue
      echo "---- last lines of $f"
      tail -n 30 "$f"
    done
  fi
  [ -n "${SLURM_CONF:-}" ] && timeout 10 scancel --full --quiet --user=root >/dev/null 2>&1
  for pid in "${DAEMON_PIDS[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  for _ in $(seq 50); do
    [ -z "$(marked_pids)" ] && break
    sleep 0.1
  done
  local left
  left="$(marked_pids)"
  if [ -n "$left" ]; then
    echo "cleanup: killing leftover processes $left"
    # shellcheck disable=SC2086
    kill -KILL $left 2>/dev/null
  fi
  for pid in "${DAEMON_PIDS[@]}"; do wait "$pid" 2>/dev/null; done
  if [ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]; then
    cp -r "$D/log" "$D/job.out" "$TEST_UNDECLARED_OUTPUTS_DIR/" 2>/dev/null
  fi
  rm -rf "$D"
  exit "$status"
}
trap cleanup EXIT
trap 'echo "slurm_test: interrupted"; exit 130' INT TERM

fail() { echo "FAIL: $*"; exit 1; }

# Two free TCP ports for slurmctld and slurmd.
read -r CTLD_PORT SLURMD_PORT < <(/usr/bin/python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')

NODE="$(hostname -s)"
mkdir -p "$D/munge" "$D/state" "$D/spool" "$D/log" "$D/bin" "$D/run"
chmod 700 "$D/munge"
head -c 1024 /dev/urandom > "$D/munge/munge.key"
chmod 400 "$D/munge/munge.key"
SOCKET="$D/munge/munge.socket"

# Slurm's own hardware check would drain a node declared with more CPUs
# than this machine has; config_overrides trusts the declaration, so the
# job's 5 tasks fit on a 2-core machine.
cat > "$D/slurm.conf" <<EOF
ClusterName=pstest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
AuthType=auth/munge
AuthInfo=socket=$SOCKET
CredType=cred/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/log/slurmctld.log
SlurmdLogFile=$D/log/slurmd.log
MailProg=/bin/true
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=8 State=UNKNOWN
PartitionName=pstest Nodes=$NODE Default=YES MaxTime=INFINITE State=UP
EOF
export SLURM_CONF="$D/slurm.conf"

env "$MARK" munged --foreground --force --socket="$SOCKET" \
  --key-file="$D/munge/munge.key" --log-file="$D/log/munged.log" \
  --pid-file="$D/munge/munged.pid" --seed-file="$D/munge/munged.seed" \
  > "$D/munged.out" 2>&1 &
DAEMON_PIDS+=($!)
for _ in $(seq 100); do [ -S "$SOCKET" ] && break; sleep 0.1; done
munge --socket="$SOCKET" --no-input | unmunge --socket="$SOCKET" >/dev/null \
  || fail "munged does not answer"

env "$MARK" slurmctld -D -f "$SLURM_CONF" > "$D/slurmctld.out" 2>&1 &
DAEMON_PIDS+=($!)
env "$MARK" slurmd -D -f "$SLURM_CONF" -N "$NODE" > "$D/slurmd.out" 2>&1 &
DAEMON_PIDS+=($!)
state=""
for _ in $(seq 300); do
  state="$(sinfo --noheader --format=%t 2>/dev/null || true)"
  [ "$state" = "idle" ] && break
  sleep 0.1
done
[ "$state" = "idle" ] || fail "the Slurm node is not idle after 30 s (state '$state')"
echo "slurm: controller on port $CTLD_PORT, node $NODE idle"

cp "$R/scheduler/scheduler_main" "$R/server/server_main" "$R/worker/trainer" \
  "$R/deploy/security/make_job_keys" "$R/deploy/security/curve_keygen" \
  "$R/deploy/choose_python.sh" "$R/deploy/python_probe.py" "$D/bin/"
CONFIG="$D/small.pbtxt"
sed -e 's/num_train: 1000000/num_train: 200000/' \
    -e 's/num_test: 100000/num_test: 50000/' \
    "$R/examples/ctr/async.pbtxt" > "$CONFIG"
grep -q "num_train: 200000" "$CONFIG" || fail "could not shrink the config"

# The servers advertise the node's host name, as on a real cluster, when
# it resolves here.
HOST_ENV=()
getent hosts "$(hostname)" >/dev/null || HOST_ENV=(PS_HOST=127.0.0.1)

status=0
(cd "$D" && env "$MARK" PS_BIN_DIR="$D/bin" PS_RUN_DIR="$D/run" "${HOST_ENV[@]}" \
   timeout 200 sbatch --wait --ntasks=5 --time=3 --output="$D/job.out" \
   "$R/deploy/slurm/ps.sbatch" "$CONFIG") || status=$?
[ "$status" -eq 0 ] || fail "sbatch --wait exited $status"

# The config has no security block: the job made its keys and ran with
# mutual TLS and CURVE, refusing no one.
grep -q "ps: security on (mutual TLS, CURVE; keys in $D/run/keys)" "$D/job.out" ||
  fail "the job did not turn security on"
[ "$(stat -c %a "$D/run/keys/job.key")" = "600" ] || fail "job.key is not mode 0600"
grep -q "serving .* (CURVE)" "$D/job.out" || fail "no server served CURVE"
if grep -q "peer refused\|refused a data-plane connection" "$D/job.out"; then
  fail "a process refused a peer of its own job"
fi
SUMMARY="$(tail -n 1 "$D/job.out")"
echo "summary: $SUMMARY"
field() { echo "$SUMMARY" | sed -n "s/.*\"$1\":\([^,}]*\).*/\1/p" | tr -d '"'; }
[ "$(field mode)" = "ASYNC" ] || fail "the last line is not an ASYNC job summary"
[ "$(field workers)" = "2" ] && [ "$(field servers)" = "2" ] || fail "wrong counts"
[ "$(field rank0_examples)" = "300000" ] || fail "wrong example count"
[ "$(grep -c "registered as server" "$D/job.out")" -eq 2 ] || fail "not 2 servers registered"
grep -q "job finished; exiting" "$D/job.out" || fail "the scheduler did not see the job finish"
auc="$(field test_auc)"; oracle="$(field oracle_auc)"
# Integer arithmetic on AUC x 100000: the gap must be under 0.01.
gap=$(( $(printf '%.0f' "$(echo "$oracle" | tr -d .)") - $(printf '%.0f' "$(echo "$auc" | tr -d .)") ))
echo "AUC gap x 1e5: $gap"
[ "$gap" -lt 1000 ] || fail "test AUC $auc is not within 0.01 of oracle $oracle"

# The job's own worker command beside its config: it gets --config and
# --scheduler, nothing else (argparse refuses anything more), and
# PS_SUMMARY_OUT; it writes no summary, and the job succeeds.
mkdir -p "$D/strict"
cp "$R/tests/testing/strict_worker.py" "$D/strict/"
STRICT="$D/strict/job.pbtxt"
sed -e 's/num_train: 1000000/num_train: 40000/' -e 's/num_test: 100000/num_test: 10000/' \
  "$R/examples/ctr/async.pbtxt" > "$STRICT"
echo "launch { worker_command: [\"python3\", \"{config_dir}/strict_worker.py\", \"--trainer\", \"$D/bin/trainer\"] }" >> "$STRICT"
status=0
(cd "$D" && env "$MARK" PS_BIN_DIR="$D/bin" PS_RUN_DIR="$D/run-strict" "${HOST_ENV[@]}" \
   timeout 200 sbatch --wait --ntasks=5 --time=3 --output="$D/strict.out" \
   "$R/deploy/slurm/ps.sbatch" "$STRICT") || status=$?
[ "$status" -eq 0 ] || fail "sbatch --wait of the strict worker command exited $status"
[ "$(grep -c "strict_worker: .* PS_SUMMARY_OUT=$D/run-strict/summary.json" "$D/strict.out")" -eq 2 ] ||
  fail "the 2 workers' command was not run with PS_SUMMARY_OUT"
[ ! -e "$D/run-strict/summary.json" ] || fail "a summary was written"
grep -q "ps: finished; no summary" "$D/strict.out" || fail "the job did not say that no summary was written"
echo PASS
