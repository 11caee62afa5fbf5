"""The experts MLP (attnlab.stack.experts): a hand-worked router, a float64 loop written out token by token,
gpt-oss's and DeepSeek-V3's MoE modules of transformers on the same weights, the hooks, and the stack with
experts layers."""

import numpy as np
import pytest

from attnlab.layer.config import AttentionConfig
from attnlab.layer.hookpoints import Hooks
from attnlab.stack.experts import (Experts, ExpertsConfig, GroupSigmoidRouter, SoftmaxTopKRouter, clamped_swiglu)
from attnlab.stack.layers import RMSNorm
from attnlab.stack.transformer import ModelConfig, Transformer, forward, param_names

GPT_OSS = ExpertsConfig(n_experts=4, top_k=2, d_expert=6)
DEEPSEEK = ExpertsConfig(n_experts=8, top_k=3, d_expert=5, router="group_sigmoid", glu="silu", bias=False,
                         n_group=4, topk_group=2, norm_topk_prob=True, routed_scaling_factor=2.5, n_shared=2)


def test_softmax_top_k_router_by_hand():
    # logits (1, 3, 2, 0) + b 0: experts 1 and 2 chosen, weights softmax(3, 2) = (e, 1) / (1 + e)
    r = SoftmaxTopKRouter(np.eye(4), np.zeros(4), 2)
    ids, w = r.choose(r.logits(np.array([[1.0, 3.0, 2.0, 0.0]])))
    assert ids.tolist() == [[1, 2]]
    np.testing.assert_allclose(w, [[np.e / (1 + np.e), 1 / (1 + np.e)]])


def test_group_sigmoid_router_by_hand():
    # 4 experts in 2 groups; logits 0 -> σ = 0.5 each, but the correction makes group 1 win (3 and 2 best)
    r = GroupSigmoidRouter(np.eye(4), np.array([0.0, 0.0, 0.3, 0.2]), top_k=2, n_group=2, topk_group=1,
                           norm_topk_prob=False, routed_scaling_factor=2.0)
    ids, w = r.choose(np.zeros((1, 4)))
    assert sorted(ids[0].tolist()) == [2, 3]
    np.testing.assert_allclose(w, [[1.0, 1.0]])             # the uncorrected scores 0.5, times 2


def test_clamped_swiglu_by_hand():
    g, u = np.array([1.0, 8.0]), np.array([0.5, -9.0])
    want = [(0.5 + 1) * 1 / (1 + np.exp(-1.702)), (-7 + 1) * 7 / (1 + np.exp(-1.702 * 7))]
    np.testing.assert_allclose(clamped_swiglu(g, u, 1.702, 7.0), want)


def loop_reference(m: Experts, x: np.ndarray) -> np.ndarray:
    """Each token alone, in float64: its router, its k experts, their weighted sum, the shared experts."""
    p = {k: v.astype(np.float64) for k, v in m.params().items()}
    c, out = m.config, []
    for row in x.reshape(-1, x.shape[-1]).astype(np.float64):
        router = c.router_class.of({k[7:]: v for k, v in p.items() if k.startswith("router.")}, c)
        ids, w = router.choose(router.logits(row[None]))
        y = np.zeros_like(row)
        for e, we in zip(ids[0], w[0]):
            gate, up = row @ p["W_gate"][e], row @ p["W_in"][e]
            if c.bias:
                gate, up = gate + p["b_gate"][e], up + p["b_in"][e]
            h = (clamped_swiglu(gate, up, c.swiglu_alpha, c.swiglu_limit) if c.glu == "swiglu_clamped"
                 else gate / (1 + np.exp(-gate)) * up)
            y += we * (h @ p["W_out"][e] + (p["b_out"][e] if c.bias else 0))
        if c.n_shared:
            g = row @ p["shared.W_gate"]
            y += (g / (1 + np.exp(-g)) * (row @ p["shared.W_in"])) @ p["shared.W_out"]
        out.append(y)
    return np.array(out).reshape(x.shape)


