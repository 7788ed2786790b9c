#!/usr/bin/env bash
# Builds the portal's browser bundle: the wasm hydrate entry, its JS glue and the CSS, into
# $CARGO_TARGET_DIR/site/pkg (engram.js, engram_bg.wasm, engram.css). Skips what is up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$HOME/.cache/engram/target}
# Plain wasm-bindgen naming (engram_bg.wasm): LEPTOS_OUTPUT_NAME must not be set at compile time.
unset LEPTOS_OUTPUT_NAME
site=$CARGO_TARGET_DIR/site/pkg
mkdir -p "$site"
cargo build -q -p frontend --lib --target wasm32-unknown-unknown --profile wasm-release
wasm=$CARGO_TARGET_DIR/wasm32-unknown-unknown/wasm-release/frontend.wasm
# Always (0.4 s): a timestamp check could keep a bundle another checkout wrote.
wasm-bindgen --target web --no-typescript --out-dir "$site" --out-name engram "$wasm"
cp style/main.css "$site/engram.css"
echo "portal bundle: $site ($(du -h "$site/engram_bg.wasm" | cut -f1) wasm)"
