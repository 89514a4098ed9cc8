#!/usr/bin/env bash
# CloudGPU supplier agent installer, served by the hub at /install.sh.
#
#   curl -fsSL {{ hub_url }}/install.sh | sudo bash -s <ENROLLMENT-CODE>
#
# The argument is a single-use enrollment code (cgpe_...) from the hub's install command, never
# a token: every user of this host can read a command line (ps), and it lands in shell history
# and sudo's log. The script exchanges the code with the hub, once, for a new agent token. A
# token itself may come from CLOUDGPU_TOKEN or, with neither, a hidden prompt on the terminal.
# The token goes to `cloudgpu-agent configure` on stdin only, never on a command line.
# Run with --help for the options. Re-running upgrades the installation in place.
#
# Everything happens inside main(), called on the very last line with an end marker after the
# user's arguments: a download cut short defines functions at most, or calls main without the
# marker, and runs nothing.
set -euo pipefail

main() {
  # Cut anywhere in the last line ("main", "main \"$@\" cloudgpu-inst"), the marker is missing.
  if (($# == 0)) || [[ ${!#} != cloudgpu-install-end ]]; then
    printf '%s\n' "install.sh: this copy of the script was cut short in the download; nothing was done. Download it again." >&2
    exit 1
  fi
  set -- "${@:1:$#-1}"
  local prog=cloudgpu-install
  local hub={{ hub_url_shell }}
  local prefix=/opt/cloudgpu-agent state="" runtime="" systemd=1 token="" code=""
  local prefix_given=0 code_spent=0 hub_given=0 allow_downgrade=0 download_timeout=600

  say() { printf '%s: %s\n' "$prog" "$*" >&2; }
  warn() { say "warning: $*"; }
  die() {
    say "error: $1"
    if ((code_spent)); then
      say "note: the enrollment code is used up; re-run with a new install command from the hub"
    fi
    exit "${2:-1}"
  }
  usage() {
    cat <<USAGE
Install the CloudGPU supplier agent on this host and connect it to a hub.

  curl -fsSL $hub/install.sh | sudo bash -s [--] [CODE] [OPTIONS]

CODE            the single-use enrollment code (cgpe_...) of an install command from the hub;
                without one, give a supplier token in CLOUDGPU_TOKEN or type it when asked
                (never on the command line)
--prefix DIR    install into DIR (default /opt/cloudgpu-agent): DIR/venv and DIR/state
--state DIR     the agent's state folder (default PREFIX/state)
--hub URL       the hub to join (default $hub)
--runtime NAME  docker (default) or mock (control-plane dry run, no GPU or Docker used)
--no-systemd    do not install the systemd service; start the agent yourself
--allow-downgrade  install the hub's version even if it is older than the installed one
--download-timeout S  give up on a download after S seconds (default 600)

Re-running it keeps the existing configuration (runtime, compute mode, token) unless an option
or a new code or token says otherwise.
USAGE
  }

  while (($# > 0)); do
    case $1 in
      --prefix | --state | --hub | --runtime | --download-timeout)
        (($# >= 2)) || die "$1 needs a value (see --help)" 2
        case $1 in
          --prefix) prefix=$2 prefix_given=1 ;;
          --state) state=$2 ;;
          --hub) hub=$2 hub_given=1 ;;
          --runtime) runtime=$2 ;;
          --download-timeout) download_timeout=$2 ;;
        esac
        shift 2
        ;;
      --no-systemd) systemd=0 && shift ;;
      --allow-downgrade) allow_downgrade=1 && shift ;;
      -h | --help) usage && exit 0 ;;
      --) shift ;;
      -*) die "unknown option $1 (see --help)" 2 ;;
      cgpu_*)
        # Never echo this argument back: it is a secret.
        die "that is an agent token, and a command line is readable by every user of this host (ps) and lands in shell history and sudo's log. Use an install command from the hub (it carries a single-use enrollment code), or give the token in CLOUDGPU_TOKEN or at the prompt" 2
        ;;
      cgpe_*)
        [[ -z $code ]] || die "more than one enrollment code given (see --help)" 2
        code=$1
        shift
        ;;
      *) die "the argument is not an enrollment code (cgpe_...): copy the install command again from the hub (see --help)" 2 ;;
    esac
  done
  if [[ -z $code ]]; then
    token=${CLOUDGPU_TOKEN:-}
  fi
  # Nothing started from here on (pip, the agent, the service) inherits it.
  unset CLOUDGPU_TOKEN

  [[ $prefix == /* ]] || prefix=$PWD/$prefix
  prefix=${prefix%/}
  state=${state:-$prefix/state}
  [[ $state == /* ]] || state=$PWD/$state
  hub=${hub%/}
  local venv=$prefix/venv
  case $runtime in
    "" | docker | mock) ;;
    *) die "--runtime must be docker or mock" 2 ;;
  esac
  [[ $download_timeout =~ ^[1-9][0-9]{0,5}$ ]] || die "--download-timeout must be a number of seconds" 2

  # --- this host -----------------------------------------------------------------------------
  local os arch
  os=$(uname -s)
  arch=$(uname -m)
  [[ $os == Linux ]] || die "supplier hosts run Linux; this one runs $os"
  case $arch in
    x86_64 | amd64 | aarch64 | arm64) ;;
    *) die "the agent runs on x86_64 and aarch64; this host is $arch" ;;
  esac
  if ((prefix_given == 0)) && ((EUID != 0)); then
    die "installing into $prefix needs root: run it with sudo (or choose --prefix DIR)"
  fi
  if ((systemd)); then
    ((EUID == 0)) || die "installing the service needs root: run it with sudo (or pass --no-systemd)"
    if ! command -v systemctl >/dev/null 2>&1 || [[ ! -d /run/systemd/system ]]; then
      die "systemd is not running on this host: pass --no-systemd and start the agent yourself"
    fi
  fi
  if ! command -v python3 >/dev/null 2>&1; then
    die "Python 3.10 or newer is needed. Fix: apt-get install -y python3 python3-venv"
  fi
  if ! python3 -c 'import sys; sys.exit(sys.version_info < (3, 10))'; then
    die "$(python3 -V 2>&1) is too old; the agent needs Python 3.10 or newer (Ubuntu 22.04 and later have it)"
  fi
  if ! python3 -c 'import ensurepip, venv' >/dev/null 2>&1; then
    die "Python's venv module is missing. Fix: apt-get install -y python3-venv"
  fi
  command -v curl >/dev/null 2>&1 || die "curl is needed. Fix: apt-get install -y curl"
  command -v sha256sum >/dev/null 2>&1 || die "sha256sum is needed. Fix: apt-get install -y coreutils"
  command -v flock >/dev/null 2>&1 || die "flock is needed. Fix: apt-get install -y util-linux"

  # One rule for every URL, the agent's `upgrade` rule too: https://, or plain http:// only to
  # a real loopback host (parsed, not pattern-matched: http://127.0.0.1@0.0.0.0/ is not
  # loopback), and never credentials in the URL. Prints why not, on failure.
  url_refusal() {
    python3 -c 'import ipaddress, sys
from urllib.parse import urlsplit
url = sys.argv[1]
try:
    parts = urlsplit(url)
    host = parts.hostname
    parts.port
except ValueError:
    sys.exit(f"{url} is not a valid URL")
if parts.scheme not in ("http", "https") or not host:
    sys.exit(f"{url} is not an https:// URL")
if parts.username is not None or parts.password is not None or "@" in parts.netloc:
    sys.exit(f"{url} has credentials in it (user@host); refusing it")
if parts.scheme == "http":
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        sys.exit(f"{url} is plain http: only https:// is allowed (plain http only on loopback)")
' "$1" 2>&1
  }
  local why
  case $hub in
    http://* | https://*) ;;
    *) die "--hub must look like https://hub.example.com, not $hub" 2 ;;
  esac
  why=$(url_refusal "$hub") || die "the hub must be reached over https://: $why" 2

  # Only warnings: a CPU-only box can still join (and run --runtime mock).
  if ! command -v docker >/dev/null 2>&1; then
    warn "Docker is not installed, so renters' containers cannot start. Fix: apt-get install -y docker.io"
  elif ! timeout 20 docker info >/dev/null 2>&1; then
    warn "Docker is installed but its daemon does not answer. Fix: systemctl enable --now docker"
  fi
  if ! command -v nvidia-smi >/dev/null 2>&1; then
    warn "no NVIDIA driver (nvidia-smi not found): this host offers no GPU until one is installed. Fix (Ubuntu): ubuntu-drivers install, then reboot"
  elif ! timeout 20 nvidia-smi -L >/dev/null 2>&1; then
    warn "nvidia-smi finds no working GPU: check the driver with nvidia-smi"
  fi
  if ! command -v nvidia-ctk >/dev/null 2>&1; then
    warn "the NVIDIA Container Toolkit is missing, so containers cannot use the GPUs. Fix: install it (https://docs.nvidia.com/datacenter/cloud-native/container-toolkit/latest/install-guide.html), then: nvidia-ctk runtime configure --runtime=docker && systemctl restart docker"
  fi

  # --- the enrollment code or the token -------------------------------------------------------
  # A re-run keeps the existing configuration, token included: nothing to ask.
  local config=$state/cloudgpu-agent.conf keep_config=0
  if [[ -z $code && -z $token && -f $config ]]; then
    keep_config=1
  fi
  if [[ -z $code && -z $token ]] && ((!keep_config)); then
    # stdin is this script when piped from curl: ask on the terminal itself.
    if ! (: </dev/tty) 2>/dev/null; then
      die "no enrollment code or token: run the install command from the hub ('bash -s <CODE>'), set CLOUDGPU_TOKEN, or run this from a terminal" 2
    fi
    printf 'Supplier token or enrollment code (from the hub; input hidden): ' >/dev/tty
    IFS= read -rs token </dev/tty || true
    printf '\n' >/dev/tty
  fi
  if [[ $token == cgpe_* ]]; then
    code=$token
    token=""
  fi
  if [[ -n $code ]]; then
    [[ $code =~ ^cgpe_[0-9A-Za-z]{36}$ ]] ||
      die "the enrollment code has an unexpected form; copy the install command again from the hub" 2
  elif ((!keep_config)); then
    [[ -n $token ]] || die "the supplier token is empty" 2
    [[ $token =~ ^[[:graph:]]+$ ]] || die "the supplier token has an unexpected form; copy it again from the hub" 2
  fi

  # --- download and verify, before anything is installed ------------------------------------
  local tmpdir=${TMPDIR:-/tmp}
  [[ -d $tmpdir && -w $tmpdir ]] ||
    die "TMPDIR=$tmpdir is not a writable folder: create it, or run without TMPDIR set"
  # A global, not a local: the EXIT trap runs after main's locals are gone.
  cloudgpu_install_tmp=$(mktemp -d "$tmpdir/cloudgpu-install.XXXXXX") ||
    die "could not create a temporary folder in $tmpdir (is it full?)"
  # The new version's folder too, until the switch to it (it is half-built before).
  cloudgpu_install_target="" cloudgpu_install_new_prefix=""
  cleanup() {
    rm -rf "$cloudgpu_install_tmp"
    [[ -z $cloudgpu_install_target ]] || rm -rf "$cloudgpu_install_target"
    [[ -z $cloudgpu_install_new_prefix ]] || rm -rf "$cloudgpu_install_new_prefix"
  }
  trap cleanup EXIT
  local tmp=$cloudgpu_install_tmp
  # Redirects are followed here, one hop at a time, so that every hop passes url_refusal
  # (curl's own -L cannot tell loopback http from any other); --proto-redir as a second belt.
  fetch() { # URL FILE WHAT
    local url=$1 hops=0 out rc code next
    while :; do
      rc=0
      out=$(curl -sS --proto '=http,https' --proto-redir '=https' --connect-timeout 20 \
        --max-time "$download_timeout" -o "$2" -w '%{http_code} %{redirect_url}' "$url") || rc=$?
      case $rc in
        0) ;;
        28) die "timed out downloading $3 from $url (no complete answer in $download_timeout s)" 3 ;;
        *) die "cannot reach $url (curl exit $rc): check that this host can reach the hub" 3 ;;
      esac
      code=${out%% *} next=${out#* }
      case $code in
        2??) return 0 ;;
        301 | 302 | 303 | 307 | 308)
          ((++hops <= 5)) || die "too many redirects downloading $3 from $1"
          why=$(url_refusal "$next") || die "refusing the redirect from $url: $why"
          url=$next
          ;;
        404) die "$hub was reached, but it serves no agent release ($url: HTTP 404): check --hub" 3 ;;
        *) die "downloading $3 from $url failed: HTTP $code" 3 ;;
      esac
    done
  }

  say "fetching the agent release from $hub"
  fetch "$hub/agent/release.json" "$tmp/release.json" "the release description"
  local release version filename sha256 actual
  release=$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(d["version"], d["filename"], d["sha256"])' "$tmp/release.json" 2>/dev/null) ||
    die "the hub's release.json is not what this installer expects"
  read -r version filename sha256 <<<"$release"
  [[ $filename =~ ^cloudgpu_agent-[A-Za-z0-9_.+!-]+\.whl$ ]] || die "the hub offers an unexpected file name"
  [[ $sha256 =~ ^[0-9a-f]{64}$ ]] || die "the hub's release.json has no valid sha256"
  fetch "$hub/agent/$filename" "$tmp/$filename" "the agent wheel"
  actual=$(sha256sum "$tmp/$filename")
  actual=${actual%% *}
  if [[ $actual != "$sha256" ]]; then
    die "sha256 mismatch for $filename: expected $sha256, got $actual. The download is corrupt or was tampered with; nothing was installed."
  fi
  say "downloaded $filename (sha256 verified)"

  # --- the installation folder: one install or upgrade at a time, room, no silent downgrade ---
  umask 022
  if [[ ! -e $prefix ]]; then
    # Made here for the lock; removed again if the install stops before the switch.
    mkdir -p "$prefix" || die "could not create $prefix"
    cloudgpu_install_new_prefix=$prefix
  fi
  # The same lock file as `cloudgpu-agent upgrade` (flock(2) both): never both at once.
  exec 9>"$prefix/.upgrade.lock" || die "could not open $prefix/.upgrade.lock"
  flock -n 9 || die "another install or upgrade of $prefix is running; re-run when it has finished"
  local need_mib=200 free_kib
  free_kib=$(df -Pk "$prefix" | awk 'NR == 2 { print $4 }')
  if ((free_kib < need_mib * 1024)); then
    die "$prefix needs ${need_mib} MiB free to install the agent beside the current one, and has $((free_kib / 1024)) MiB: free some space and re-run (nothing was changed)"
  fi
  local installed=""
  if [[ -x $venv/bin/cloudgpu-agent ]]; then
    installed=$("$venv/bin/cloudgpu-agent" version 2>/dev/null) || installed=""
    installed=${installed#cloudgpu-agent }
    installed=${installed%% *}
  fi
  if [[ -n $installed ]] && ((!allow_downgrade)) && python3 -c 'import re, sys
def key(v):
    out = []
    for part in v.split("."):
        m = re.match(r"\d+", part)
        if not m:
            break
        out.append(int(m.group()))
        if m.end() != len(part):
            break
    return tuple(out)
sys.exit(0 if key(sys.argv[1]) < key(sys.argv[2]) else 1)' "$version" "$installed"; then
    die "the hub offers cloudgpu-agent $version, older than the installed $installed: refusing to downgrade (--allow-downgrade does it; nothing was changed)"
  fi

  # --- the enrollment code for a token, once ------------------------------------------------
  # After the checks and the download, so a host that cannot install does not use up the code.
  if [[ -n $code ]]; then
    say "exchanging the enrollment code for an agent token at $hub"
    local reply status
    # The code reaches python and curl on stdin, never on a command line; no redirect is
    # followed, so it goes to $hub (https://, or plain http on loopback) and nowhere else.
    reply=$(printf '%s\n' "$code" |
      python3 -c 'import json, socket, sys
print(json.dumps({"code": sys.stdin.readline().strip(), "host": socket.gethostname()}))' |
      curl -sS --proto '=http,https' --connect-timeout 20 --max-time 60 \
        -H 'Content-Type: application/json' --data-binary @- -w '\n%{http_code}' \
        "$hub/agent/enroll") ||
      die "could not reach $hub/agent/enroll: check that this host can reach the hub, then re-run" 3
    code=""
    status=${reply##*$'\n'}
    reply=${reply%$'\n'*}
    if [[ $status != 201 ]]; then
      # The hub says why in plain words (used, expired, unknown, rate limited); printable only.
      local why
      why=$(printf '%s' "$reply" | python3 -c 'import json, sys
detail = str(json.load(sys.stdin)["detail"])
print("".join(c for c in detail if c.isprintable())[:300])' 2>/dev/null) || why="HTTP $status"
      die "the hub refused the enrollment code: $why" 4
    fi
    code_spent=1
    token=$(printf '%s' "$reply" | python3 -c 'import json, sys
token = json.load(sys.stdin)["token"]
assert isinstance(token, str) and token.isascii() and token.isprintable() and " " not in token
print(token)' 2>/dev/null) || die "the hub's answer to the enrollment code is not what this installer expects"
    reply=""
    say "the hub issued an agent token for this host"
  fi

  # --- install beside the current version, switch only when it works ------------------------
  # As `cloudgpu-agent upgrade` does: PREFIX/venvs/<version> is new, PREFIX/venv a symlink to the
  # current one, replaced in one rename. A failure (a full disk, pip) removes the new folder
  # and leaves the running version as it was.
  local venvs=$prefix/venvs target n=1
  mkdir -p "$venvs"
  target=$venvs/$version
  while [[ -e $target || -L $target ]]; do
    n=$((n + 1))
    target=$venvs/$version-$n
  done
  cloudgpu_install_target=$target
  if [[ -n $installed ]]; then
    say "installing cloudgpu-agent $version beside the installed $installed, in $target"
  else
    say "creating a Python virtual environment in $target"
  fi
  python3 -m venv "$target" || die "could not create the virtual environment $target (nothing was changed)"
  local pip=("$target/bin/python" -m pip --disable-pip-version-check --quiet)
  say "installing cloudgpu-agent $version and its dependencies (PIP_INDEX_URL and friends apply)"
  "${pip[@]}" install "$tmp/$filename" ||
    die "pip could not install the agent (see above); nothing was changed"
  local agent=$target/bin/cloudgpu-agent reported
  reported=$("$agent" version 2>&1) || die "the new agent does not run: $reported"
  [[ $reported == "cloudgpu-agent $version "* ]] ||
    die "the new agent reports '$reported', not version $version (nothing was changed)"

  # The configuration: kept as it is unless a new token or an option says otherwise; then
  # rewritten with the existing settings as the base (configure alone would reset them).
  local configure_args=(configure --state "$state") kept=()
  if [[ -f $config ]]; then
    mapfile -d '' -t kept < <(python3 -c 'import configparser, sys
parser = configparser.ConfigParser(interpolation=None)
parser.read(sys.argv[1])
agent = parser["agent"] if parser.has_section("agent") else {}
flags = {"hub": "--hub", "runtime": "--runtime", "compute_mode": "--compute-mode",
         "gpu_devices": "--gpu-devices", "lock_dir": "--lock-dir",
         "reserve_memory_mib": "--reserve-memory-mib", "reserve_cpus": "--reserve-cpus",
         "allow_networks": "--allow-networks"}
out = []
for key, flag in flags.items():
    if agent.get(key):
        out += [flag, agent[key]]
if agent.get("accept_container_escape_risk"):
    out.append("--accept-container-escape-risk")
sys.stdout.write("".join(f"{arg}\0" for arg in out))' "$config") ||
      die "cannot read the existing configuration $config"
  fi
  configure_args+=("${kept[@]}")
  if ((hub_given)) || ((${#kept[@]} == 0)); then configure_args+=(--hub "$hub"); fi
  [[ -z $runtime ]] || configure_args+=(--runtime "$runtime")
  if ((keep_config)) && ((!hub_given)) && [[ -z $runtime ]]; then
    say "keeping the configuration in $config"
  elif ((keep_config)); then
    # The token stays the one in the file: python hands it over a pipe, never an argv.
    python3 -c 'import configparser, sys
parser = configparser.ConfigParser(interpolation=None)
parser.read(sys.argv[1])
print(parser["agent"]["token"])' "$config" | "$agent" "${configure_args[@]}" >&2 ||
      die "cloudgpu-agent configure failed (see above)"
  else
    # printf is a shell builtin: the token goes through a pipe, never onto a command line.
    printf '%s\n' "$token" | "$agent" "${configure_args[@]}" >&2 ||
      die "cloudgpu-agent configure failed (see above)"
  fi
  token=""

  # A re-run proves the new version reaches the hub before switching to it.
  local smoke_args=(smoke --state "$state")
  ((!hub_given)) || smoke_args+=(--hub "$hub")
  check_hub() {
    say "checking the connection to the hub"
    local smoke=0
    "$1" "${smoke_args[@]}" >&2 || smoke=$?
    case $smoke in
      0) ;;
      3) die "the hub did not answer within 10 s: check that this host can reach $hub (firewall, proxy), then re-run" 3 ;;
      4) die "the hub rejected the token: create a new install command in the hub and re-run with it" 4 ;;
      *) die "the connection check failed (exit $smoke); details: $1 doctor --connectivity --state $state" "$smoke" ;;
    esac
  }
  if [[ -n $installed ]]; then check_hub "$agent"; fi

  local previous=""
  if [[ -L $venv ]]; then
    previous=$(readlink -f "$venv")
  elif [[ -e $venv ]]; then
    # A plain virtualenv from an older installer: kept whole (its scripts need the path `venv`).
    rm -rf "$prefix/venv.previous"
    mv "$venv" "$prefix/venv.previous"
    previous=$prefix/venv.previous
  fi
  ln -sfn "venvs/${target##*/}" "$prefix/.venv.swap"
  mv -T "$prefix/.venv.swap" "$venv" || die "could not switch $venv to $target"
  cloudgpu_install_target="" cloudgpu_install_new_prefix=""
  say "$venv -> $target"
  # Keep the previous version for one rollback; older ones go.
  local old
  for old in "$venvs"/* "$prefix/venv.previous"; do
    [[ -d $old && ! -L $old && $old != "$target" && $old != "$previous" ]] || continue
    rm -rf "$old"
  done
  agent=$venv/bin/cloudgpu-agent

  if ((systemd)); then
    "$agent" install-service --prefix "$prefix" --state "$state" >&2 ||
      die "cloudgpu-agent install-service failed (see above)"
    if [[ -n $previous ]]; then
      # enable --now leaves a running agent on the old code. Renters' containers belong to
      # dockerd and survive the restart; the agent re-adopts them.
      systemctl try-restart cloudgpu-agent.service || die "could not restart cloudgpu-agent.service"
    fi
  fi

  # --- check ---------------------------------------------------------------------------------
  if [[ -z $installed ]]; then check_hub "$agent"; fi
  say "success: cloudgpu-agent $version is installed in $prefix and the hub at $hub answered"
  if ((systemd)); then
    say "the agent runs as a systemd service: systemctl status cloudgpu-agent"
  else
    say "start the agent with: $agent run --state $state"
  fi
}

main "$@" cloudgpu-install-end
