#!/usr/bin/env bash
# Installs what tests/editors/test_vscode.py needs to run the codespec VS Code extension inside a
# real VS Code: code-server 4.100.3 (VS Code 1.100.3, the newest code-server that runs on Node 20)
# from the npm registry, Debian's chromium and ripgrep, Python's playwright (driving that chromium;
# no browser is downloaded), and the extension's own dependencies plus @vscode/vsce to package it.
#
# Everything goes into a cache folder: $CODESPEC_EDITORS_DIR, default ~/.cache/codespec-editors.
# Idempotent: each step leaves a stamp and is skipped on the next run (a second run takes seconds).
# Non-interactive, for root on Debian 12 (what CI runs on); uses only the npm registry, PyPI and
# Debian's archive. Exits non-zero when a step really fails.
#
#   bash tests/editors/setup_vscode.sh           # then: python3 -m pytest -m editors tests/editors
set -euo pipefail

CODE_SERVER_VERSION=4.100.3
VSCE_VERSION=3.6.0
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
EXT_SRC="$REPO/editors/vscode"
HOME_DIR="${HOME:-$(getent passwd "$(id -u)" | cut -d: -f6)}"
DIR="${CODESPEC_EDITORS_DIR:-$HOME_DIR/.cache/codespec-editors}"
PYTHON="${PYTHON:-python3}"
export DEBIAN_FRONTEND=noninteractive
# node-gyp builds against the installed Node's headers (/usr/include/node) instead of fetching them
export npm_config_nodedir="${npm_config_nodedir:-/usr}"
export npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false

say() { echo "[setup_vscode] $*"; }
die() { echo "[setup_vscode] ERROR: $*" >&2; exit 1; }
# stamp NAME: has step NAME finished (for this version)?  done_ NAME: mark it finished
stamp() { [ -f "$DIR/stamps/$1" ]; }
done_() { mkdir -p "$DIR/stamps"; touch "$DIR/stamps/$1"; }

mkdir -p "$DIR"
say "cache folder: $DIR"

# --- Debian packages: chromium (the browser playwright drives), ripgrep (VS Code's search) -------
need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v rg >/dev/null 2>&1 || need_apt+=(ripgrep)
command -v make >/dev/null 2>&1 && command -v g++ >/dev/null 2>&1 || need_apt+=(build-essential)
command -v python3 >/dev/null 2>&1 || need_apt+=(python3)  # node-gyp runs python3
if [ "${#need_apt[@]}" -gt 0 ]; then
  [ "$(id -u)" = 0 ] || die "need root to apt-get install ${need_apt[*]}"
  say "apt-get install ${need_apt[*]}"
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${need_apt[@]}"
else
  say "chromium, ripgrep and a C++ toolchain already installed"
fi
command -v chromium >/dev/null || die "chromium is not on PATH after apt-get install"
# Node 20 with its headers comes with the machine (Debian's own nodejs is 18: too old)
command -v node >/dev/null && command -v npm >/dev/null || die "node and npm (Node 20) are needed"
NODE_MAJOR="$(node -p 'process.versions.node.split(".")[0]')"
[ "$NODE_MAJOR" = 20 ] || die "code-server $CODE_SERVER_VERSION needs Node 20, found $(node --version)"
[ -f "$npm_config_nodedir/include/node/node_api.h" ] || \
  die "no Node headers in $npm_config_nodedir/include/node (node-gyp needs them; set npm_config_nodedir)"

# --- playwright (Python) ------------------------------------------------------------------------
if "$PYTHON" -c 'import playwright.sync_api' 2>/dev/null; then
  say "playwright already importable by $PYTHON"
else
  say "$PYTHON -m pip install playwright (the browser is Debian's chromium: none is downloaded)"
  "$PYTHON" -m pip install -q "playwright==1.65.2"   # known to drive Debian 12's chromium 156
fi

# --- code-server from the npm registry, with its postinstall done by hand -----------------------
# (its install script refuses root and its ripgrep step downloads from outside the registries)
CS_ROOT="$DIR/code-server-$CODE_SERVER_VERSION"
CS="$CS_ROOT/node_modules/code-server"
VSC="$CS/lib/vscode"
if ! stamp "code-server-$CODE_SERVER_VERSION-npm"; then
  say "npm install code-server@$CODE_SERVER_VERSION --ignore-scripts  (into $CS_ROOT)"
  mkdir -p "$CS_ROOT"
  (cd "$CS_ROOT" && [ -f package.json ] || echo '{"name":"codespec-editors","private":true}' > package.json)
  (cd "$CS_ROOT" && npm install --no-save --ignore-scripts "code-server@$CODE_SERVER_VERSION")
  done_ "code-server-$CODE_SERVER_VERSION-npm"
fi
if ! stamp "code-server-$CODE_SERVER_VERSION-argon2"; then
  say "npm rebuild argon2 --build-from-source  (no prebuilt download)"
  (cd "$CS_ROOT" && npm_config_build_from_source=true npm rebuild argon2)
  done_ "code-server-$CODE_SERVER_VERSION-argon2"
