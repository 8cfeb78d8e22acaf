#!/usr/bin/env bash
# apt-tool.sh COMMAND PACKAGE TEST: install Debian's PACKAGE (apt-get, without recommended
# packages) unless COMMAND is already on the PATH. Never fails: where it cannot install,
# it says which tests (TEST) will be skipped. The install-*.sh scripts of test tools use it.
set -u
command_="$1" package="$2" tests="$3"
command -v "$command_" >/dev/null && exit 0
if command -v apt-get >/dev/null; then
    sudo_=""
    [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null && sudo_="sudo"
    $sudo_ apt-get install -y -q --no-install-recommends "$package" >/dev/null 2>&1 \
        || { $sudo_ apt-get update -q >/dev/null 2>&1 \
            && $sudo_ apt-get install -y -q --no-install-recommends "$package" >/dev/null 2>&1; }
fi
command -v "$command_" >/dev/null || echo "apt-tool.sh: $command_ not installed; $tests will be skipped" >&2
exit 0
