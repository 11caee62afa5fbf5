"""A model's chat template, rendered as untrusted code: Jinja2's immutable sandbox (no attribute escapes, no
mutation of lists or dicts), plus bounds on what the sandbox leaves open: time, memory and recursion.

A chat template is a Jinja2 program stored in the model file (``tokenizer.chat_template``). The sandbox stops it
from reaching Python's internals, but not from looping for ever, building a string of 10⁸ characters or
recursing until Python gives up. Here every render gets a budget, counted, never timed (the same template gives
the same answer on any machine, in any thread):

- **steps**: each loop turn, call, filter and operator costs ``TURN`` steps, and each character or item of a
  value it makes costs one, up to ``MOST_STEPS`` (about a second of work);
- **size**: no value a template makes (a string, a list) may hold more than ``MOST_VALUE`` characters or items,
  and a product that would (``'a' * 10**8``, ``'%0999999999d'``, ``replace`` by a long string, ``lipsum(10**7)``)
  is refused before it is computed; the rendered text stops at ``most_chars``;
- **depth**: macro and recursive-loop calls nest at most ``MOST_DEPTH`` deep.

Whatever a template raises (a limit, ``1/0``, an undefined name, a syntax error, Python's RecursionError) is one
``ValueError`` naming the template.
"""

from __future__ import annotations

import functools
import re

MOST_VALUE = 1 << 20            # characters or items of one value: 1 MiB of text, far beyond any prompt
MOST_PRODUCT = 1 << 26         # two sizes handed to one call: one inserted between the other's pieces
MOST_OUTPUT = 1 << 22           # characters a render may write unless the caller asks for fewer
MOST_STEPS = 1 << 26            # the work budget: 2^20 loop turns or calls, or 2^26 characters handled
TURN = 64                       # the steps one loop turn, call, filter or operator costs
MOST_DEPTH = 64                 # nested macro and recursive-loop calls
MOST_LIPSUM_WORDS = 10_000      # lipsum(n, max=…): n paragraphs of at most max words
COUNTED = "_attnlab_counted"    # the filter every {% for %} iterates through
CONCAT = "_attnlab_concat"      # the filter every ~ becomes
SERIALISING = ("tojson", "pprint", "string", "join", "format", "xmlattr", "urlencode", "list")


class TextTooLong(ValueError):
    """The rendered text passed ``most_chars``: the conversation, not the template, is too long."""


class TemplateLimit(BaseException):
    """A bound the template ran into. A BaseException, so that no ``except Exception`` inside a filter swallows
    it; :func:`render_chat` turns it into a ValueError."""