@pytest.mark.parametrize("c", [GPT_OSS, DEEPSEEK], ids=["gpt-oss", "deepseek"])
def test_experts_match_a_token_by_token_loop(c):
    rng = np.random.default_rng(0)
    m = Experts.init(16, c, rng=rng, std=0.5)
    x = rng.normal(size=(2, 7, 16)).astype(np.float32)
    np.testing.assert_allclose(m(x), loop_reference(m, x), rtol=1e-5, atol=1e-5)


def test_hooks_see_the_choice_and_can_zero_an_expert():
    rng = np.random.default_rng(1)
    m = Experts.init(16, GPT_OSS, rng=rng, std=0.5)
    x = rng.normal(size=(5, 16)).astype(np.float32)
    seen = {}
    names = list(Experts.HOOKS)
    m(x, Hooks(names, {n: (lambda a, n: seen.__setitem__(n, a)) for n in names}))
    assert seen["hook_router_logits"].shape == (5, 4)
    assert seen["hook_expert_ids"].shape == (5, 2) and seen["hook_expert_ids"].dtype.kind == "i"
    np.testing.assert_allclose(seen["hook_expert_weights"].sum(-1), 1, rtol=1e-6)
    # zeroing every weight leaves nothing (gpt-oss has no shared experts)
    y = m(x, Hooks(names, {"hook_expert_weights": lambda a, n: np.zeros_like(a)}))
    assert not y.any()


@pytest.mark.parametrize("c", [GPT_OSS, DEEPSEEK, ExpertsConfig(**{**DEEPSEEK.to_json(), "norm_topk_prob": False})],
                         ids=["gpt-oss", "deepseek", "deepseek-unnormalised"])
def test_backward_matches_finite_differences(c, numeric_grad):
    rng = np.random.default_rng(3)
    m = Experts.init(6, c, rng=rng, std=0.6, dtype=np.float64)
    x = rng.normal(size=(2, 5, 6)) * 1.5
    if c.glu == "swiglu_clamped":
        m.W_gate[...] *= 6                                   # so that the clamps act on some units
        m.W_in[...] *= 6
    dy = rng.normal(size=x.shape)
    y, saved = m.forward(x)
    dx, grads, named = m.backward_named(saved, dy)
    f = lambda: float((m(x) * dy).sum())                     # noqa: E731
    np.testing.assert_allclose(dx, numeric_grad(f, x), rtol=1e-5, atol=1e-7)
    for name, p in m.params().items():
        if name == "router.correction":
            assert not grads[name].any()                     # it moves the choice only
            continue
        np.testing.assert_allclose(grads[name], numeric_grad(f, p), rtol=1e-5, atol=1e-7, err_msg=name)
    assert named["hook_router_logits"].shape == (2, 5, c.n_experts)
    if c.glu == "swiglu_clamped":                            # the clamps did act
        gate = np.einsum("bnd,edm->bnem", x, m.W_gate) + m.b_gate
        assert (gate > c.swiglu_limit).any()


def test_bad_configs_name_the_field():
    with pytest.raises(ValueError, match="top_k"):
        ExpertsConfig(n_experts=2, top_k=3, d_expert=4)
    with pytest.raises(ValueError, match="router"):
        ExpertsConfig(n_experts=2, top_k=1, d_expert=4, router="hash")
    with pytest.raises(ValueError, match="n_group"):
        ExpertsConfig(n_experts=6, top_k=1, d_expert=4, n_group=4)


def test_a_stack_with_experts_trains_its_every_parameter(param_grads):
    from attnlab.lm.model import loss, loss_and_grad
    a = AttentionConfig(d_model=8, n_heads=2, n_ctx=16, sinks=True)
    c = ModelConfig(vocab_size=20, n_layers=2, attention=a, d_mlp=6, mlp="gated", activation="silu", norm=RMSNorm,
                    experts=ExpertsConfig(n_experts=4, top_k=2, d_expert=5, swiglu_limit=1.0))
    model = Transformer.init(c, rng=np.random.default_rng(0), std=0.5, dtype=np.float64)
    rng = np.random.default_rng(1)
    ids, targets = rng.integers(0, 20, (2, 5)), rng.integers(0, 20, (2, 5))
    _, grads = loss_and_grad(model, ids, targets)
    f = lambda: loss(model, ids, targets)                    # noqa: E731
    param_grads(grads, model.params(), f, lambda p: [np.unravel_index(i, p.shape) for i in range(0, p.size, 7)][:4])


