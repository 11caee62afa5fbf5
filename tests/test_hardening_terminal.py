"""``attnlab chat`` on a terminal (issue 34, part 5; issue 31, cause 5), driven through a pseudo-terminal
(the standard library's ``pty``) with a tiny GGUF model: Ctrl-C during a reply stops it and keeps the
conversation, Ctrl-C or Ctrl-D at an empty prompt exits, a Ctrl-C as soon as the prompt appears is never lost,
commands are never sent to the model. Then the terminal's other edges: stdin closed, Ctrl-C during the imports,
a temperature too small to divide by."""

from __future__ import annotations

import os
import re
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("jinja2")
pty = pytest.importorskip("pty")

SRC = str(Path(__file__).resolve().parents[1] / "src")
WAIT = 120                      # seconds a step may take on a loaded machine before the test gives up


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, gguf_files):
    return gguf_files.write_gguf(tmp_path_factory.mktemp("chat") / "tiny.gguf", meta={"context_length": 4096})


def env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))


class Session:
    """``attnlab chat`` on the far side of a pseudo-terminal: ``send`` types, ``expect`` reads until a pattern."""

    def __init__(self, *argv):
        self.pid, self.fd = pty.fork()
        if self.pid == 0:                                     # the child: the pty is its controlling terminal
            os.execve(sys.executable, [sys.executable, "-m", "attnlab_launch", "chat", *map(str, argv)], env())
        self.seen = b""
        self.status = None

    def expect(self, pattern: bytes, start: int = 0) -> int:
        """Read until ``pattern`` appears after byte ``start`` of the transcript; returns where it ends."""
        end = time.monotonic() + WAIT
        while (at := self.seen.find(pattern, start)) < 0:
            assert time.monotonic() < end and self.read(1.0) is not None, (pattern, self.seen[-800:])
        return at + len(pattern)

    def read(self, timeout: float) -> bytes | None:
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return b""
        try:
            got = os.read(self.fd, 65536)
        except OSError:                                       # the child exited: its end of the pty closed
            return None
        self.seen += got
        return got if got else None

    def send(self, text: bytes) -> None:
        os.write(self.fd, text)

    def exit_code(self) -> int:
        end = time.monotonic() + WAIT
        while time.monotonic() < end:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.read(0.1)
                os.close(self.fd)
                return os.waitstatus_to_exitcode(status)
            self.read(0.2)
        os.kill(self.pid, signal.SIGKILL)
        os.waitpid(self.pid, 0)
        raise AssertionError(f"chat did not exit; it printed {self.seen[-800:]!r}")

    def cache_counts(self) -> list[int]:
        return [int(n) for n in re.findall(rb"(\d+) in the cache", self.seen)]


def test_ctrl_c_during_a_reply_stops_it_and_keeps_the_conversation(tiny):
    chat = Session("--model", tiny, "--tokens", "3000")
    at = chat.expect(b"you> ")
    assert b"context 4,096 tokens" in chat.seen and b"/help, /reset, /system TEXT, /exit" in chat.seen
    banner = chat.seen.rsplit(b"you> ", 1)[0].rstrip(b"\r\n").rsplit(b"\n", 1)[-1]
    assert b"context 4,096 tokens" in banner and b"/exit" in banner   # the banner is one line (after the load's bar)
    chat.send(b"the cat\r")
    at = chat.expect(b"the cat\r\n", at)
    # the reply has begun: text past readline's own escapes (bracketed paste's "\x1b[?2004l" comes while
    # readline still holds the terminal) …
    while not re.sub(rb"\x1b\[[0-9;?]*[A-Za-z]", b"", chat.seen[at:]).strip():
        assert chat.read(1.0) is not None, chat.seen[-800:]
    chat.read(0.3)
    chat.send(b"\x03")                                        # … Ctrl-C
    at = chat.expect(b"stopped by Ctrl-C)", at)
    at = chat.expect(b"you> ", at)
    chat.send(b"the\r")
    at = chat.expect(b"in the cache", at)
    at = chat.expect(b"you> ", at)
    chat.send(b"\x04")                                        # Ctrl-D at an empty prompt
    assert chat.exit_code() == 0
    first, second = chat.cache_counts()
    assert first < 3000 and second > first + 2                # the second turn went on from the first
    assert b"Traceback" not in chat.seen and b"KeyboardInterrupt" not in chat.seen


