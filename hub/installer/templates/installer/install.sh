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
  local health_window=30
  local -a release_keys=()

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
--health-window S  with --no-systemd, run the new version S seconds as a trial before switching
                to it (default 30)
--release-key KEY  pin KEY (ed25519:...) as a key agent releases must be signed with; repeat
                for several (they replace the pinned ones); cloudgpu-agent upgrade refuses any
                release none of them signed

Re-running it keeps the existing configuration (runtime, compute mode, token, every other
setting) and changes only what an option or a new code or token says. A failed run changes
nothing: the new version and its configuration are tried first, then switched to at once.
USAGE
  }

  while (($# > 0)); do
    case $1 in
      --prefix | --state | --hub | --runtime | --download-timeout | --health-window | --release-key)
        (($# >= 2)) || die "$1 needs a value (see --help)" 2
        case $1 in
          --release-key) release_keys+=("$2") ;;
          --prefix) prefix=$2 prefix_given=1 ;;
          --state) state=$2 ;;
          --hub) hub=$2 hub_given=1 ;;
          --runtime) runtime=$2 ;;
          --download-timeout) download_timeout=$2 ;;
          --health-window) health_window=$2 ;;
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
  # Nothing started from here on (pip, the agent, the service) inherits it. CLOUDGPU_CONFIG is
  # set below for the checks of a staged config only, never taken from the caller.
  unset CLOUDGPU_TOKEN CLOUDGPU_CONFIG
  # The agent ranks CLOUDGPU_* settings above its config file: one inherited from the caller
  # (sudo -E, a non-root install) would make the checks below try other settings than the
  # file that gets installed. The names only, never a value, are listed here.
  local cloudgpu_var
  for cloudgpu_var in $(compgen -v CLOUDGPU_); do unset "$cloudgpu_var"; done

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
  # `run --trial` takes up to an hour.
  if ! [[ $health_window =~ ^[1-9][0-9]{0,3}$ ]] || ((health_window > 3600)); then
    die "--health-window must be a number of seconds from 1 to 3600" 2
  fi
  local config=$state/cloudgpu-agent.conf

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
  # The agent takes the hub's address only (config.websocket_url): a path would pass every
  # download here and fail later, in the agent.
  python3 -c 'import sys
