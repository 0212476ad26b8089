#!/usr/bin/env bash
# Run a command with Debian's Chromium and ChromeDriver present, for the browser test of the MLflow UI:
#   bash tests/ui/with-chromium.sh .venv/bin/python -m pytest -m ui
# Installs the chromium and chromium-driver packages when /usr/bin/chromium or /usr/bin/chromedriver is missing
# (the test itself installs nothing), then runs the command.
set -euo pipefail

as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
    echo "with-chromium: installing chromium and chromium-driver from Debian's packages" >&2
    as_root apt-get update -qq
    DEBIAN_FRONTEND=noninteractive as_root apt-get install -y -qq chromium chromium-driver >/dev/null
fi
exec "$@"