@pytest.mark.parametrize("attempt", range(6))
def test_ctrl_c_as_soon_as_the_prompt_appears_is_never_lost(tiny, attempt):
    chat = Session("--model", tiny)
    chat.expect(b"you> ")
    chat.send(b"\x03")
    assert chat.exit_code() == 0
    assert b"Traceback" not in chat.seen


def test_commands_are_never_sent_to_the_model(tiny):
    chat = Session("--model", tiny, "--tokens", "4")
    at = chat.expect(b"you> ")
    for line in (b"the cat", b"/help", b"/nonsense", b"/reset", b"the cat", b"/system You are a cat.", b"the cat"):
        chat.send(line + b"\r")
        at = chat.expect(b"you> ", at + len(line))
    assert b"/system TEXT" in chat.seen and b"unknown command '/nonsense'" in chat.seen
    chat.send(b"/exit\r")
    assert chat.exit_code() == 0
    alone, again, with_system = chat.cache_counts()
    assert alone == again                                     # /reset: the same message, from an empty cache
    system = len(b"<|endoftext|>system\nYou are a cat.<|im_end|>\n")   # the tiny template's system turn
    assert with_system > alone and b"(conversation reset)" in chat.seen
    assert with_system - alone <= system                      # the system turn, never the commands' text


def test_a_half_typed_line_and_ctrl_c_give_a_new_prompt(tiny):
    chat = Session("--model", tiny, "--tokens", "2")
    at = chat.expect(b"you> ")
    chat.send(b"the ca")
    chat.expect(b"the ca", at)
    chat.send(b"\x03")
    at = chat.expect(b"you> ", at)
    chat.send(b"\x04")
    assert chat.exit_code() == 0


def test_system_sets_the_system_prompt(tiny, cli):
    plain = cli.json("chat", "--model", tiny, "--message", "the cat", "--tokens", "2")
    told = cli.json("chat", "--model", tiny, "--message", "the cat", "--tokens", "2", "--system", "You are a cat.")
    added = len("<|endoftext|>system\nYou are a cat.<|im_end|>\n")
    assert plain["turns"][0]["context_tokens"] < told["turns"][0]["context_tokens"] <= \
        plain["turns"][0]["context_tokens"] + added


# --- the terminal's other edges (issue 31, cause 5) --------------------------------------------------------------

def test_chat_with_stdin_closed_is_one_line(tiny):
    run = subprocess.run([sys.executable, "-m", "attnlab_launch", "chat", "--model", str(tiny)], env=env(),
                         preexec_fn=lambda: os.close(0), capture_output=True, text=True, timeout=WAIT)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == ["attnlab: error: stdin is closed, so there is no message to read; "
                                               "give one with --message TEXT"]


def mapped(pid: int, name: str) -> bool:
    try:
        return name in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.skipif(not Path("/proc/self/maps").exists(), reason="needs /proc to see the imports begin")
@pytest.mark.parametrize("after", ["numpy", "attnlab"])
def test_ctrl_c_during_the_imports_is_no_traceback(tiny, after):
    """SIGINT once numpy's extension is mapped (attnlab's imports under way), or once the first attnlab module is
    read: whatever the process was doing, it ends with at most one line and no traceback."""
    child = subprocess.Popen([sys.executable, "-m", "attnlab_launch", "--version"], env=env(),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = "_multiarray_umath" if after == "numpy" else "numba"
    end = time.monotonic() + WAIT
    while child.poll() is None and not mapped(child.pid, marker) and time.monotonic() < end:
        time.sleep(0.002)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=WAIT)
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert (child.returncode, err.strip()) in ((130, "attnlab: interrupted"), (0, "")), (child.returncode, err)


def test_a_temperature_too_small_to_divide_by_is_one_line(tiny, cli):
    cli.error(["generate", "--model", tiny, "--prompt", "the cat", "--tokens", "2", "--temperature", "1e-320"],
              "temperature 1e-320 is too small to divide by")