from urllib.parse import urlsplit
parts = urlsplit(sys.argv[1])
sys.exit(parts.path not in ("", "/") or bool(parts.query) or bool(parts.fragment))' "$hub" ||
    die "--hub takes the hub's address only, like https://hub.example.com; $hub has a path" 2

  # The runtime the agent will use: the option, else the existing configuration's, else docker.
  local use_runtime=$runtime
  if [[ -z $use_runtime && -f $config ]]; then
    use_runtime=$(python3 -c 'import configparser, sys
parser = configparser.ConfigParser(interpolation=None)
parser.read(sys.argv[1])
print(parser.get("agent", "runtime", fallback=""))' "$config" 2>/dev/null) || use_runtime=""
  fi
  use_runtime=${use_runtime:-docker}
  # Docker's socket is root:docker 0660: run by a user outside that group, the agent cannot use
  # it although the daemon runs. Say so (not "does not answer"); with the docker runtime the
  # agent could not work at all, so stop before anything is installed.
  local docker_socket=/var/run/docker.sock docker_denied=""
  case ${DOCKER_HOST:-} in
    "") ;;
    unix://*) docker_socket=${DOCKER_HOST#unix://} ;;
    *) docker_socket="" ;; # tcp:// or ssh://: nothing on this host to check
  esac
  if [[ -n $docker_socket && -S $docker_socket ]] && ! [[ -r $docker_socket && -w $docker_socket ]]; then
    local user group
    user=$(id -un) group=$(stat -c %G "$docker_socket")
    if [[ $(stat -c %A "$docker_socket") != ????rw* ]]; then
      docker_denied="only $(stat -c %U "$docker_socket") may use Docker's socket $docker_socket, not $user: run this with sudo"
    elif id -nG "$user" | tr ' ' '\n' | grep -qxF "$group"; then
      docker_denied="$user is in the $group group, but this login session is not yet, so it cannot use Docker's socket $docker_socket. Fix: log in again (or run: newgrp $group), then re-run"
    else
      docker_denied="$user cannot use Docker's socket $docker_socket: it is for the $group group, and $user is not in it. Fix: sudo usermod -aG $group $user, then log in again and re-run"
    fi
    if [[ $use_runtime == docker ]]; then
      die "$docker_denied (nothing was installed)"
    fi
    warn "$docker_denied (the mock runtime does not need Docker)"
  fi

  # Only warnings: a CPU-only box can still join (and run --runtime mock).
  if ! command -v docker >/dev/null 2>&1; then
    warn "Docker is not installed, so renters' containers cannot start. Fix: apt-get install -y docker.io"
  elif [[ -z $docker_denied ]] && ! timeout 20 docker info >/dev/null 2>&1; then
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
  local keep_config=0
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
  # Until the switch, whatever this run made: the new version's folder (half-built before), the
  # staged configuration, and folders that did not exist. After it, nothing.
  cloudgpu_install_target="" cloudgpu_install_new_prefix="" cloudgpu_install_staged=""
  cloudgpu_install_new_state="" cloudgpu_install_new_venvs=""
  cleanup() {
    rm -rf "$cloudgpu_install_tmp"
    [[ -z $cloudgpu_install_target ]] || rm -rf "$cloudgpu_install_target"
    [[ -z $cloudgpu_install_staged ]] || rm -f "$cloudgpu_install_staged"
    [[ -z $cloudgpu_install_new_state ]] || rm -rf "$cloudgpu_install_new_state"
    [[ -z $cloudgpu_install_new_venvs ]] || rmdir "$cloudgpu_install_new_venvs" 2>/dev/null || :
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
          # Exit 3 as for any hub this host cannot use: the redirect is the hub's answer.
          ((++hops <= 5)) || die "too many redirects downloading $3 from $1" 3
          why=$(url_refusal "$next") || die "refusing the redirect from $url: $why" 3
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
  local need_mib=200 free_kib need_inodes=20000 inodes free_inodes
  free_kib=$(df -Pk "$prefix" | awk 'NR == 2 { print $4 }')
  if ((free_kib < need_mib * 1024)); then
    die "$prefix needs ${need_mib} MiB free to install the agent beside the current one, and has $((free_kib / 1024)) MiB: free some space and re-run (nothing was changed)"
  fi
  # A version is some 3000 files: a disk out of inodes is as full as one out of bytes. Some
  # filesystems (btrfs) have no fixed count and report 0 or "-".
  read -r inodes free_inodes < <(df -Pi "$prefix" | awk 'NR == 2 { print $2, $4 }')
  if [[ $inodes =~ ^[1-9][0-9]*$ && $free_inodes =~ ^[0-9]+$ ]] && ((free_inodes < need_inodes)); then
    die "$prefix needs $need_inodes free inodes (room for that many files) to install the agent beside the current one, and has $free_inodes: delete some files and re-run (nothing was changed)"
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
    if [[ $status == 5* ]]; then
      # A proxy's 502, a hub restarting: the code was not looked at, so it is not spent.
      die "the hub could not answer at $hub/agent/enroll (HTTP $status): re-run in a minute (if the code was used up meanwhile, make a new install command)" 3
    fi
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
  # current one, replaced in one rename. The configuration goes the same way: written to a staged
  # file, checked with the new version, renamed over the real one at the switch. A failure (a
  # full disk, pip, the hub, the trial run) removes what is new and changes nothing else.
  local venvs=$prefix/venvs target n=1
  if [[ ! -d $venvs ]]; then
    mkdir -p "$venvs"
    cloudgpu_install_new_venvs=$venvs
  fi
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
  # Why venv or pip failed, when a disk filled up (bytes or inodes), in one line; nothing when
  # not. Asked again after the failure: the check before cannot foresee what else writes.
  disk_full() { # LOG
    local dir total free
    for dir in "$prefix" "$tmpdir"; do
      read -r total free < <(df -Pi "$dir" | awk 'NR == 2 { print $2, $4 }')
      if [[ $total =~ ^[1-9][0-9]*$ && $free =~ ^[0-9]+$ ]] && ((free < 100)); then
        printf '%s\n' "the disk of $dir has no free inodes left (too many files): delete some files there and re-run"
        return
      fi
      free=$(df -Pk "$dir" | awk 'NR == 2 { print $4 }')
      if [[ $free =~ ^[0-9]+$ ]] && ((free < 1024)); then
        printf '%s\n' "the disk of $dir is full: free some space there and re-run"
        return
      fi
    done
    # pip removes its temporary files on the way out, so the space may be back by now.
    if grep -qE 'No space left on device|Disk quota exceeded|Errno (28|122)' "$1" 2>/dev/null; then
      printf '%s\n' "a disk filled up (No space left on device): free some space on the disks of $prefix and $tmpdir and re-run"
    fi
  }
  local log=$tmp/install.log full seed=""
  # A re-run over a working install on this same Python: the new virtualenv is made without pip
  # and gets the installed one's, copied at the pip step (supplier_agent/venv_seed.py, as
  # `upgrade` does), instead of ensurepip unpacking and compiling pip and setuptools again.
  # Otherwise (a first install, an agent from before venv_seed, another Python) ensurepip.
  local same='import sys; print(sys.base_prefix, sys.version)'
  if [[ -n $installed ]] && "$venv/bin/python" -c 'import supplier_agent.venv_seed' 2>/dev/null &&
    [[ $("$venv/bin/python" -c "$same") == "$(python3 -c "$same")" ]]; then
    seed=$venv/bin/python
  fi
  make_venv() {
    if [[ -n $seed ]]; then
      python3 -m venv --without-pip "$target"
    else
      python3 -m venv "$target"
    fi
  }
  # Output to a log, shown unless a full disk explains it: venv's answer to that is a traceback.
  if ! make_venv >"$log" 2>&1; then
    full=$(disk_full "$log")
    [[ -z $full ]] || die "could not create the virtual environment: $full (nothing was changed)"
    cat "$log" >&2
    die "could not create the virtual environment $target (see above; nothing was changed)"
  fi
  local pip=("$target/bin/python" -m pip --disable-pip-version-check --quiet)
  say "installing cloudgpu-agent $version and its dependencies (PIP_INDEX_URL and friends apply)"
  install_agent() {
    [[ -z $seed ]] || "$seed" -m supplier_agent.venv_seed "$target" || return
    "${pip[@]}" install "$tmp/$filename"
  }
  if ! install_agent >"$log" 2>&1; then
    full=$(disk_full "$log")
    [[ -z $full ]] || die "pip could not install the agent: $full (nothing was changed)"
    cat "$log" >&2
    die "pip could not install the agent (see above); nothing was changed"
  fi
  cat "$log" >&2 # pip's warnings, if any
  local agent=$target/bin/cloudgpu-agent reported
  reported=$("$agent" version 2>&1) || die "the new agent does not run: $reported"
  [[ $reported == "cloudgpu-agent $version "* ]] ||
    die "the new agent reports '$reported', not version $version (nothing was changed)"

  # The configuration: kept byte for byte unless a new token or an option says otherwise; then
  # the new agent's `configure --update` writes the existing one with only that changed (every
  # other key kept, unknown ones too) to a staged file beside it.
  local staged="" configure_args=(configure --update --state "$state")
  # A token from an enrollment code belongs to the hub that issued it.
  if ((hub_given || code_spent)) || [[ ! -f $config ]]; then configure_args+=(--hub "$hub"); fi
  [[ -z $runtime ]] || configure_args+=(--runtime "$runtime")
  local key
  for key in "${release_keys[@]}"; do configure_args+=(--release-key "$key"); done
  if ((keep_config)) && ((!hub_given)) && [[ -z $runtime ]] && ((${#release_keys[@]} == 0)); then
    say "keeping the configuration in $config"
  else
    if [[ ! -e $state ]]; then
      cloudgpu_install_new_state=$state
    fi
    staged=$state/.cloudgpu-agent.conf.new
    cloudgpu_install_staged=$staged
    configure_args+=(--output "$staged")
    # Its "wrote FILE" would name the staged file, gone after a failure: only errors are shown.
    if ((keep_config)); then
      # --update keeps the file's token when stdin has none.
      "$agent" "${configure_args[@]}" </dev/null >/dev/null ||
        die "cloudgpu-agent configure failed (see above; nothing was changed)"
    else
      # printf is a shell builtin: the token goes through a pipe, never onto a command line.
      printf '%s\n' "$token" | "$agent" "${configure_args[@]}" >/dev/null ||
        die "cloudgpu-agent configure failed (see above; nothing was changed)"
    fi
  fi
  token=""
  # The new version, run on the configuration it will have: the staged one, if any.
  with_config() {
    if [[ -n $staged ]]; then
      CLOUDGPU_CONFIG=$staged "$@"
    else
      "$@"
    fi
  }

  # The new version proves it reaches the hub before anything is switched to it.
  say "checking the connection to the hub"
  local smoke=0 details=""
  with_config "$agent" smoke --state "$state" >&2 || smoke=$?
  if [[ -n $installed ]]; then
    # The installed version stays; its doctor checks the hub this run was to use.
    details="; details: "
    ((!hub_given)) || details+="CLOUDGPU_HUB=$hub "
    details+="$venv/bin/cloudgpu-agent doctor --connectivity --state $state"
  fi
  case $smoke in
    0) ;;
    3) die "the hub did not answer within 10 s: check that this host can reach $hub (firewall, proxy), then re-run (nothing was changed)" 3 ;;
    4) die "the hub rejected the token: create a new install command in the hub and re-run with it (nothing was changed)" 4 ;;
    *) die "the connection check failed (exit $smoke, see above; nothing was changed)$details" "$smoke" ;;
  esac

  # Without systemd nothing watches the new version after the switch: it runs `run`'s real
  # start-up (beside an agent that may be running on the same state) for the health window first.
  if ((!systemd)); then
    say "trying cloudgpu-agent $version for $health_window s (run --trial)"
    local trial_rc=0 reason
    with_config "$agent" run --trial "$health_window" --state "$state" >"$log" 2>&1 || trial_rc=$?
    if ((trial_rc != 0)); then
      cat "$log" >&2
      reason=$(awk 'NF { last = $0 } END { print last }' "$log")
      die "cloudgpu-agent $version failed its $health_window s trial run (exit $trial_rc: ${reason:-no reason given}); nothing was changed" "$trial_rc"
    fi
  fi

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
  # From here on nothing is removed on the way out: the new version is the installed one.
  cloudgpu_install_target="" cloudgpu_install_new_prefix="" cloudgpu_install_staged=""
  cloudgpu_install_new_state="" cloudgpu_install_new_venvs=""
  say "$venv -> $target"
  # The checked configuration with it: one rename (same folder, mode 0600 as written).
  if [[ -n $staged ]]; then
    mv -f "$staged" "$config" || die "switched $venv to $target, but could not rename $staged to $config: rename it yourself"
    say "wrote the configuration $config (mode 0600)"
  fi
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

  say "success: cloudgpu-agent $version is installed in $prefix and the hub at $hub answered"
  if ((systemd)); then
    say "the agent runs as a systemd service: systemctl status cloudgpu-agent"
  elif [[ -n $installed ]]; then
    say "restart the agent to run the new version: $agent run --state $state"
  else
    say "start the agent with: $agent run --state $state"
  fi
}

main "$@" cloudgpu-install-end
