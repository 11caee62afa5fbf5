"""SentencePiece vocabularies from GGUF files (``tokenizer.ggml.model`` "llama": Llama 2, Mistral, Gemma,
Phi-3), built by attnlab with ``tokenizers`` as llama.cpp's tokenizer runs them: hand-worked merges on a small
vocabulary written with ``gguf.GGUFWriter``, byte fallback, the space prefix, control and user-defined tokens,
bos/eos, decoding; then the ids of llama.cpp itself (llama-cpp-python, where installed) and of transformers'
GGUF tokenizer on the same files, over a varied text set. llama.cpp's own vocabulary test files
(``ggml-vocab-*.gguf`` with their ``.inp``/``.out``) are checked too when ``ATTNLAB_LLAMA_VOCABS`` names a
folder holding them."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

gguf = pytest.importorskip("gguf")
pytest.importorskip("tokenizers")

from attnlab.models.gguf import gguf_tokenizer, open_gguf, score_merges  # noqa: E402

spec = importlib.util.spec_from_file_location("_test_gguf_families", Path(__file__).with_name("test_gguf_families.py"))
families = importlib.util.module_from_spec(spec)          # the tests are not a package: the vocabulary by path
spec.loader.exec_module(families)
TOKENS = families.SPM_TOKENS
ID = {t: i for i, t in enumerate(TOKENS)}
BYTE = lambda b: ID[f"<0x{b:02X}>"]                        # noqa: E731


def ids(tok, text: str) -> list[int]:
    """The tokenizer's ids for any text, even one of spaces only (which ``encode`` refuses, for the CLI)."""
    return tok.tokenizer.encode(text).ids


def write_spm(path, *, arch="llama", space_prefix=None, add_bos=None, add_eos=None, name=None) -> Path:
    """A llama-architecture GGUF holding only metadata (sizes, no tensors) and the small SentencePiece
    vocabulary of tests/test_gguf_families.py: enough for a tokenizer, and for llama.cpp's ``vocab_only``."""
    w = gguf.GGUFWriter(str(path), arch)
    if name is not None:
        w.add_name(name)
    for key, value in {"block_count": 1, "context_length": 64, "embedding_length": 32, "feed_forward_length": 64,
                       "attention.head_count": 2, "attention.head_count_kv": 2,
                       "attention.layer_norm_rms_epsilon": 1e-5, "rope.dimension_count": 16}.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"{arch}.{key}", value)
    families.write_tokenizer(w, "llama", space_prefix=space_prefix)
    if add_bos is not None:
        w.add_add_bos_token(add_bos)
    if add_eos is not None:
        w.add_add_eos_token(add_eos)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture
def spm(tmp_path):
    return gguf_tokenizer(open_gguf(write_spm(tmp_path / "spm.gguf")))


def test_merges_follow_the_joined_tokens_scores():
    """One merge per way of cutting a token in two, the best-scored token's first."""
    assert score_merges(["a", "b", "c", "ab", "bc", "abc"], [0, 0, 0, -1, -2, -3]) == [
        ("a", "b"), ("b", "c"), ("a", "bc"), ("ab", "c")]
    assert score_merges(["a", "b", "ab", "ba"], [0, 0, -5, 3]) == [("b", "a"), ("a", "b")]


def test_hand_worked_tokens(spm):
    """"the cat" is "▁the▁cat" after the prefix; its pairs merge best score first: ▁t, he, ▁the, ▁c, at, ▁cat."""
    bos = ID["<s>"]
    assert spm.encode("the cat").tolist() == [bos, ID["▁the"], ID["▁cat"]]
    assert spm.encode(" the").tolist() == [bos, ID["▁"], ID["▁the"]]            # "▁▁the": ▁t beats ▁▁
    assert spm.encode("ß\n").tolist() == [bos, ID["▁"], BYTE(0xC3), BYTE(0x9F), BYTE(0x0A)]   # no token: bytes
    assert spm.encode("é").tolist() == [bos, ID["▁"], ID["é"]]
    assert ids(spm, "") == [bos]


def test_control_and_user_defined_tokens_stay_whole(spm):
    """Both are one token where the text writes them; the text after each is tokenized on its own, with its
    own space prefix (llama.cpp's rule: after a special token, as at the start)."""
    bos = ID["<s>"]
    assert spm.encode("<|user|>the cat<|end|>").tolist() == [bos, ID["<|user|>"], ID["▁the"], ID["▁cat"], ID["<|end|>"]]
    assert spm.encode("cat<|end|>the").tolist() == [bos, ID["▁cat"], ID["<|end|>"], ID["▁the"]]
    assert spm.encode("mat").tolist() == [bos, ID["▁"], ID["m"], ID["at"]]      # a, t merge first: ▁mat unreached