fi
if ! stamp "code-server-$CODE_SERVER_VERSION-vscode-deps"; then
  say "lib/vscode: npm install --omit=dev --ignore-scripts"
  (cd "$VSC" && npm install --omit=dev --ignore-scripts)
  done_ "code-server-$CODE_SERVER_VERSION-vscode-deps"
fi
if ! stamp "code-server-$CODE_SERVER_VERSION-native"; then
  for module in @vscode/spdlog node-pty native-watchdog @vscode/deviceid @parcel/watcher; do
    say "lib/vscode: npm rebuild $module"
    log="$DIR/npm-rebuild-${module//\//_}.log"
    if ! (cd "$VSC" && npm rebuild "$module") >"$log" 2>&1; then
      # node-pty's last post-install step (compile_commands.json through `npx node-gyp`, which
      # would download node-gyp) fails after its addon has been built: harmless
      if [ "$module" = node-pty ] && [ -f "$VSC/node_modules/node-pty/build/Release/pty.node" ]; then
        say "node-pty: pty.node built; its failing compile_commands.json step is harmless ($log)"
      else
        cat "$log" >&2
        die "npm rebuild $module failed"
      fi
    fi
  done
  done_ "code-server-$CODE_SERVER_VERSION-native"
fi
# links the postinstall script would make (cheap: redone every run)
ln -sfn node_modules "$VSC/node_modules.asar"
ln -sfn code-linux.sh "$VSC/bin/remote-cli/code-server"
ln -sfn browser-linux.sh "$VSC/bin/helpers/browser.sh"
mkdir -p "$VSC/node_modules/@vscode/ripgrep/bin"
ln -sfn "$(command -v rg)" "$VSC/node_modules/@vscode/ripgrep/bin/rg"
if ! stamp "code-server-$CODE_SERVER_VERSION-extensions"; then
  say "lib/vscode/extensions: npm install --omit=dev"
  (cd "$VSC/extensions" && npm install --omit=dev)
  done_ "code-server-$CODE_SERVER_VERSION-extensions"
fi
mkdir -p "$DIR/bin"
cat > "$DIR/bin/code-server" <<EOF
#!/bin/sh
# code-server $CODE_SERVER_VERSION as installed by tests/editors/setup_vscode.sh
exec node "$CS/out/node/entry.js" "\$@"
EOF
chmod +x "$DIR/bin/code-server"
# (code-server writes a config file and logs even for --version: keep them in the cache)
cs_version="$(XDG_CONFIG_HOME="$DIR/xdg/config" XDG_DATA_HOME="$DIR/xdg/data" "$DIR/bin/code-server" --version | grep -v ' info ' | head -1)"
case "$cs_version" in
  "$CODE_SERVER_VERSION "*) say "code-server runs: $cs_version" ;;
  *) die "code-server --version printed '$cs_version', expected $CODE_SERVER_VERSION" ;;
esac

# --- the extension: its dependencies and vsce, in the cache (the checkout stays untouched) -------
# The test packages the .vsix from the checkout's sources at every run (a few seconds), so an
# edited extension.js is what gets tested; here we only install what packaging needs.
EXT_DEPS="$DIR/extension-deps"
lock_hash="$(cat "$EXT_SRC/package.json" | sha256sum | cut -c1-16)"
if ! stamp "extension-deps-$lock_hash"; then
  say "extension dependencies (npm install --omit=dev of editors/vscode/package.json)"
  rm -rf "$EXT_DEPS"
  mkdir -p "$EXT_DEPS"
  cp "$EXT_SRC/package.json" "$EXT_DEPS/"
  (cd "$EXT_DEPS" && npm install --omit=dev --ignore-scripts)
  done_ "extension-deps-$lock_hash"
fi
VSCE_DIR="$DIR/vsce-$VSCE_VERSION"
if ! stamp "vsce-$VSCE_VERSION"; then
  say "npm install @vscode/vsce@$VSCE_VERSION"
  mkdir -p "$VSCE_DIR"
  (cd "$VSCE_DIR" && [ -f package.json ] || echo '{"name":"codespec-vsce","private":true}' > package.json)
  # versions at least a week old: a just-published dependency can be listed in the registry's full
  # metadata before its install metadata has it (ETARGET for @azure/msal-common, two days old)
  (cd "$VSCE_DIR" && npm install --no-save --ignore-scripts --before "$(date -u -d '-7 days' +%Y-%m-%d)" \
    "@vscode/vsce@$VSCE_VERSION")
  done_ "vsce-$VSCE_VERSION"
fi
ln -sfn "$VSCE_DIR/node_modules/.bin/vsce" "$DIR/bin/vsce"

# package once now, so a broken manifest shows up here rather than in the test
say "packaging the extension once (check)"
"$PYTHON" "$REPO/tests/editors/vscode_env.py" package "$DIR/codespec-check.vsix"

say "done: code-server, chromium, playwright and the extension tooling are in place"
say "run the editor tests with: $PYTHON -m pytest -m editors tests/editors"
