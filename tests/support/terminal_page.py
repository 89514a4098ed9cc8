"""What a renter does in the terminal page (hub/web/templates/web/terminal.html) in a real
browser, shared by the browser tests: run a command, resize the window, interrupt a program."""

from __future__ import annotations

from typing import Any

from tests.support.polling import wait_for

TIMEOUT_MS = 60_000


def screen(page: Any) -> str:
    """What the terminal shows, row by row (xterm's DOM renderer keeps each row as text)."""
    return str(page.locator("#terminal .xterm-rows").inner_text())


def runs_a_command(terminal: Any) -> None:
    """The shell answers; without a GPU in the container, `uname` does."""
    from playwright.sync_api import expect

    terminal.locator("#terminal").click()
    terminal.keyboard.type("echo hi && nvidia-smi || uname -a\n")
    expect(terminal.locator("#terminal .xterm-rows")).to_contain_text("Linux", timeout=TIMEOUT_MS)
    assert "hi" in screen(terminal)


def resizes(terminal: Any) -> None:
    """A smaller window: the shell hears the new size."""
    terminal.keyboard.type("stty size\n")
    wait_for(lambda: "stty size" in screen(terminal), timeout_s=30, what="the first size")
    first = screen(terminal).split("stty size")[-1].split()[:2]
    terminal.set_viewport_size({"width": 700, "height": 500})
    terminal.keyboard.type("clear; stty size\n")
    wait_for(
        lambda: (rows := screen(terminal).split("stty size")[-1].split()[:2])
        and len(rows) == 2
        and rows != first,
        timeout_s=30,
        what="the new size",
    )


def ctrl_c_interrupts(terminal: Any, container: Any) -> None:
    """Ctrl-C ends the program in the foreground (it leaves the container's processes), and
    the shell answers again."""
    from playwright.sync_api import expect

    def sleeping() -> bool:
        return any("sleep 600" in row[-1] for row in container.top()["Processes"])

    terminal.keyboard.type("sleep 600\n")
    wait_for(sleeping, timeout_s=30, what="sleep to run")
    terminal.keyboard.press("Control+C")
    wait_for(lambda: not sleeping(), timeout_s=30, what="Ctrl-C to end sleep")
    terminal.keyboard.type("echo back-$((6*7))\n")
    expect(terminal.locator("#terminal .xterm-rows")).to_contain_text("back-42", timeout=TIMEOUT_MS)
