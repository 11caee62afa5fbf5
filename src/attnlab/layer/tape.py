"""The tape: what a forward pass keeps for its backward, recorded by the forward itself.

Every piece of the stack (a norm, an MLP, an attention layer, a block, the embedding, the unembedding) has
one forward. Called with ``tape=None`` it keeps nothing (inference pays nothing); called with a :class:`Tape`
it also keeps, under its own name, exactly what its backward needs (llm.c's rule), and its backward reads
it back. So training, attribution and inference run the same code, and cannot drift apart.

Names are those of the hook points' pieces ("embed", "blocks.0.ln_1", "blocks.0.attn", "ln_final",
"unembed"); ``tape.scoped("blocks.0.")`` is the view a block's parts get, as ``hooks.scoped`` is.

>>> tape = Tape()
>>> tape.scoped("blocks.0.").scoped("ln_1").keep("what ln_1's backward needs")
>>> tape["blocks.0.ln_1"]
"what ln_1's backward needs"
"""

from __future__ import annotations


class Tape:
    """What a forward pass kept for its backward, by piece name; one tape per pass."""

    def __init__(self, saved: dict | None = None, prefix: str = ""):
        self.saved = {} if saved is None else saved      # full piece name -> that piece's saved forward
        self.prefix = prefix

    def keep(self, value) -> None:
        """Keep ``value`` under this view's own name (a piece's forward calls it once)."""
        if self.prefix in self.saved:
            raise ValueError(f"the tape already holds {self.prefix!r}: one tape records one forward pass")
        self.saved[self.prefix] = value

    def scoped(self, name: str) -> "Tape":
        """The view a sub-piece records through: its name appended to this view's."""
        return Tape(self.saved, self.prefix + name)

    def __getitem__(self, name: str):
        """What the piece ``name`` (relative to this view) kept."""
        return self.saved[self.prefix + name]

    def __contains__(self, name: str) -> bool:
        return self.prefix + name in self.saved

    @property
    def value(self):
        """What this view's own piece kept."""
        return self.saved[self.prefix]

    def __repr__(self) -> str:
        inside = [k[len(self.prefix):] for k in self.saved if k.startswith(self.prefix)]
        return f"Tape({self.prefix!r}: {inside})"
