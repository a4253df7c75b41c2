#!/usr/bin/env bash
# Makes a headless Chromium available for the report's browser test: prints the path of one already on PATH,
# else, when running as root on a Debian/Ubuntu machine, installs Debian's `chromium` package with apt-get
# (updating the package lists first when the install alone fails) and prints its path.  Prints nothing and
# exits 1 when no browser can be had (the test then skips and says why).  TXAUDIT_NO_BROWSER_INSTALL=1
# turns the install off.
set -uo pipefail
find_browser() {
    for name in chromium chromium-browser google-chrome; do
        if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
    done
    return 1
}
find_browser && exit 0
[ "${TXAUDIT_NO_BROWSER_INSTALL:-0}" = "1" ] && exit 1
[ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1 || exit 1
export DEBIAN_FRONTEND=noninteractive
{
    apt-get install -y -q --no-install-recommends chromium \
        || { apt-get update -q && apt-get install -y -q --no-install-recommends chromium; }
} >&2 || exit 1
find_browser