def test_a_stack_with_dense_then_experts_layers():
    a = AttentionConfig(d_model=16, n_heads=2, n_ctx=32)
    e = ExpertsConfig(**{**DEEPSEEK.to_json(), "first_dense": 1})
    c = ModelConfig(vocab_size=40, n_layers=3, attention=a, d_mlp=24, mlp="gated", activation="silu", norm=RMSNorm,
                    experts=e)
    model = Transformer.init(c, rng=np.random.default_rng(0))
    assert not isinstance(model.blocks[0].mlp, Experts) and isinstance(model.blocks[2].mlp, Experts)
    assert "blocks.1.mlp.router.correction" in param_names(c) and "blocks.0.mlp.W_gate" in param_names(c)
    again = Transformer.from_params(ModelConfig.from_json(c.to_json()), model.params())
    ids = np.arange(9)
    np.testing.assert_array_equal(forward(again, ids).logits, forward(model, ids).logits)


torch = None


def _torch():
    global torch
    torch = pytest.importorskip("torch")
    return pytest.importorskip("transformers")


def test_gpt_oss_mlp_matches_transformers():
    transformers = _torch()
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssMLP
    cfg = transformers.GptOssConfig(hidden_size=16, intermediate_size=6, num_local_experts=4, num_experts_per_tok=2)
    torch.manual_seed(0)
    mod = GptOssMLP(cfg).eval()
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn_like(p) * 0.7)
    sd = {k: v.numpy() for k, v in mod.state_dict().items()}
    gate_up, b_gate_up = sd["experts.gate_up_proj"], sd["experts.gate_up_proj_bias"]   # gate, up interleaved
    m = Experts(SoftmaxTopKRouter(sd["router.weight"].T, sd["router.bias"], 2), gate_up[..., ::2],
                gate_up[..., 1::2], sd["experts.down_proj"], GPT_OSS, b_gate_up[..., ::2], b_gate_up[..., 1::2],
                sd["experts.down_proj_bias"])
    x = np.random.default_rng(0).normal(size=(2, 9, 16)).astype(np.float32) * 2   # some gates past the limit
    with torch.no_grad():
        want = mod(torch.from_numpy(x))[0].numpy()
    np.testing.assert_allclose(m(x), want, rtol=0, atol=1e-5 * np.abs(want).max())


def test_deepseek_v3_moe_matches_transformers():
    transformers = _torch()
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE
    cfg = transformers.DeepseekV3Config(hidden_size=16, moe_intermediate_size=5, n_routed_experts=8,
                                        num_experts_per_tok=3, n_group=4, topk_group=2, norm_topk_prob=True,
                                        routed_scaling_factor=2.5, n_shared_experts=2)
    torch.manual_seed(0)
    mod = DeepseekV3MoE(cfg).eval()
    with torch.no_grad():
        for p in mod.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
        mod.gate.e_score_correction_bias.copy_(torch.randn(8) * 0.1)
    sd = {k: v.numpy() for k, v in mod.state_dict().items()}
    m_ = 5
    gate_up = sd["experts.gate_up_proj"]                       # (E, 2·m, d): gate rows, then up rows
    shared = {f"shared.{a}": sd[f"shared_experts.{b}_proj.weight"].T for a, b in
              (("W_gate", "gate"), ("W_in", "up"), ("W_out", "down"))}
    m = Experts.from_params({"router.W": sd["gate.weight"].T, "router.correction": sd["gate.e_score_correction_bias"],
                             "W_gate": gate_up[:, :m_].transpose(0, 2, 1), "W_in": gate_up[:, m_:].transpose(0, 2, 1),
                             "W_out": sd["experts.down_proj"].transpose(0, 2, 1), **shared}, DEEPSEEK)
    x = np.random.default_rng(0).normal(size=(2, 9, 16)).astype(np.float32)
    with torch.no_grad():
        want = mod(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(m(x), want, rtol=0, atol=1e-5 * np.abs(want).max())
