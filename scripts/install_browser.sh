#!/usr/bin/env bash
# The headless browser that the web-view tests drive: Debian's chromium and its chromedriver.
# Installed with apt-get when missing and this user may install packages; otherwise says so and
# leaves it, and the browser tests skip with that reason. Never fails the caller.
set -u
if command -v chromium >/dev/null 2>&1 && command -v chromedriver >/dev/null 2>&1; then
    exit 0
fi
source "$(dirname "$0")/apt_install.sh"
apt_install install_browser "the browser tests will be skipped" chromium chromium-driver
exit 0
