#!/bin/sh
# Build the frontend extension into ../nbdurable/labextension, which is committed:
# users install the Python package and never need Node. Run after changing src/ or style/.
# Needs Node >= 18, and a Python with jupyterlab installed ($PYTHON, default python3):
# its core package list decides which shared packages the extension uses.
set -eu
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
CORE=$("$PYTHON" -c 'import os, jupyterlab; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')
[ -d node_modules ] || npm ci --no-audit --no-fund
rm -rf lib tsconfig.tsbuildinfo
npx tsc  # first: a type error leaves the committed build alone
rm -rf ../nbdurable/labextension
npx build-labextension --core-path "$CORE" .
cp install.json ../nbdurable/labextension/install.json
