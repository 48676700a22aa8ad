# Sourced by bin/run and bin/test: makes .venv and installs the project into it when needed.
# Everything the project needs comes from here, so a machine with only the OS image works.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv="$root/.venv"
extras="${TRIO_HA_EXTRAS:-dev,spark}"
# The Spark tests must run, never skip, wherever the spark extra is installed by this script.
case ",$extras," in *,spark,*) export TRIO_HA_REQUIRE_SPARK=1 ;; esac

pick_python() {
    for py in "${PYTHON:-}" python3.11 python3.12 python3.13 python3; do
        [ -n "$py" ] || continue
        if command -v "$py" >/dev/null 2>&1 &&
            "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$py"; return 0
        fi
    done
    echo "trio-ha needs Python 3.11 or newer on PATH" >&2
    return 1
}

if [ ! -x "$venv/bin/python" ]; then
    py=$(pick_python)
    if ! "$py" -m venv "$venv" 2>/dev/null; then
        # Debian splits venv/ensurepip out of the interpreter package.
        if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
            apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
            rm -rf "$venv"; "$py" -m venv "$venv"
        else
            echo "could not create $venv (install your distribution's python3-venv)" >&2
            exit 1
        fi
    fi
    "$venv/bin/python" -m pip install -q --upgrade pip
fi

if ! command -v cc >/dev/null 2>&1 || [ ! -f /usr/include/zlib.h ]; then
    # The native module needs a C compiler and zlib's header (CRC-32).
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        apt-get update -qq && apt-get install -y -qq gcc zlib1g-dev >/dev/null
    else
        echo "warning: no C compiler or zlib.h: the native module will not build" >&2
    fi
fi

if [[ ",$extras," == *,spark,* ]] && ! command -v java >/dev/null 2>&1; then
    # PySpark runs a JVM: Spark 4 needs Java 17 or newer.
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing Java 17 for Spark ..." >&2
        apt-get update -qq && apt-get install -y -qq openjdk-17-jre-headless >/dev/null
    else
        echo "warning: no java on PATH: the Spark data source and its tests need Java 17+" >&2
    fi
fi

if [[ ",$extras," == *,dev,* ]] && ! { command -v javac && command -v mvn; } >/dev/null 2>&1; then
    # The interop tests run the real Apache RocketMQ (fetched by Maven, our Java programs built
    # by javac); without these they skip, or fail under TRIO_HA_REQUIRE_ROCKETMQ=1 (CI).
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing a JDK 17 and Maven for the interop tests ..." >&2
        apt-get update -qq && apt-get install -y -qq openjdk-17-jdk-headless maven >/dev/null
    else
        echo "warning: no javac or mvn on PATH: the interop tests will skip" >&2
    fi
fi

if [[ ",$extras," == *,dev,* ]] && [ "$(id -u)" = 0 ] &&
    ! { command -v nft && command -v ip && command -v tc; } >/dev/null 2>&1; then
    # The chaos harness puts nodes on test hosts of their own (network namespaces) and
    # breaks their network with nftables rules and tc; without these its network faults
    # are left out (and their tests skip, or fail under TRIO_HA_REQUIRE_CHAOS=1: CI).
    if command -v apt-get >/dev/null 2>&1; then
        echo "installing nftables and iproute2 for the chaos harness ..." >&2
        apt-get install -y -qq nftables iproute2 >/dev/null 2>&1 ||
            { apt-get update -qq && apt-get install -y -qq nftables iproute2 >/dev/null; }
    else
        echo "warning: no nft/ip/tc on PATH: the chaos harness runs without network faults" >&2
    fi
fi

if [[ ",$extras," == *,dev,* ]] && ! command -v etcd >/dev/null 2>&1; then
    # The replicated controller keeps its state in etcd (issue 39); its tests start a real
    # 3-member etcd on loopback ports. Without etcd they skip, or fail under
    # TRIO_HA_REQUIRE_ETCD=1 (CI). Debian's package would also enable a system-wide etcd
    # service: the tests need only the executable, so that service is stopped and disabled
    # where systemd runs (in a container, policy-rc.d already keeps it from starting).
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        echo "installing etcd for the replicated controller's tests ..." >&2
        apt-get install -y -qq etcd-server >/dev/null 2>&1 ||
            { apt-get update -qq && apt-get install -y -qq etcd-server >/dev/null; }
        if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
            systemctl disable --now etcd >/dev/null 2>&1 || true
        fi
    else
        echo "warning: no etcd on PATH: the etcd controller tests will skip" >&2
    fi
fi

# Reinstall when anything that shapes the install changed (dependencies, the C source).
stamp="$venv/.trio-ha-install"
want=$(cat "$root/pyproject.toml" "$root/setup.py" "$root"/native/* 2>/dev/null | sha256sum | cut -d' ' -f1)
want="$want $extras"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "installing trio-ha[$extras] into $venv ..." >&2
    "$venv/bin/python" -m pip install -q -e "$root[$extras]"
    echo "$want" > "$stamp"
fi
export PATH="$venv/bin:$PATH"
