#!/usr/bin/env bash
# The whole suite: setup, Rust tests against the real PostgreSQL (a database per test), then the
# Playwright suite in Debian's Chromium against a server this script starts and stops.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=$HOME/.cargo/bin:$PATH
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/engram/target}
export SQLX_OFFLINE=true
unset DATABASE_URL
ENGRAM_SETUP_BROWSER=1 bash scripts/setup.sh

admin_url=${ENGRAM_TEST_ADMIN_URL:-postgres://engram:engram@127.0.0.1:5432/postgres}
export ENGRAM_TEST_ADMIN_URL=$admin_url
export ENGRAM_MODEL_DIR=${ENGRAM_MODEL_DIR:-$PWD/models/all-MiniLM-L6-v2}

# Databases left by an earlier, interrupted run.
for db in $(psql "$admin_url" -Atc "select datname from pg_database where datname like 'engram_test_%'"); do
  psql "$admin_url" -qc "drop database if exists \"$db\" with (force)" >/dev/null
done

echo "== Rust tests"
cargo build -q -p server --bin engram
cargo nextest run -p server -p app -p kernels --features app/ssr --no-fail-fast

echo "== Portal bundle"
bash scripts/build-site.sh
# A free port, so a server left running elsewhere is never mistaken for ours.
port=${ENGRAM_E2E_PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
# The stand-in upstream LLM the proxy's client and browser tests talk to (see server::standin).
standin_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
"$CARGO_TARGET_DIR/debug/engram" stand-in-llm --bind 127.0.0.1:$standin_port >"$CARGO_TARGET_DIR/e2e-standin.log" 2>&1 &
standin_pid=$!
export ENGRAM_STANDIN_URL=http://127.0.0.1:$standin_port/v1
db=engram_e2e
psql "$admin_url" -qc "drop database if exists $db with (force)" -c "create database $db" >/dev/null
log=$CARGO_TARGET_DIR/e2e-server.log
DATABASE_URL=postgres://engram:engram@127.0.0.1:5432/$db ENGRAM_BIND=127.0.0.1:$port \
  ENGRAM_SITE_ROOT=$CARGO_TARGET_DIR/site ENGRAM_RATE_REGISTER_PER_HOUR=1000 \
  ENGRAM_RATE_AUTO_REGISTER_PER_HOUR=1000 ENGRAM_RATE_MODELS_PER_MIN=10000 ENGRAM_RATE_API_PER_MIN=100000 ENGRAM_LOG=info \
  ENGRAM_UPSTREAM_ALLOWED_HOSTS=127.0.0.1 ENGRAM_UPSTREAM_TIMEOUT_SECS=10 \
  ENGRAM_BILLING_WEBHOOK_SECRET=whsec_engram_e2e ENGRAM_BILLING_CONTACT=ops@example.com \
  "$CARGO_TARGET_DIR/debug/engram" serve >"$log" 2>&1 &
server_pid=$!
trap 'kill $server_pid $standin_pid 2>/dev/null || true; wait $server_pid $standin_pid 2>/dev/null || true' EXIT
for _ in $(seq 120); do
  curl -fs "http://127.0.0.1:$port/api/ready" >/dev/null && break
  kill -0 $server_pid 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.5
done
curl -fs "http://127.0.0.1:$port/api/ready" >/dev/null && kill -0 $server_pid 2>/dev/null || { echo "server did not become ready"; tail -50 "$log"; exit 1; }
echo "== Client tests (MCP's, MemoryX's and OpenAI's official SDKs against the live server)"
ENGRAM_BASE_URL=http://127.0.0.1:$port "${ENGRAM_CACHE:-$HOME/.cache/engram}/venv/bin/python" -m pytest -q -p no:cacheprovider end2end/clients \
  || { echo "--- server log (tail)"; tail -40 "$log"; exit 1; }
echo "== Browser tests"
(cd end2end && ENGRAM_BASE_URL=http://127.0.0.1:$port ENGRAM_BIN="$CARGO_TARGET_DIR/debug/engram" \
  ENGRAM_E2E_DATABASE_URL=postgres://engram:engram@127.0.0.1:5432/$db npx playwright test) || { echo "--- server log (tail)"; tail -40 "$log"; exit 1; }
echo "== API fuzzing (schemathesis against /api/openapi.json)"
bash end2end/fuzz/run.sh "http://127.0.0.1:$port" || { echo "--- server log (tail)"; tail -40 "$log"; exit 1; }