def test_phi3_special_tokens_drop_the_spaces_after_them(tmp_path):
    """llama.cpp's rule for a model named Phi-3: whitespace after a special token (but <s>) is dropped."""
    phi = gguf_tokenizer(open_gguf(write_spm(tmp_path / "phi.gguf", name="Phi-3-mini-4k-instruct")))
    plain = gguf_tokenizer(open_gguf(write_spm(tmp_path / "plain.gguf")))
    bos, end = ID["<s>"], ID["<|end|>"]
    assert phi.encode("cat<|end|> \n the").tolist() == [bos, ID["▁cat"], end, ID["▁the"]]
    assert plain.encode("cat<|end|> the").tolist() == [bos, ID["▁cat"], end, ID["▁"], ID["▁the"]]


def test_decode_gives_the_text_back(spm):
    for text in ["the cat sat", "  two spaces", "ß and 🙂\n\tend", "Hello, World!"]:
        assert spm.decode(spm.encode(text)) == text, text
    assert spm.decode(spm.encode("<|user|>hi<|end|>")) == "<|user|> hi"     # the prefix after a special token; 
                                                                            # control tokens are not text
    assert spm.labels([ID["▁the"]]) == ("▁the",)


def test_bos_eos_and_space_prefix_as_the_file_says(tmp_path):
    off = gguf_tokenizer(open_gguf(write_spm(tmp_path / "a.gguf", space_prefix=False, add_bos=False, add_eos=True)))
    assert off.encode("the cat").tolist() == [ID["the"], ID["▁cat"], ID["</s>"]]       # t, he, the: no ▁
    assert off.decode(off.encode(" the cat")) == " the cat"
    assert (off.bos_id, off.eos_id) == (ID["<s>"], ID["</s>"])
    assert off.chat_template.startswith("{{ bos_token }}")


def test_a_bad_scores_list_is_one_line(tmp_path):
    path = tmp_path / "bad.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["a", "b", "ab"])
    w.add_token_scores([0.0, 1.0])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="'tokenizer.ggml.scores' must be one number per token"):
        gguf_tokenizer(open_gguf(path))


def test_a_token_too_long_to_cut_is_refused(tmp_path):
    """Cutting every token in two costs Σ len²: a hostile vocabulary's 10⁶-character token is refused first."""
    path = tmp_path / "long.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_tokenizer_model("llama")
    w.add_token_list(["a", "a" * 1_000_000])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="a token of 1,000,000 characters"):
        gguf_tokenizer(open_gguf(path))


