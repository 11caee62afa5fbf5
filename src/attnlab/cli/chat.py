"""attnlab chat: talk to an instruction-tuned model (default SmolLM2-135M-Instruct) through its own chat
template, the reply streamed as it comes, one KV cache kept for the whole conversation.

``--message TEXT`` asks once and exits. From a pipe or a file, each non-empty line of stdin is one message. On a
terminal it behaves as a terminal program does: a one-line banner, line editing and history (the standard
library's ``readline``, where it exists), Ctrl-C during a reply stops that reply and keeps the conversation,
Ctrl-C or Ctrl-D at an empty prompt exits. Lines beginning with ``/`` are commands, never sent to the model:
``/help``, ``/reset``, ``/system TEXT``, ``/exit``. Tokens per second go to stderr after each reply, so stdout
holds only the replies.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time

import numpy as np

from ._app import add_command, add_json_flag, positive_int, print_json
from ._model import load
from .generate import add_model_flag, add_sampling_flags, sampling

COMMANDS = {"/help": "list the commands", "/reset": "start the conversation again",
            "/system TEXT": "start again with TEXT as the system prompt", "/exit": "leave (so do Ctrl-D and Ctrl-C "
            "at an empty prompt)"}


def register(sub) -> None:
    p = add_command(sub, "chat", help="talk to a chat model (default SmolLM2-135M-Instruct), streamed, one KV "
                                      "cache across the turns",
                    beyond="docs/gguf.md",
                    shows="Shows an instruction-tuned model's replies, its own chat template rendered with Jinja2, "
                          "each reply streamed as it comes and stopped at its end-of-turn token",
                    more="Every turn feeds only its new tokens: one KV cache holds the whole conversation. On a "
                         "terminal: Ctrl-C stops a reply, Ctrl-C or Ctrl-D at an empty prompt exits; /help, "
                         "/reset, /system TEXT and /exit are commands.",
                    examples=("attnlab chat --message 'What is the capital of France?' --tokens 12",
                              "attnlab chat --system 'You answer in one sentence.' --message 'What is a cat?' "
                              "--tokens 12"))
    add_model_flag(p)
    p.add_argument("--message", default=None, help="one message: print the reply and exit (default: a loop on "
                                                   "a terminal, or one message per line of stdin)")
    p.add_argument("--system", default=None, help="the system prompt (default: the template's own)")
    p.add_argument("--tokens", type=positive_int, default=256, help="the longest reply, in tokens (default 256)")
    add_sampling_flags(p, temperature=0.0)
    add_json_flag(p)
    p.set_defaults(func=cmd_chat)


def check_stdin(args) -> None:
    """Without --message, messages come from stdin: refuse a closed one before the model loads."""
    if args.message is None and (sys.stdin is None or sys.stdin.closed):
        raise ValueError("stdin is closed, so there is no message to read; give one with --message TEXT")


def piped_lines(most_chars: int):
    """The non-empty lines of stdin (a pipe or a file), each read at most ``most_chars`` + 1 characters at a
    time: a longer line is refused before it is held whole, let alone tokenised."""
    while True:
        line = sys.stdin.readline(most_chars + 1)
        if not line:
            return
        if len(line) > most_chars and not line.endswith("\n"):
            raise ValueError(f"a line of stdin has more than {most_chars:,} characters, more than the model's "
                             "context can hold")
        if line.strip():
            yield line.rstrip("\n")


NUDGES = 40                 # the watcher's tries (every 50 ms) to bring a pending Ctrl-C to the prompt's read


class Terminal:
    """The prompt on a terminal: ``readline``'s line editing and history where it exists, and a Ctrl-C that is
    never lost.

    Python runs its SIGINT handler only in the main thread, and only once a blocked read there is interrupted
    (EINTR). A Ctrl-C the kernel hands to another thread (numpy's BLAS, tokenizers'), or one that comes just
    before readline starts waiting, interrupts nothing, and the read went on blocking. Python's wakeup fd hears
    of every signal, whichever thread takes it; a watcher thread then interrupts the main thread (SIGUSR1, a
    no-op) again and again until a SIGINT handler has run there."""

    def __init__(self):
        try:
            import readline  # noqa: F401  (input() edits lines and keeps a history once it is imported)
            self.readline = readline
        except ImportError:
            self.readline = None
        self.main = threading.main_thread().ident
        self.received = 0                                       # SIGINTs the watcher heard of (its count)
        self.handled_count = 0                                  # SIGINT handlers run in the main thread (its count)
        self.reading = threading.Event()                        # the main thread is at the prompt (input())
        self.read_end, self.write_end = os.pipe()
        os.set_blocking(self.write_end, False)
        signal.signal(signal.SIGUSR1, lambda *_: None)          # only to interrupt the main thread's read
        self.old_fd = signal.set_wakeup_fd(self.write_end, warn_on_full_buffer=False)
        self.old_handler = signal.signal(signal.SIGINT, self.interrupted)
        threading.Thread(target=self.watch, daemon=True, name="attnlab-sigint").start()

    def interrupted(self, *_):
        """The prompt's SIGINT handler (the main thread): Python's own, once the watcher may stop."""
        self.handled()
        raise KeyboardInterrupt

    def handled(self) -> None:
        """A SIGINT handler ran in the main thread (the prompt's, or a reply's :func:`stop_on_ctrl_c`)."""
        self.handled_count += 1

    def watch(self) -> None:
        """Nudge the main thread while it waits at the prompt and a SIGINT it has not handled is pending. The
        counts tell a new Ctrl-C from one a reply's handler already took (whose byte may reach the wakeup fd
        only after the prompt is back); a burst that Python's handler took as one gives up after NUDGES."""
        while True:
            try:
                got = os.read(self.read_end, 64)
            except OSError:
                return
            if not got:
                return
            self.received += got.count(signal.SIGINT)
            for _ in range(NUDGES):
                if self.received <= self.handled_count or not self.reading.is_set():
                    break
                signal.pthread_kill(self.main, signal.SIGUSR1)
                time.sleep(0.05)

    def close(self) -> None:
        signal.signal(signal.SIGINT, self.old_handler)
        signal.set_wakeup_fd(self.old_fd)
        os.close(self.write_end)

    def line(self, prompt: str) -> str | None:
        """The next line typed; None at Ctrl-D or Ctrl-C on an empty line; Ctrl-C on a half-typed line gives
        a new prompt."""
        while True:
            self.reading.set()
            try:
                return input(prompt)
            except EOFError:
                print(file=sys.stderr)
                return None
            except KeyboardInterrupt:
                typed = self.readline.get_line_buffer() if self.readline is not None else ""
                print(file=sys.stderr)
                if not typed.strip():
                    return None
            finally:
                self.reading.clear()