def bounded_environment():
    """A fresh :class:`jinja2.sandbox.ImmutableSandboxedEnvironment` subclass instance with its own budget."""
    from jinja2 import nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment
    from jinja2.visitor import NodeTransformer

    class Bounded(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**", "%", "+"})

        def __init__(self):
            super().__init__(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
            self.steps, self.depth = 0, 0
            self.filters = {name: self.guarded(f, name) for name, f in self.filters.items()}
            self.filters[COUNTED], self.filters[CONCAT] = self.counted, self.concat
            self.globals.update(range=self.range, lipsum=self.lipsum, raise_exception=raise_exception)

        # -- the budget ------------------------------------------------------------------------------------
        def charge(self, steps: int) -> None:
            self.steps += steps
            if self.steps > MOST_STEPS:
                raise TemplateLimit(f"it ran past its work budget ({MOST_STEPS:,} steps: loop turns, calls and "
                                    "characters handled)")

        def made(self, value):
            """A value the template made: charged by its size, refused past MOST_VALUE."""
            if isinstance(value, (str, list, tuple, dict, set)):
                if len(value) > MOST_VALUE:
                    raise TemplateLimit(f"it made a value of {len(value):,} characters or items (at most "
                                        f"{MOST_VALUE:,})")
                self.charge(len(value))
            return value

        def counted(self, iterable):
            for item in iterable:
                self.charge(TURN)
                yield item

        def concat(self, *values):
            """``a ~ b``: measured before it is joined (a ``{% set x = x ~ x %}`` chain doubles each time)."""
            texts = [v if isinstance(v, str) else str(v) for v in values]
            check_size(sum(map(len, texts)), "~")
            return self.made("".join(texts))

        def _parse(self, source, name, filename):
            return Counted().visit(super()._parse(source, name, filename))

        # -- what the sandbox intercepts ---------------------------------------------------------------------
        def call(__self, __context, __obj, *args, **kwargs):   # noqa: N805  (jinja2's own signature)
            __self.charge(TURN)
            check_arguments(__obj, args, kwargs)
            args = check_string_method(__obj, args)
            __self.depth += 1
            try:
                if __self.depth > MOST_DEPTH:
                    raise TemplateLimit(f"its calls nest more than {MOST_DEPTH} deep (a macro or loop that "
                                        "recurses without end?)")
                return __self.made(super().call(__context, __obj, *args, **kwargs))
            finally:
                __self.depth -= 1

        def call_binop(self, context, operator, left, right):
            self.charge(TURN)
            check_operator(operator, left, right)
            return self.made(super().call_binop(context, operator, left, right))

        def getattr(self, obj, attribute):
            self.charge(1)
            return super().getattr(obj, attribute)

        def getitem(self, obj, argument):
            self.charge(1)
            return super().getitem(obj, argument)

        def guarded(self, f, name):
            @functools.wraps(f)                              # keeps jinja2's pass_context / pass_eval_context mark
            def filtered(*args, **kwargs):
                self.charge(TURN)
                check_arguments(name, args, kwargs)
                check_filter(name, (*args, *kwargs.values()))
                return self.made(f(*args, **kwargs))
            return filtered

        def range(self, *args):
            from jinja2.sandbox import safe_range

            check_arguments("range", args, {})
            r = safe_range(*args)                            # at most jinja2's MAX_RANGE items
            self.charge(len(r))
            return r

        def lipsum(self, n=5, html=True, min=20, max=100):   # noqa: A002  (jinja2's names)
            from jinja2.utils import generate_lorem_ipsum

            if not all(isinstance(x, int) for x in (n, min, max)) or n * max > MOST_LIPSUM_WORDS:
                raise TemplateLimit(f"lipsum({n}, max={max}) asks for more than {MOST_LIPSUM_WORDS:,} words")
            return self.made(generate_lorem_ipsum(n=n, html=html, min=min, max=max))

    class Counted(NodeTransformer):
        """Every ``{% for %}`` iterates through the counting filter; every ``~`` is the measuring one."""

        def visit_For(self, node):
            node = self.generic_visit(node)
            node.iter = nodes.Filter(node.iter, COUNTED, [], [], None, None, lineno=node.lineno)
            return node

        def visit_Concat(self, node):
            node = self.generic_visit(node)
            return nodes.Filter(node.nodes[0], CONCAT, node.nodes[1:], [], None, None, lineno=node.lineno)

    return Bounded()


def raise_exception(message):
    """What transformers' templates call to refuse a conversation (a role they do not know, say)."""
    from jinja2 import TemplateError

    raise TemplateError(message)


def check_arguments(what, args, kwargs) -> None:
    """No number handed to a call or filter may exceed MOST_VALUE (a width, a count or a repeat is what turns a
    small template into a huge string: ``center(10**10)``), and no two strings or sequences handed to it may
    have sizes whose product exceeds MOST_PRODUCT (each piece of one put between the other's: ``replace``,
    ``wordwrap(wrapstring=…)``, ``join``, ``indent``)."""
    name = what if isinstance(what, str) else getattr(what, "__name__", type(what).__name__)
    sizes = [len(getattr(what, "__self__", ""))] if isinstance(getattr(what, "__self__", None), str) else []
    for a in (*args, *kwargs.values()):
        if isinstance(a, int) and not isinstance(a, bool) and abs(a) > MOST_VALUE:
            raise TemplateLimit(f"{name} was given the number {a:,}, more than {MOST_VALUE:,}")
        if isinstance(a, (str, list, tuple, dict)):
            sizes.append(len(a))
    if len(sizes) > 1:
        a, b = sorted(sizes)[-2:]
        if a * b > MOST_PRODUCT:
            raise TemplateLimit(f"{name} was given two values of {b:,} and {a:,} characters or items, whose product "
                                f"is over {MOST_PRODUCT:,} (a long string put between the pieces of another)")


def check_operator(operator: str, left, right) -> None:
    """``*`` of a sequence, ``**`` and ``%`` formatting: the sizes they would make, before they make them."""
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MOST_VALUE:
                raise TemplateLimit(f"it repeats a value of {len(seq):,} {n:,} times (at most {MOST_VALUE:,} "
                                    "characters or items)")
    elif operator == "**":
        if isinstance(right, int) and isinstance(left, int) and abs(left) > 1 and right > 4096:
            raise TemplateLimit(f"it raises a number to the power {right:,}")
    elif operator == "%" and isinstance(left, str):
        check_format(left, right if isinstance(right, tuple) else (right,))


def check_format(text: str, args=()) -> None:
    """A format string's widths and precisions (``%0999999999d``, ``{:>999999999}``), and a ``*`` width's value."""
    if any(len(d) > 7 or int(d) > MOST_VALUE for d in re.findall(r"\d+", text)):
        raise TemplateLimit(f"a format string asks for a width or precision over {MOST_VALUE:,}")
    check_arguments("a format string", args, {})


def check_string_method(obj, args) -> tuple:
    """A str method's output, bounded before it runs: ``replace`` by a longer string, ``join``, ``expandtabs``,
    ``format``. Returns the arguments (``join``'s iterable made a list, to be measured)."""
    target = getattr(obj, "__wrapped__", obj)              # the sandbox wraps str.format
    text, name = getattr(target, "__self__", None), getattr(target, "__name__", "")
    if not isinstance(text, str):
        return args
    if name in ("format", "format_map"):
        check_format(text)
    elif name == "replace" and len(args) >= 2:
        check_replace(text, *args[:2])
    elif name == "expandtabs":
        size = args[0] if args and isinstance(args[0], int) else 8
        check_size(len(text) + text.count("\t") * max(size, 0), "expandtabs")
    elif name == "join" and args:
        items = list(args[0])
        check_size(len(items), "join")
        check_size(len(text) * len(items) + sum(len(x) for x in items if isinstance(x, str)), "join")
        args = (items, *args[1:])
    return args


def check_filter(name: str, args) -> None:
    """The filters whose output can outgrow their input many times over, bounded before they run."""
    strings = [a for a in args if isinstance(a, str)]
    if name in SERIALISING:
        check_size(deep_size(args), name)
    if name == "replace" and len(strings) >= 3:
        check_replace(*strings[:3])
    elif name == "indent" and strings:
        width = next((a for a in args[1:] if isinstance(a, (int, str)) and not isinstance(a, bool)), 4)
        width = len(width) if isinstance(width, str) else abs(width)
        check_size(len(strings[0]) + (strings[0].count("\n") + 1) * width, "indent")
    elif name == "wordwrap" and strings:
        wrap = max((len(a) for a in strings[1:]), default=1)
        width = next((a for a in args[1:] if isinstance(a, int) and not isinstance(a, bool)), 79)
        check_size(len(strings[0]) * (1 + wrap // max(width, 1) + wrap), "wordwrap")
    elif name == "format" and strings:
        check_format(strings[0], tuple(a for a in args[1:]))


def deep_size(value, most: int = MOST_VALUE) -> int:
    """Characters and items inside ``value``, containers walked (a shared string counts each time it is listed),
    stopping once past ``most``."""
    total, todo = 0, [value]
    while todo and total <= most:
        v = todo.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            total += len(v)
            todo.extend(v.keys())
            todo.extend(v.values())
        elif isinstance(v, (list, tuple, set)):
            total += len(v)
            todo.extend(v)
        else:
            total += 1
    return total


def check_replace(text, old, new) -> None:
    if isinstance(text, str) and isinstance(old, str) and isinstance(new, str):
        hits = text.count(old) if old else len(text) + 1
        check_size(len(text) + hits * max(0, len(new) - len(old)), "replace")


def check_size(size: int, what: str) -> None:
    if size > MOST_VALUE:
        raise TemplateLimit(f"{what} would make {size:,} characters or items (at most {MOST_VALUE:,})")


def render_chat(template: str, messages: list[dict], *, add_generation_prompt: bool = True,
                most_chars: int = MOST_OUTPUT, source: str = "the chat template", **special_tokens) -> str:
    """The text of ``messages`` (dicts with "role" and "content") as the Jinja2 ``template`` writes them,
    ending, with ``add_generation_prompt``, where the assistant's reply begins. The template runs sandboxed and
    bounded (see the module); ``most_chars`` caps the text it may write.

    Raises
    ------
    ValueError
        No template, malformed messages, or anything the template raises or runs into, as one line beginning
        with ``source`` (the model's chat template, named); :class:`TextTooLong` past ``most_chars``.

    >>> render_chat("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    ...             "{% if add_generation_prompt %}<assistant>{% endif %}", [{"role": "user", "content": "hi"}])
    '<user>hi<assistant>'
    >>> try:
    ...     render_chat("{{ 'a' * 10**8 }}", [])
    ... except ValueError as e:
    ...     print(e)
    the chat template could not be rendered: it repeats a value of 1 100,000,000 times (at most 1,048,576 characters or items)
    """
    if not isinstance(template, str) or not template:
        raise ValueError("the model has no chat template (tokenizer.chat_template)")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"messages[{i}] must be a dict with str 'role' and 'content', got {m!r}")
    try:
        env = bounded_environment()
        pieces, written = [], 0
        for piece in env.from_string(template).generate(messages=messages,
                                                        add_generation_prompt=add_generation_prompt,
                                                        **special_tokens):
            written += len(piece)
            if written > most_chars:
                raise TextTooLong(f"{source} writes more than {most_chars:,} characters")
            pieces.append(piece)
        return "".join(pieces)
    except TextTooLong:
        raise
    except TemplateLimit as e:
        raise ValueError(f"{source} could not be rendered: {e}") from None
    except (Exception, RecursionError, MemoryError) as e:     # 1/0, undefined names, syntax, raise_exception, …
        text = " ".join(str(e).split())[:300]
        raise ValueError(f"{source} could not be rendered: {type(e).__name__}: {text}") from None
