#!/usr/bin/env bash
# The headless browser that the web-view tests drive: Debian's chromium and its chromedriver.
# Installed with apt-get when missing and this user may install packages; otherwise says so and
# leaves it, and the browser tests skip with that reason. Never fails the caller.
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "install_browser: no apt-get here; the browser tests will be skipped (install chromium and chromedriver to run them)"
    exit 0
fi
if [ "$(id -u)" = "0" ]; then
    as_root=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    as_root="sudo -n"
else
    echo "install_browser: installing chromium needs root; the browser tests will be skipped"
    exit 0
fi
echo "install_browser: installing chromium and chromium-driver from Debian (once)"
export DEBIAN_FRONTEND=noninteractive
if ! timeout 900 $as_root apt-get install -y --no-install-recommends chromium chromium-driver >/tmp/marin-install-browser.log 2>&1; then
    timeout 300 $as_root apt-get update >>/tmp/marin-install-browser.log 2>&1
    timeout 900 $as_root apt-get install -y --no-install-recommends chromium chromium-driver >>/tmp/marin-install-browser.log 2>&1 \
        || echo "install_browser: apt-get failed (see /tmp/marin-install-browser.log); the browser tests will be skipped"
fi
exit 0