@contextlib.contextmanager
def stop_on_ctrl_c(stopped: threading.Event, terminal: Terminal):
    """While a reply is written: Ctrl-C only sets ``stopped`` (the reply ends at its next token, the caches
    whole); the prompt's handler again after."""
    def stop(*_):
        stopped.set()
        terminal.handled()
    old = signal.signal(signal.SIGINT, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old)


def banner(model, chat) -> str:
    return (f"attnlab chat: {model.name or 'the model'}, context {chat.caches[0].capacity:,} tokens. Commands: "
            f"/help, /reset, /system TEXT, /exit. Ctrl-C stops a reply; Ctrl-C or Ctrl-D at an empty prompt exits.")


def command(chat, line: str) -> bool | None:
    """Run a ``/`` command: True to go on, False to exit, None if ``line`` is a message."""
    if not line.startswith("/"):
        return None
    name, _, rest = line.strip().partition(" ")
    if name == "/exit":
        return False
    if name == "/help":
        print("\n".join(f"  {c:<14} {what}" for c, what in COMMANDS.items()), file=sys.stderr)
    elif name == "/reset":
        chat.reset(chat.system)
        print("(conversation reset)", file=sys.stderr)
    elif name == "/system" and rest.strip():
        chat.reset(rest.strip())
        print("(system prompt set; conversation reset)", file=sys.stderr)
    else:
        print(f"(unknown command {line.strip()!r}; /help lists them)", file=sys.stderr)
    return True


def cmd_chat(args) -> int:
    from ..kernels._threads import one_blas_thread
    from ..stack.chat import Chat, StopReply
    from ..text.tokens import TextStream, most_chars

    check_stdin(args)
    model, tokenizer = load(args, "chat")
    chat = Chat(model, tokenizer, system=args.system)
    rng, turns = np.random.default_rng(args.seed), []
    longest_line = most_chars(tokenizer, chat.caches[0].capacity)
    terminal = Terminal() if args.message is None and sys.stdin.isatty() else None
    if terminal is not None and not args.json:
        print(banner(model, chat), file=sys.stderr)

    def messages():
        if args.message is not None:
            yield args.message
        elif terminal is None:
            yield from piped_lines(longest_line)
        else:
            while (line := terminal.line("you> ")) is not None:
                if line.strip():
                    yield line

    stopped = threading.Event()
    try:
        for message in messages():
            went_on = command(chat, message)
            if went_on is False:
                break
            if went_on:
                continue
            stream = TextStream(tokenizer)

            def on_token(i):
                if not args.json:
                    print(stream.push(i), end="", flush=True)
                if stopped.is_set():
                    raise StopReply

            stopped.clear()
            start = time.perf_counter()
            ctrl_c = stop_on_ctrl_c(stopped, terminal) if terminal is not None else contextlib.nullcontext()
            with one_blas_thread(), ctrl_c:
                reply = chat.say(message, max_tokens=args.tokens, rng=rng, **sampling(args, model),
                                 on_token=on_token)
            seconds = time.perf_counter() - start
            ended, interrupted = bool(reply[-1] in chat.stop), stopped.is_set()
            turns.append({"message": message, "reply": tokenizer.decode(reply), "ids": reply, "ended": ended,
                          "interrupted": interrupted, "tokens_per_second": reply.size / seconds,
                          "context_tokens": chat.length})
            if not args.json:
                print(stream.flush())
                cut = "; stopped by Ctrl-C" if interrupted else "" if ended else f"; cut at --tokens {args.tokens}"
                print(f"({reply.size} tokens, {reply.size / seconds:.1f} tokens/s, {chat.length} in the cache{cut})",
                      file=sys.stderr)
    finally:
        if terminal is not None:
            terminal.close()
    if args.json:
        print_json({"model": model.name, "turns": turns})
    return 0
