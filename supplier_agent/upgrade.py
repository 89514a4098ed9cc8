"""``cloudgpu-agent upgrade``: install the hub's current agent wheel next to the running one,
smoke-test it, then switch to it.

A virtualenv cannot be moved (its scripts name their interpreter by absolute path), so every
version gets its own ``<prefix>/venvs/<version>/`` and ``<prefix>/venv`` is a symlink to the
current one, replaced in one ``rename``. The systemd unit starts
``<prefix>/venv/bin/cloudgpu-agent``, so the switch is the symlink plus a service restart.

Nothing changes until the new version has passed ``version`` and ``smoke`` from its own
virtualenv; a failure deletes the side virtualenv and leaves the running one alone. The previous
version's folder stays for one manual rollback. Containers are never touched: they belong to
dockerd and the restarted agent re-adopts them.

Under systemd the new version must then stay up ``--health-window`` seconds after the restart,
or the link is swapped back. With ``--no-systemd`` nobody here can restart the agent, so the
window is spent before the switch instead: ``run --trial`` runs the new version's real start-up
(state, Docker/NVML, a probe to the hub) for that long, without the state lock, GPUs or
containers, and a version that crashes there is deleted unswitched. Without that flag a host
with no systemd, or no unit, is refused before anything is downloaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import hmac
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from supplier_agent import __version__, release_signing, venv_seed
from supplier_agent.config import config_path, write_file
from supplier_agent.service import (
    SERVICE,
    SYSTEMCTL_TIMEOUT_S,
    ServiceError,
    require_root,
    systemd_problem,
    watch_service,
)
from supplier_agent.state import lock_holder
from supplier_agent.upgrade_fetch import (
    Deadline,
    Release,
    UpgradeError,
    download,
    fetch_release,
    release_url_for,
    version_key,
)

__all__ = ["UpgradeError", "release_url_for", "rollback", "upgrade"]

VENV_TIMEOUT_S = 300
PIP_TIMEOUT_S = 1800
CHECK_TIMEOUT_S = 60  # smoke gives up after 10 s itself
# `run --trial` gets its window plus this for its start-up (imports, Docker, NVML, the probe).
TRIAL_SLACK_S = 60
DEADLINE_S = 600  # the whole upgrade, as docs/suppliers.md promises; the rollback is not counted
HEALTH_WINDOW_S = 30
LEGACY_PREVIOUS = "venv.previous"
# Written at each switch: the version and folder the link pointed at before, for a rollout's
# `rollback` (self_upgrade.py); removed once used.
ROLLBACK_RECORD = ".rollback.json"
# The installer (install.sh) takes the same lock with flock(1): never both at once.
LOCK_NAME = ".upgrade.lock"


# --- the installation under the prefix -----------------------------------------------------


@contextlib.contextmanager
def _upgrade_lock(prefix: Path) -> Iterator[None]:
    fd = os.open(prefix / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UpgradeError(f"another install or upgrade of {prefix} is running") from None
        yield
    finally:
        os.close(fd)  # drops the lock


def _run(argv: list[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"timed out after {timeout_s:.0f} s")
    except OSError as exc:
        return subprocess.CompletedProcess(argv, 127, "", f"cannot run {argv[0]}: {exc}")


def _tail(result: subprocess.CompletedProcess[str], lines: int = 8) -> str:
    text = (result.stderr.strip() or result.stdout.strip()).splitlines()
    return "\n    ".join(text[-lines:]) or "(no output)"


def _step(what: str, argv: list[str], step_limit_s: float, deadline: Deadline) -> str:
    """Run one step within its own limit and the overall budget; its stdout, or an error that
    names the step (and says whether the step's limit or the whole budget ran out)."""
    timeout_s = deadline.limit(what, step_limit_s)
    result = _run(argv, timeout_s)
    if result.returncode == 124:
        if timeout_s < step_limit_s:
            raise deadline.overran(f"while it was {what}")
        raise UpgradeError(f"timed out: {what} took longer than {timeout_s:.0f} s")
    if result.returncode != 0:
        raise UpgradeError(f"could not {what} (exit {result.returncode}):\n    {_tail(result)}")
    return result.stdout


def _free_dir(venvs: Path, version: str) -> Path:
    # The same version again (--force) gets a fresh folder: the running one is never rebuilt.
    candidate, n = venvs / version, 1
    while candidate.exists() or candidate.is_symlink():
        n += 1
        candidate = venvs / f"{version}-{n}"
    return candidate


def _trial_run(
    agent: str, state_dir: Path, version: str, window_s: float, deadline: Deadline
) -> None:
    """``run --trial`` of the new version, for ``--no-systemd``: its real start-up and
    ``window_s`` seconds up, next to the running agent. Raises with the trial's own last line."""
    what = "the trial run"
    step_limit_s = window_s + TRIAL_SLACK_S
    timeout_s = deadline.limit(what, step_limit_s)
    argv = [agent, "run", "--trial", f"{window_s:g}", "--state", str(state_dir)]
    result = _run(argv, timeout_s)
    if result.returncode == 0:
        return
    if result.returncode == 2 and "unrecognized arguments: --trial" in result.stderr:
        # A version from before `run --trial` (--allow-downgrade): nothing to try it with.
        print(f"upgrade: warning: version {version} has no `run --trial`; switching untried")
        return
    if result.returncode == 124:
        if timeout_s < step_limit_s:
            raise deadline.overran(f"during {what}")
        raise UpgradeError(
            f"version {version} hung in its trial run: no end after {timeout_s:.0f} s"
        )
    lines = (result.stderr.strip() or result.stdout.strip()).splitlines()
    reason = lines[-1].strip() if lines else f"exit {result.returncode}, no output"
    # The lines before it are the end of its log: a crash's traceback.
    tail = "".join(f"\n    {line}" for line in lines[-9:-1])
    raise UpgradeError(
        f"version {version} failed its {window_s:g} s trial run (`run --trial`): {reason}{tail}"
    )


def _build_side_venv(
    target: Path,
    wheel: Path,
    release: Release,
    state_dir: Path,
    deadline: Deadline,
    trial_s: float | None = None,
) -> None:
    """Create ``target`` with the wheel installed and prove it works (``version``, ``smoke``,
    and with ``trial_s`` a ``run --trial`` that long); delete it if not."""
    python, agent = str(target / "bin" / "python"), str(target / "bin" / "cloudgpu-agent")
    pip = [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input"]
    # The running pip, copied in, instead of ensurepip's unpacking and compiling (venv_seed.py).
    seed = venv_seed.running_pip()
    try:
        print("upgrade: create the virtualenv")
        _step(
            "create the virtualenv",
            [sys.executable, "-m", "venv", *(["--without-pip"] if seed else []), str(target)],
            VENV_TIMEOUT_S,
            deadline,
        )
        if seed is not None:
            where = _step(
                "find the virtualenv's site-packages",
                [python, "-c", venv_seed.PURELIB],
                CHECK_TIMEOUT_S,
                deadline,
            )
            try:
                seed.copy_into(Path(where.strip()))
            except OSError as exc:
                raise UpgradeError(
                    f"could not copy pip {seed.version} into {target}: {exc}"
                ) from None
        print("upgrade: install the wheel")
        _step("install the wheel", [*pip, str(wheel)], PIP_TIMEOUT_S, deadline)
        reported = _step("run `version`", [agent, "version"], CHECK_TIMEOUT_S, deadline)
        if not reported.startswith(f"cloudgpu-agent {release.version} "):
            raise UpgradeError(
                f"the new agent does not report version {release.version}: {reported.strip()!r}"
            )
        print(f"upgrade: smoke test of {release.version} against the hub")
        try:
            _step("smoke", [agent, "smoke", "--state", str(state_dir)], CHECK_TIMEOUT_S, deadline)
        except UpgradeError as exc:
            raise UpgradeError(f"version {release.version} failed its smoke test: {exc}") from None
        if trial_s is not None:
            print(f"upgrade: trial run of {release.version} for {trial_s:g} s (`run --trial`)")
            _trial_run(agent, state_dir, release.version, trial_s, deadline)
    except BaseException:
        shutil.rmtree(target, ignore_errors=True)
        raise


def _point_link(prefix: Path, target: Path) -> None:
    link, tmp_link = prefix / "venv", prefix / ".venv.swap"
    with contextlib.suppress(FileNotFoundError):
        tmp_link.unlink()
    tmp_link.symlink_to(target.relative_to(prefix) if target.is_relative_to(prefix) else target)
    os.replace(tmp_link, link)  # rename(2): readers see the old or the new venv, never neither
    dir_fd = os.open(prefix, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def _swap(prefix: Path, target: Path) -> Path:
    """Point ``<prefix>/venv`` at ``target``; return what it pointed at before."""
    link = prefix / "venv"
    if link.is_symlink():
        previous = link.resolve()
    else:
        # A plain virtualenv from an older installer: keep it whole, under a name that can be
        # renamed back to `venv` (its scripts need that exact path to run).
        previous = prefix / LEGACY_PREVIOUS
        if previous.exists():
            shutil.rmtree(previous)
        os.rename(link, previous)
    _point_link(prefix, target)
    return previous


def _swap_back(prefix: Path, previous: Path, target: Path) -> None:
    link = prefix / "venv"
    if previous.name == LEGACY_PREVIOUS:
        link.unlink()
        os.rename(previous, link)
    else:
        _point_link(prefix, previous)
    shutil.rmtree(target, ignore_errors=True)


def _prune(prefix: Path, keep: set[Path]) -> None:
    """Remove versions older than the previous one (one manual rollback is kept)."""
    keep = {path.resolve() for path in keep}
    candidates = [*sorted((prefix / "venvs").iterdir()), prefix / LEGACY_PREVIOUS]
    for path in candidates:
        if path.is_dir() and not path.is_symlink() and path.resolve() not in keep:
            print(f"upgrade: removing old version {path}")
            shutil.rmtree(path, ignore_errors=True)


def _restart_and_watch(version: str, health_window_s: float, deadline: Deadline) -> str | None:
    """Restart the service on the new version; ``None`` if it held up, else why not."""
    # The agent stops (KillMode=process), containers keep running and are re-adopted.
    try:
        timeout_s = deadline.limit("restarting the service", SYSTEMCTL_TIMEOUT_S)
    except UpgradeError as exc:
        return str(exc)
    result = _run(["systemctl", "restart", SERVICE], timeout_s)
    if result.returncode != 0:
        return f"`systemctl restart {SERVICE}` failed: {_tail(result)}"
    print(f"upgrade: restarted {SERVICE}; watching it for {health_window_s:g} s")
    return watch_service(health_window_s)


def _say_who_restarts(state_dir: Path, link: Path, version: str) -> None:
    """--no-systemd: this command restarts nothing; say whether an agent still runs the old
    version, so nobody believes the new one is live."""
    start = f"{link}/bin/cloudgpu-agent run --state {state_dir}"
    pid = lock_holder(state_dir)
    if pid is not None:
        print(
            f"upgrade: --no-systemd: an agent (pid {pid}) is running on {state_dir} and still "
            f"runs {__version__}: whoever started it must restart it to run {version} ({start})"
        )
    else:
        print(
            f"upgrade: --no-systemd: no agent is running on {state_dir} now; started again "
            f"({start}), it runs {version}"
        )


def _check_signature(release: Release, release_keys: tuple[str, ...]) -> str | None:
    """The pinned key that signed ``release``, None on an agent that pins none; raises if it
    pins some and none of them signed it (before anything is downloaded)."""
    if not release_keys:
        print(
            "upgrade: WARNING: this agent pins no release key, so nobody's signature is checked "
            "(cloudgpu-agent configure --update --release-key KEY pins the hub operator's)"
        )
        return None
    try:
        used = release_signing.verify(
            release.version,
            release.filename,
            release.sha256,
            release.next_keys,
            release.signatures,
            release_keys,
        )
    except release_signing.SignatureError as exc:
        raise UpgradeError(
            f"refusing release {release.version}: {exc}; nothing was changed"
        ) from None
    print(
        f"upgrade: release {release.version} is signed by pinned key {release_signing.key_id(used)}"
    )
    return used


def _pin_next_keys(state_dir: Path, pinned: tuple[str, ...], next_keys: tuple[str, ...]) -> None:
    """Key rotation: a release a pinned key signed names the keys later ones may use."""
    try:
        merged = release_signing.parse_keys([*pinned, *next_keys])
    except release_signing.SignatureError as exc:
        print(f"upgrade: WARNING: the release's next keys were not pinned: {exc}")
        return
    if merged == pinned:
        return
    path = config_path(state_dir)
    write_file(state_dir, {"release_keys": ",".join(merged)}, path=path, base=path)
    added = [release_signing.key_id(k) for k in merged if k not in pinned]
    print(f"upgrade: pinned the release's next key(s) {', '.join(added)} in {path}")


def _record_rollback(prefix: Path, previous: Path) -> None:
    if previous.name == LEGACY_PREVIOUS:
        return  # a plain virtualenv cannot be linked to: only the manual rename gets it back
    record = {"version": __version__, "path": str(previous)}
    tmp = prefix / f"{ROLLBACK_RECORD}.tmp"
    tmp.write_text(json.dumps(record))
    os.replace(tmp, prefix / ROLLBACK_RECORD)


def rollback(prefix: Path, version: str) -> Path:
    """Point ``<prefix>/venv`` back at the version the last upgrade switched away from, if that
    was ``version``; the folder it now points at. Raises UpgradeError with why not. The caller
    restarts the agent (systemd, or self_upgrade's re-exec)."""
    prefix = prefix.absolute()
    with _upgrade_lock(prefix):
        try:
            record = json.loads((prefix / ROLLBACK_RECORD).read_text())
            recorded, previous = str(record["version"]), Path(str(record["path"]))
        except FileNotFoundError:
            raise UpgradeError(
                f"nothing to roll back to: no upgrade recorded under {prefix}"
            ) from None
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise UpgradeError(f"cannot read {prefix / ROLLBACK_RECORD}: {exc}") from None
        if recorded != version:
            raise UpgradeError(
                f"the version before the last upgrade was {recorded}, not {version}: "
                "not rolled back"
            )
        if not (previous / "bin" / "cloudgpu-agent").exists():
            raise UpgradeError(f"version {version}'s folder {previous} is gone: not rolled back")
        _point_link(prefix, previous)
        (prefix / ROLLBACK_RECORD).unlink()
        return previous


def upgrade(
    prefix: Path,
    state_dir: Path,
    release_url: str,
    *,
    no_systemd: bool = False,
    force: bool = False,
    allow_downgrade: bool = False,
    deadline_s: float = DEADLINE_S,
    health_window_s: float = HEALTH_WINDOW_S,
    release_keys: tuple[str, ...] = (),
    expect_version: str | None = None,
) -> int:
    # Checked before anything is downloaded or changed, not at the restart.
    if not no_systemd and (why := systemd_problem()) is not None:
        raise UpgradeError(
            f"cannot restart the agent: {why}; nothing was changed. Rerun with --no-systemd "
            "(the new version gets a trial run instead, then you restart the agent yourself)"
        )
    try:
        require_root(no_systemd, "--no-systemd and restart the agent yourself")
    except ServiceError as exc:
        raise UpgradeError(str(exc)) from None
    deadline = Deadline(deadline_s)
    prefix = prefix.absolute()
    link = prefix / "venv"
    if not (link / "bin" / "cloudgpu-agent").exists():
        raise UpgradeError(f"no agent installed at {link}; run the installer first")
    with _upgrade_lock(prefix):
        print(f"upgrade: reading {release_url}")
        release = fetch_release(release_url, deadline)
        if expect_version is not None and release.version != expect_version:
            # A rollout's version, and the hub has moved on to another since it started.
            raise UpgradeError(
                f"the hub serves version {release.version}, not the rollout's {expect_version}; "
                "nothing was changed"
            )
        if release.version == __version__ and not force:
            print(f"upgrade: already at version {__version__}; nothing to do (--force reinstalls)")
            return 0
        if version_key(release.version) < version_key(__version__) and not allow_downgrade:
            raise UpgradeError(
                f"the hub offers {release.version}, older than the running {__version__}: "
                "refusing to downgrade (--allow-downgrade does it); nothing was changed"
            )
        signed_by = _check_signature(release, release_keys)
        print(f"upgrade: {__version__} -> {release.version}")
        with tempfile.TemporaryDirectory(prefix="cloudgpu-upgrade-") as tmp:  # mode 0700
            wheel = Path(tmp) / release.filename
            print(f"upgrade: downloading {release.url}")
            digest = download(release.url, wheel, deadline)
            if not hmac.compare_digest(digest, release.sha256):
                raise UpgradeError(
                    f"sha256 mismatch for {release.filename}: the hub says {release.sha256}, "
                    f"the download is {digest}; refusing it, nothing was changed"
                )
            venvs = prefix / "venvs"
            venvs.mkdir(mode=0o755, exist_ok=True)
            target = _free_dir(venvs, release.version)
            try:
                # Without systemd nothing watches the new version after the switch: its
                # health window is a trial run before it.
                trial_s = health_window_s if no_systemd else None
                _build_side_venv(target, wheel, release, state_dir, deadline, trial_s)
            except UpgradeError as exc:
                raise UpgradeError(
                    f"{exc}\nrolled back: removed {target}; {link} still runs {__version__}"
                ) from None
        previous = _swap(prefix, target)
        _record_rollback(prefix, previous)
        print(f"upgrade: {link} -> {target}")
        if no_systemd:
            _say_who_restarts(state_dir, link, release.version)
        elif (why := _restart_and_watch(release.version, health_window_s, deadline)) is not None:
            _swap_back(prefix, previous, target)
            with contextlib.suppress(FileNotFoundError):
                (prefix / ROLLBACK_RECORD).unlink()
            back = _run(["systemctl", "restart", SERVICE], SYSTEMCTL_TIMEOUT_S)
            restarted = "restarted it" if back.returncode == 0 else "could NOT restart it"
            raise UpgradeError(
                f"version {release.version} did not stay up: {why}\n"
                f"rolled back: {link} runs {__version__} again and {restarted}; removed {target}"
            )
        _prune(prefix, {target, previous})
        if signed_by is not None and release.next_keys:
            _pin_next_keys(state_dir, release_keys, release.next_keys)
        restart = "" if no_systemd else f" && systemctl restart {SERVICE}"
        if previous.name == LEGACY_PREVIOUS:
            print(f"upgrade: done. To go back: rm {link} && mv {previous} {link}{restart}")
        else:
            print(
                f"upgrade: done. To go back: ln -sfn {previous} {link}.swap && "
                f"mv -T {link}.swap {link}{restart}"
            )
        return 0
