"""A chat template is untrusted code (issue 31, cause 2): besides the sandbox's escapes, it may not hang, exhaust
memory or crash ``chat``. Every case is one ValueError naming the template in the library and one line, exit 2,
in the CLI; the bounds are counted, not timed, so they hold in any thread. Text is bounded in characters before
it is tokenised (cause 4): a template's output, a chat message, ``generate --prompt`` and chat's stdin."""

import io
import threading

import pytest

pytest.importorskip("jinja2")
gguf = pytest.importorskip("gguf")

from attnlab.cli import main  # noqa: E402
from attnlab.models import load_model  # noqa: E402
from attnlab.stack.chat import Chat, render_chat  # noqa: E402

MESSAGES = [{"role": "user", "content": "the cat"}]

HOSTILE = [
    ("recursive macro", "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "calls nest more than 64 deep"),
    ("recursive for", "{% for m in messages recursive %}{{ loop(messages) }}{% endfor %}", "nest more than 64"),
    ("range(10**9)|list", "{{ range(10**9)|list }}", "range was given the number 1,000,000,000"),
    ("1/0", "{{ 1/0 }}", "ZeroDivisionError: division by zero"),
    ("nested range(100000)", "{% for a in range(100000) %}{% for b in range(100000) %}{% endfor %}{% endfor %}",
     "work budget"),
    ("lipsum(10**7)", "{{ lipsum(10**7) }}", "lipsum was given the number 10,000,000"),
    ("'a'*10**8", "{{ 'a'*10**8 }}", "repeats a value of 1 100,000,000 times"),
    ("a doubling chain", "{% set x = 'a'*1000000 %}{% set x = x ~ x %}{{ x }}", "~ would make 2,000,000"),
    ("center(10**9)", "{{ 'a'|center(10**9) }}", "center was given the number 1,000,000,000"),
    ("a format width", "{{ '%0999999999d' % 1 }}", "width or precision over"),
    ("str.format width", "{{ '{:>999999999}'.format(1) }}", "width or precision over"),
    ("replace by a long string", "{{ ('a'*1000000)|replace('a', 'bbbbbbbbbb') }}", "replace would make"),
    ("wordwrap's wrapstring", "{{ ('a '*100000)|wordwrap(1, wrapstring='y'*100000) }}", "wordwrap was given"),
    ("join of one big string", "{{ (['a'*1000000]*1000)|join }}", "join would make"),
    ("tojson of one big string", "{{ (['a'*1000000]*1000)|tojson }}", "tojson would make"),
    ("a huge power", "{{ 2**100000 }}", "to the power 100,000"),
    ("a sum in a loop", "{% for a in range(100000) %}{{ range(100000)|sum }}{% endfor %}", "work budget"),
    ("deep nesting", "{{ " + "(" * 5000 + "1" + ")" * 5000 + " }}", "RecursionError"),
    ("a syntax error", "{% for %}", "TemplateSyntaxError"),
    ("an undefined name", "{{ foo.bar }}", "UndefinedError: 'foo' is undefined"),
    ("the sandbox", "{{ ''.__class__.__mro__ }}", "SecurityError"),
]


@pytest.mark.parametrize("case,template,message", HOSTILE, ids=[c[0] for c in HOSTILE])
def test_a_hostile_template_is_one_value_error_naming_it(case, template, message):
    with pytest.raises(ValueError, match="^the model's chat template could not be rendered: ") as e:
        render_chat(template, MESSAGES, source="the model's chat template")
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_the_bounds_hold_off_the_main_thread():
    """Counted, not timed: a render in a worker thread stops exactly as in the main one."""
    errors = []

    def render():
        try:
            render_chat(HOSTILE[4][1], MESSAGES)
        except ValueError as e:
            errors.append(str(e))
    worker = threading.Thread(target=render)
    worker.start()
    worker.join()
    assert len(errors) == 1 and "work budget" in errors[0]


def test_a_render_writes_at_most_most_chars():
    with pytest.raises(ValueError, match="the chat template writes more than 1,000 characters"):
        render_chat("{% for i in range(2000) %}x{% endfor %}", MESSAGES, most_chars=1000)
    assert render_chat("{% for i in range(1000) %}x{% endfor %}", MESSAGES, most_chars=1000) == "x" * 1000


def test_real_templates_still_render(gguf_files):
    chatml = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
              "{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
              "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
              "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
    long = [{"role": "user", "content": "the cat sat " * 20_000}]                # 240,000 characters
    text = render_chat(chatml, long)
    assert text.startswith("<|im_start|>system\nYou are helpful.") and len(text) > 240_000
    assert render_chat("{{ messages|tojson }}{{ raise_exception('x') if false }}", MESSAGES) == \
        '[{"content": "the cat", "role": "user"}]'
    with pytest.raises(ValueError, match="TemplateError: only user and assistant"):
        render_chat("{{ raise_exception('only user and assistant') }}", MESSAGES)


@pytest.fixture
def hostile_gguf(tmp_path, gguf_files, monkeypatch):
    """``hostile_gguf(template, **meta)`` -> a tiny GGUF file whose tokenizer.chat_template is ``template``."""
    def write(template, **meta):
        real = gguf.GGUFWriter.add_chat_template
        monkeypatch.setattr(gguf.GGUFWriter, "add_chat_template", lambda self, _: real(self, template))
        path = gguf_files.write_gguf(tmp_path / f"t{len(list(tmp_path.iterdir()))}.gguf", meta=meta or None)
        monkeypatch.setattr(gguf.GGUFWriter, "add_chat_template", real)
        return path
    return write


def one_line(capsys, argv) -> str:
    assert main(list(map(str, argv))) == 2
    out, err = capsys.readouterr()
    assert err.startswith("attnlab: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize("case,template,message", [HOSTILE[i] for i in (0, 2, 3, 4, 5, 6)],
                         ids=[HOSTILE[i][0] for i in (0, 2, 3, 4, 5, 6)])
def test_chat_with_a_hostile_template_is_one_line_exit_2(hostile_gguf, capsys, case, template, message):
    path = hostile_gguf(template)
    err = one_line(capsys, ["chat", "--model", path, "--message", "the cat", "--tokens", "2"])
    assert f"{path}'s chat template (tokenizer.chat_template) could not be rendered" in err and message in err


# --- cause 4: characters bounded before tokenising --------------------------------------------------------------

def test_a_template_writing_more_than_the_context_can_hold_stops_before_tokenising(hostile_gguf, capsys):
    path = hostile_gguf("{{ 'a' * 1000000 }}", context_length=64)
    model, tok = load_model(path)
    most = max(64 * tok.longest_token, 2 ** 16)
    with pytest.raises(ValueError, match=f"longer than {most:,} characters as the template writes it, more than "
                                         "the context of 64 tokens"):
        Chat(model, tok).say("the cat", max_tokens=2)


def test_a_long_message_is_refused_on_its_characters(gguf_files, tmp_path, monkeypatch, capsys):
    path = gguf_files.write_gguf(tmp_path / "c.gguf", meta={"context_length": 64})
    model, tok = load_model(path)
    chat = Chat(model, tok)
    with pytest.raises(ValueError, match=r"the message has 10,000,000 characters, more than 64 tokens"):
        chat.say("a" * 10_000_000)
    assert chat.messages == [] and chat.length == 0
    err = one_line(capsys, ["chat", "--model", path, "--message", "a" * 1_000_000])
    assert "the message has 1,000,000 characters" in err
    err = one_line(capsys, ["generate", "--model", path, "--prompt", "a" * 1_000_000, "--tokens", "2"])
    assert "--prompt has 1,000,000 characters, more than 64 tokens" in err


def test_a_long_line_on_chats_stdin_is_refused_before_it_is_read_whole(gguf_files, tmp_path, monkeypatch, capsys):
    path = gguf_files.write_gguf(tmp_path / "c.gguf", meta={"context_length": 64})
    _, tok = load_model(path)
    stdin = io.StringIO("a" * 10_000_000 + "\nthe\n")
    monkeypatch.setattr("sys.stdin", stdin)
    err = one_line(capsys, ["chat", "--model", path, "--tokens", "2"])
    assert f"a line of stdin has more than {max(64 * tok.longest_token, 2 ** 16):,} characters" in err
    assert stdin.tell() < 100_000                                 # the long line was never read whole
