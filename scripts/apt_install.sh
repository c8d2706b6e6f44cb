# Sourced by the scripts/install_*.sh scripts. `apt_install NAME CONSEQUENCE PACKAGE...` installs
# Debian's PACKAGEs with apt-get when this user may (root, or password-less sudo), refreshing the
# package lists once if the first try fails; where it cannot, it says so, then CONSEQUENCE. It never
# fails its caller: what needs the packages skips (or runs slower) without them.
apt_install() {
    local name=$1 consequence=$2
    shift 2
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "$name: no apt-get here; $consequence (install $* to change that)"
        return 0
    fi
    local as_root=""
    if [ "$(id -u)" != "0" ]; then
        if command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
            as_root="sudo -n"
        else
            echo "$name: installing $* needs root; $consequence"
            return 0
        fi
    fi
    echo "$name: installing $* from Debian (once)"
    export DEBIAN_FRONTEND=noninteractive
    local log="/tmp/marin-$name.log"
    if ! timeout 900 $as_root apt-get install -y --no-install-recommends "$@" >"$log" 2>&1; then
        timeout 300 $as_root apt-get update >>"$log" 2>&1
        timeout 900 $as_root apt-get install -y --no-install-recommends "$@" >>"$log" 2>&1 \
            || echo "$name: apt-get failed (see $log); $consequence"
    fi
    return 0
}
