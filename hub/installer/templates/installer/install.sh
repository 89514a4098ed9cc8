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
# Everything happens inside main(), called on the very last line: a download cut short
# defines functions at most and runs nothing.
set -euo pipefail

main() {
  local prog=cloudgpu-install
  local hub={{ hub_url_shell }}
  local prefix=/opt/cloudgpu-agent state="" runtime="" systemd=1 token="" code=""
  local prefix_given=0 code_spent=0

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
USAGE
  }

  while (($# > 0)); do
    case $1 in
      --prefix | --state | --hub | --runtime)
        (($# >= 2)) || die "$1 needs a value (see --help)" 2
        case $1 in
          --prefix) prefix=$2 prefix_given=1 ;;
          --state) state=$2 ;;
          --hub) hub=$2 ;;
          --runtime) runtime=$2 ;;
        esac
        shift 2
        ;;
      --no-systemd) systemd=0 && shift ;;
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
  case $hub in
    https://*) ;;
    http://127.* | http://localhost | http://localhost[:/]* | http://\[::1\]*) ;;
    http://*) die "the hub must be reached over https:// (plain http only on loopback): $hub" ;;
    *) die "--hub must look like https://hub.example.com, not $hub" 2 ;;
  esac

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
  if [[ -z $code && -z $token ]]; then
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
  else
    [[ -n $token ]] || die "the supplier token is empty" 2
    [[ $token =~ ^[[:graph:]]+$ ]] || die "the supplier token has an unexpected form; copy it again from the hub" 2
  fi

  # --- download and verify, before anything is installed ------------------------------------
  # A global, not a local: the EXIT trap runs after main's locals are gone.
  cloudgpu_install_tmp=$(mktemp -d "${TMPDIR:-/tmp}/cloudgpu-install.XXXXXX")
  cleanup() { rm -rf "$cloudgpu_install_tmp"; }
  trap cleanup EXIT
  local tmp=$cloudgpu_install_tmp
  fetch() { curl -fsSL --proto '=http,https' --connect-timeout 20 -o "$2" "$1"; }

  say "fetching the agent release from $hub"
  fetch "$hub/agent/release.json" "$tmp/release.json" ||
    die "could not download $hub/agent/release.json: check that this host can reach the hub"
  local release version filename sha256 actual
  release=$(python3 -c 'import json, sys
d = json.load(open(sys.argv[1]))
print(d["version"], d["filename"], d["sha256"])' "$tmp/release.json" 2>/dev/null) ||
    die "the hub's release.json is not what this installer expects"
  read -r version filename sha256 <<<"$release"
  [[ $filename =~ ^cloudgpu_agent-[A-Za-z0-9_.+!-]+\.whl$ ]] || die "the hub offers an unexpected file name"
  [[ $sha256 =~ ^[0-9a-f]{64}$ ]] || die "the hub's release.json has no valid sha256"
  fetch "$hub/agent/$filename" "$tmp/$filename" || die "could not download $hub/agent/$filename"
  actual=$(sha256sum "$tmp/$filename")
  actual=${actual%% *}
  if [[ $actual != "$sha256" ]]; then
    die "sha256 mismatch for $filename: expected $sha256, got $actual. The download is corrupt or was tampered with; nothing was installed."
  fi
  say "downloaded $filename (sha256 verified)"

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

  # --- install -------------------------------------------------------------------------------
  umask 022
  mkdir -p "$prefix"
  local upgrading=0
  if [[ -x $venv/bin/python ]]; then
    upgrading=1
    say "upgrading the existing installation in $venv"
  else
    say "creating a Python virtual environment in $venv"
    python3 -m venv "$venv" || {
      rm -rf "$venv"
      die "could not create the virtual environment $venv"
    }
  fi
  local pip=("$venv/bin/python" -m pip --disable-pip-version-check --quiet)
  say "installing cloudgpu-agent $version and its dependencies (PIP_INDEX_URL and friends apply)"
  "${pip[@]}" install --upgrade "$tmp/$filename" ||
    die "pip could not install the agent (see above)"
  # Same version number, different build: make sure the verified bits are the ones installed.
  "${pip[@]}" install --no-deps --force-reinstall "$tmp/$filename" ||
    die "pip could not install the agent (see above)"

  local agent=$venv/bin/cloudgpu-agent
  local configure_args=(configure --state "$state" --hub "$hub")
  [[ -z $runtime ]] || configure_args+=(--runtime "$runtime")
  # printf is a shell builtin: the token goes through a pipe, never onto a command line.
  printf '%s\n' "$token" | "$agent" "${configure_args[@]}" >&2 ||
    die "cloudgpu-agent configure failed (see above)"
  token=""

  if ((systemd)); then
    "$agent" install-service --prefix "$prefix" --state "$state" >&2 ||
      die "cloudgpu-agent install-service failed (see above)"
    if ((upgrading)); then
      # enable --now leaves a running agent on the old code. Renters' containers belong to
      # dockerd and survive the restart; the agent re-adopts them.
      systemctl try-restart cloudgpu-agent.service || die "could not restart cloudgpu-agent.service"
    fi
  fi

  # --- check ---------------------------------------------------------------------------------
  say "checking the connection to the hub"
  local smoke=0
  "$agent" smoke --state "$state" --hub "$hub" >&2 || smoke=$?
  case $smoke in
    0) ;;
    3) die "the hub did not answer within 10 s: check that this host can reach $hub (firewall, proxy), then re-run" 3 ;;
    4) die "the hub rejected the token: create a new install command in the hub and re-run with it" 4 ;;
    *) die "the connection check failed (exit $smoke); details: $agent doctor --connectivity --state $state" "$smoke" ;;
  esac
  say "success: cloudgpu-agent $version is installed in $prefix and the hub at $hub answered"
  if ((systemd)); then
    say "the agent runs as a systemd service: systemctl status cloudgpu-agent"
  else
    say "start the agent with: $agent run --state $state"
  fi
}

main "$@"
