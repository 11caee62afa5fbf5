"""A conversation with a chat model: its own chat template rendered with Jinja2, one KV cache for every turn.

An instruction-tuned model was trained on conversations written in one markup, its chat template. SmolLM2
uses ChatML::

    <|im_start|>system
    You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>
    <|im_start|>user
    What is attention?<|im_end|>
    <|im_start|>assistant
    ...the model writes here, and ends with <|im_end|>

The template is a Jinja2 program stored with the model (``tokenizer.chat_template`` in a GGUF file); it is
rendered with the engine it was written for, sandboxed and bounded in time, size and depth
(:mod:`attnlab.stack.chat_template`), with the options transformers uses (``trim_blocks``, ``lstrip_blocks``).
Each turn renders the whole conversation, keeps only the text past what the cache already holds, and feeds just
those tokens: earlier turns are never read again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..text.tokens import check_length, most_chars
from .chat_template import TextTooLong, render_chat
from .transformer import Transformer, check_decoder, generate, new_caches

__all__ = ["Chat", "StopReply", "render_chat"]


class StopReply(Exception):
    """Raised by a reply's ``on_token`` to end the reply at that token, keeping the conversation."""


@dataclass(eq=False)
class Chat:
    """One conversation: the messages so far, and the KV caches holding every token of it but the last.

    ``say(text)`` adds a user message, feeds only the new tokens, generates the reply (streamed through
    ``on_token``) until the end-of-turn token, and returns it. ``capacity`` caps the conversation's tokens
    (default the model's context); past it, ``say`` is a ValueError.
    """
    model: Transformer
    tokenizer: object                           # encode / decode, and a chat_template
    system: str | None = None                   # a system message; None = the template's own default
    capacity: int | None = None
    messages: list = field(default_factory=list)

    def __post_init__(self):
        check_decoder(self.model, "chat")
        self.template = getattr(self.tokenizer, "chat_template", None)
        if not self.template:
            raise ValueError(f"{self.model.name or 'this model'} has no chat template (tokenizer.chat_template)")
        self.capacity = self.model.config.n_ctx if self.capacity is None else self.capacity
        self.caches = new_caches(self.model, min(self.capacity, self.model.config.n_ctx))
        self.stop = self.stop_ids()
        self.text = ""                          # what the caches (and the pending token) hold, as text
        self.pending: list[int] = []            # the last reply's final id, not yet in the caches
        if self.system is not None:
            self.messages.append({"role": "system", "content": self.system})

    def reset(self, system: str | None = None) -> None:
        """Start the conversation again (caches emptied), with ``system`` as its system message (None: the
        template's own default)."""
        if system is not None and not isinstance(system, str):
            raise TypeError(f"system must be a str or None, got {type(system).__name__}")
        for cache in self.caches:
            cache.reset()
        self.system, self.text, self.pending = system, "", []
        self.messages[:] = [] if system is None else [{"role": "system", "content": system}]

    def stop_ids(self) -> tuple[int, ...]:
        """The model's end-of-text ids and the template's end of turn (``<|im_end|>``, ``<|eot_id|>``, …)."""
        ids = set(self.model.config.eos_ids)
        for token in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "</s>"):
            i = self.tokenizer.tokenizer.token_to_id(token) if hasattr(self.tokenizer, "tokenizer") else None
            if i is not None and i < self.model.config.vocab_size:
                ids.add(i)
        return tuple(sorted(ids))

    @property
    def length(self) -> int:
        """Tokens the caches hold."""
        return self.caches[0].length

    def prompt_ids(self, text: str) -> np.ndarray:
        """The ids of this turn: the pending id, then the rendered text past what is already held (n,)."""
        if not isinstance(text, str) or not text.strip():
            raise ValueError("a chat message must hold at least one non-space character")
        capacity = self.caches[0].capacity
        check_length(text, self.tokenizer, capacity, "the message")          # before anything tokenises it
        self.messages.append({"role": "user", "content": text})
        special = {name: getattr(self.tokenizer, "tokenizer").id_to_token(i) for name, i in
                   (("bos_token", getattr(self.tokenizer, "bos_id", None)),
                    ("eos_token", getattr(self.tokenizer, "eos_id", None))) if i is not None}
        try:
            full = render_chat(self.template, self.messages, most_chars=most_chars(self.tokenizer, capacity),
                               source=f"{self.model.name or 'the model'}'s chat template (tokenizer.chat_template)",
                               **special)
        except TextTooLong:
            self.messages.pop()
            raise ValueError(f"the conversation is longer than {most_chars(self.tokenizer, capacity):,} "
                             f"characters as the template writes it, more than the context of {capacity} tokens "
                             "the model can see; start a new chat") from None
        except ValueError:
            self.messages.pop()
            raise
        if not full.startswith(self.text):
            self.messages.pop()
            raise ValueError("the chat template rewrote an earlier turn, so the cache cannot be kept")
        new = full[len(self.text):]
        inner = self.tokenizer.tokenizer
        bos = special.get("bos_token")         # a template that writes it (Llama 2, Gemma): not a second one
        first = not self.text and not (bos is not None and new.startswith(bos))
        ids = np.array(self.pending + inner.encode(new, add_special_tokens=first).ids, np.int64)   # (n,)
        if self.length + ids.size >= self.caches[0].capacity:
            self.messages.pop()
            raise ValueError(f"the conversation needs {self.length + ids.size} tokens, more than the context of "
                             f"{self.caches[0].capacity} tokens the model can see; start a new chat")
        self.text = full
        return ids

    def say(self, text: str, *, max_tokens: int = 256, temperature: float = 0.0,
            rng: np.random.Generator | None = None, top_k: int | None = None, top_p: float | None = None,
            on_token=None) -> np.ndarray:
        """The reply's ids (m,) to the user message ``text``, ending with the end-of-turn id unless
        ``max_tokens`` ran out first; ``on_token(id)`` sees each as it is chosen, and may end the reply there
        by raising :class:`StopReply` (Ctrl-C in ``attnlab chat``): that id is its last, and the conversation
        goes on from it as from any reply."""
        ids = self.prompt_ids(text)                                              # (n,)
        room = self.caches[0].capacity - self.length - ids.size
        seen: list[int] = []

        def see(i: int) -> None:
            seen.append(i)
            if on_token is not None:
                on_token(i)

        try:
            reply = generate(self.model, ids, min(max_tokens, room), temperature=temperature, rng=rng,
                             stop=self.stop, top_k=top_k, top_p=top_p, on_token=see, caches=self.caches)   # (m,)
        except StopReply:                       # raised by on_token: the reply ends with the id it was given
            if not seen:
                raise
            reply = np.array(seen, np.int64)                                     # (m,)
        self.pending = [int(reply[-1])]
        self.text += self.tokenizer.tokenizer.decode(reply.tolist(), skip_special_tokens=False)
        self.messages.append({"role": "assistant", "content": self.tokenizer.decode(reply)})
        return reply