def test_an_unknown_tokenizer_kind_names_both_kinds(tmp_path):
    path = tmp_path / "t5.gguf"
    w = gguf.GGUFWriter(str(path), "t5")
    w.add_tokenizer_model("t5")
    w.add_token_list(["a"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ValueError, match="kind 'gpt2' \\(byte-level BPE\\) and 'llama' \\(SentencePiece\\)"):
        gguf_tokenizer(open_gguf(path))


TEXTS = ["the cat sat on the mat", " the cat", "  the  cat  ", "   ", " ", "Hello World!", "Hello, world!\n\nThe red mat.",
         "12 123 1234 3.14", "héllo wörld ß théd", "🙂 emoji 😶‍🌫️ ✅", "\t tab\n", "\n\n\n", "x", "Tšts-y'all",
         "<|user|>the cat<|end|>", "mat<|end|> the", "<s>the</s>", "нещо на Български", "我想在apple工作1314151天～"]


@pytest.mark.parametrize("prefix, name", [(None, None), (False, None), (None, "Phi3")],
                         ids=["space prefix", "no space prefix (Gemma)", "named Phi3"])
def test_tokens_equal_llama_cpp_on_the_same_file(tmp_path, prefix, name):
    """llama-cpp-python reads the same file (vocab only): its ids with bos and special tokens parsed, and
    its text back, equal attnlab's on every text."""
    llama_cpp = pytest.importorskip("llama_cpp")
    path = write_spm(tmp_path / "spm.gguf", space_prefix=prefix, name=name)
    ours = gguf_tokenizer(open_gguf(path))
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in TEXTS:
        theirs = llm.tokenize(text.encode("utf-8"), add_bos=True, special=True)
        assert ids(ours, text) == theirs, text
        plain = [i for i in theirs if i not in (ID["<s>"], ID["</s>"], ID["<|end|>"])]
        assert ours.decode(plain) == llm.detokenize(plain).decode("utf-8", "replace").removeprefix(
            " " if prefix is None else ""), text


@pytest.mark.parametrize("family", ["gemma2", "phi3", "gemma3", "qwen2", "qwen3", "gpt2", "gpt-oss"])
def test_tokens_of_the_family_files_equal_llama_cpp(tmp_path, family):
    """The same on the files of tests/test_gguf_families.py, each read by llama.cpp as its architecture:
    SentencePiece (Gemma-2 without the space prefix, Gemma-3, Phi-3) and byte-level BPE (Qwen2's
    pre-tokenizer)."""
    llama_cpp = pytest.importorskip("llama_cpp")
    if family == "gpt-oss":
        path = families.write_gpt_oss_gguf(tmp_path / "oss.gguf", families.gpt_oss_model(len(families.BPE.TOKENS)))
    else:
        kind = families.FAMILIES[family][0]
        vocab = len(TOKENS) if kind == "llama" else len(families.BPE.TOKENS)
        path = families.write_family_gguf(tmp_path / f"{family}.gguf", family, families.hf_model(family, vocab))
    ours = gguf_tokenizer(open_gguf(path))
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)
    for text in TEXTS + ["<|im_end|>the cat", "the  cat\r\n"]:
        assert ids(ours, text) == llm.tokenize(text.encode("utf-8"), add_bos=True, special=True), (family, text)


SPECIAL = ("<s>", "</s>", "<|user|>", "<|end|>")


def test_tokens_equal_transformers_gguf_tokenizer(tmp_path):
    """transformers' GGUF tokenizer (BPE with merges from the scores, like attnlab's, but a Metaspace
    pre-tokenizer) gives the same ids, except where it departs from llama.cpp in two known ways: it adds no
    "▁" before a text that already starts with a space (so attnlab's " x" is its "  x"), and none after a
    special token."""
    transformers = pytest.importorskip("transformers")
    path = write_spm(tmp_path / "spm.gguf")
    ours = gguf_tokenizer(open_gguf(path))
    theirs = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=path.name)
    for text in TEXTS:
        if any(s in text for s in SPECIAL):
            continue
        mine = ids(ours, text)
        assert mine == theirs(" " + text if text.startswith(" ") else text)["input_ids"], text
        if not text.startswith(" "):         # its decoder drops a leading "▁" token whole
            assert ours.decode(mine) == theirs.decode(mine, skip_special_tokens=True) == text, text


VOCABS = os.environ.get("ATTNLAB_LLAMA_VOCABS")


@pytest.mark.skipif(not VOCABS, reason="ATTNLAB_LLAMA_VOCABS names no folder of llama.cpp's ggml-vocab-*.gguf files")
@pytest.mark.parametrize("name", ["llama-spm", "phi-3", "gpt-2", "qwen2", "llama-bpe", "starcoder"])
def test_llama_cpp_vocabulary_test_files(name):
    """llama.cpp's own vocabulary tests (models/ggml-vocab-NAME.gguf, .inp, .out in its repository): attnlab's
    ids equal the ids llama.cpp's tests expect, bos not added, on each of their texts; decoding gives it back."""
    path = Path(VOCABS) / f"ggml-vocab-{name}.gguf"
    if not path.is_file():
        pytest.skip(f"no {path}")
    tok = gguf_tokenizer(open_gguf(path))
    texts = path.with_suffix(".gguf.inp").read_text("utf-8").split("\n__ggml_vocab_test__\n")
    wants = path.with_suffix(".gguf.out").read_text("utf-8").split("\n")
    for text, want in zip(texts, wants):
        got = tok.tokenizer.encode(text, add_special_tokens=False).ids
        assert got == [int(x) for x in want.split()], text
        assert tok.decode(got) == text, text
    try:
        import llama_cpp
    except ImportError:
        return
    llm = llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)      # with bos, specials parsed
    for text in texts + TEXTS:
        if name == "qwen2" and "</s>" in text:
            continue        # llama.cpp makes Qwen2's normal token "</s>" a control token, by its text
        assert ids(tok, text) == llm.tokenize(text.encode("utf-8"), add_bos=True, special=True), text
