"""FedNL: the delta-rule memory (two forms, exact recall, gradients through the trajectory), the
memory branch on a frozen causal LM, streaming with flat memory, and no memory state on the wire."""
import copy
import json

import pytest
import torch
import torch.nn.functional as F

from conftest import tiny_config, tiny_task
from lightfed import methods
from lightfed.data.tensors import subset
from lightfed.engine import protocol as P
from lightfed.measure import PeakRSS
from lightfed.methods.base import ClientContext
from lightfed.models import delta_memory as D
from lightfed.models import lm, streaming


def qkvb(B=2, H=3, T=150, dk=16, dv=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g, dtype=torch.float64).to(dtype)   # noqa: E731
    q, k = F.normalize(r(B, H, T, dk), dim=-1), F.normalize(r(B, H, T, dk), dim=-1)
    beta = torch.rand(B, H, T, generator=g, dtype=torch.float64).to(dtype)
    return q, k, r(B, H, T, dv), beta, r(B, H, dk, dv)


@pytest.mark.parametrize("chunk", [1, 7, 32, 64, 200])
def test_chunked_equals_recurrent_across_chunks_and_from_a_state(chunk):
    q, k, v, beta, S0 = qkvb()
    o1, S1 = D.recurrent(q, k, v, beta, S0)
    o2, S2 = D.chunked(q, k, v, beta, S0, chunk=chunk)
    assert (o1 - o2).abs().max() < 1e-5 and (S1 - S2).abs().max() < 1e-5
    # carrying the state through two calls == one call over the whole input
    oa, Sa = D.chunked(q[:, :, :90], k[:, :, :90], v[:, :, :90], beta[:, :, :90], S0, chunk=chunk)
    ob, Sb = D.chunked(q[:, :, 90:], k[:, :, 90:], v[:, :, 90:], beta[:, :, 90:], Sa, chunk=chunk)
    assert (torch.cat([oa, ob], 2) - o1).abs().max() < 1e-5 and (Sb - S1).abs().max() < 1e-5


def test_exact_recall_with_orthonormal_keys_and_step_one():
    dk, dv, n = 16, 5, 16
    g = torch.Generator().manual_seed(1)
    keys = torch.linalg.qr(torch.randn(dk, dk, generator=g, dtype=torch.float64))[0][:, :n].T   # (n, dk) orthonormal
    vals = torch.randn(n, dv, generator=g, dtype=torch.float64)
    k, v = keys[None, None], vals[None, None]
    for fn in (D.recurrent, lambda *a: D.chunked(*a, chunk=5)):
        _, S = fn(k, k, v, torch.ones(1, 1, n, dtype=torch.float64))
        o, _ = D.recurrent(k, k, torch.zeros_like(v), torch.zeros(1, 1, n, dtype=torch.float64), S)   # read only
        assert torch.allclose(o[0, 0], vals, atol=1e-12)
    # a second write to the same key replaces its value (the delta rule), not adds to it
    k2 = torch.cat([k, k[:, :, :1]], 2)
    v2 = torch.cat([v, 7 * torch.ones(1, 1, 1, dv, dtype=torch.float64)], 2)
    _, S = D.chunked(k2, k2, v2, torch.ones(1, 1, n + 1, dtype=torch.float64), chunk=4)
    assert torch.allclose(S.transpose(-1, -2) @ keys[0], 7 * torch.ones(dv, dtype=torch.float64), atol=1e-12)


def test_chunked_gradients_match_finite_differences():
    q, k, v, beta, S0 = qkvb(B=1, H=2, T=11, dk=4, dv=3, dtype=torch.float64)
    args = [t.requires_grad_() for t in (q, k, v, beta, S0)]
    assert torch.autograd.gradcheck(lambda *a: D.chunked(*a, chunk=4)[0], args, eps=1e-6, atol=1e-5)


def fednl_model(task="austen", seed=0, **opts):
    T = tiny_task(task)
    cfg = tiny_config(task, "fednl", method_options=opts)
    m = methods.build(cfg)
    return T, cfg, m, m.prepare(copy.deepcopy(T.model))


def test_the_model_starts_as_the_pretrained_one_and_only_theta_trains():
    T, cfg, m, model = fednl_model()
    ids = T.train["input_ids"][:2]
    assert torch.equal(model(input_ids=ids).logits, T.model(input_ids=ids).logits)   # alpha = 0
    assert set(m.shapes) == {n for n, _ in model.named_parameters() if ".memory." in n}
    assert all(not p.requires_grad for n, p in model.named_parameters() if ".memory." not in n)


def test_gradients_through_the_memory_trajectory_match_finite_differences():
    """A 3-chunk stream in float64: d loss / d theta along a random direction, autograd vs central differences."""
    T, cfg, m, model = fednl_model(chunk=4)
    model = model.double()
    g = torch.Generator().manual_seed(0)
    theta = m.trainable(model)
    with torch.no_grad():
        for p in theta.values():
            p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=p.dtype))      # away from the zero init
    ids = T.train["input_ids"][:2, :24]
    tmask = torch.zeros_like(ids, dtype=torch.bool)
    tmask[:, 17:] = True                                                        # targets in the last chunk only
    loss = lambda: lm.target_nll(model, ids, tmask, window=8)            # noqa: E731
    model.zero_grad()
    loss().backward()
    d = {n: torch.randn(p.shape, generator=g, dtype=p.dtype) for n, p in theta.items()}
    analytic = sum((p.grad * d[n]).sum() for n, p in theta.items()).item()
    def central(eps):   # (L(theta + eps d) - L(theta - eps d)) / 2 eps, theta restored
        with torch.no_grad():
            for n, p in theta.items():
                p.add_(eps * d[n])
            up = loss().item()
            for n, p in theta.items():
                p.add_(-2 * eps * d[n])
            down = loss().item()
            for n, p in theta.items():
                p.add_(eps * d[n])
        return (up - down) / (2 * eps)
    # eps 1e-3: Llama's RMSNorm computes in float32 even for float64 inputs (~1e-7 noise in the loss), so eps cannot
    # shrink; Richardson's extrapolation over eps and eps / 2 removes the O(eps^2) error instead (alone it reached
    # 1.3e-3 at some initialisations of the memory, which the global RNG draws)
    numeric = (4 * central(5e-4) - central(1e-3)) / 3
    assert abs(analytic) > 1e-4, "the direction must matter"
    assert abs(numeric - analytic) < 1e-3 * max(1.0, abs(analytic))


def test_training_leaves_the_backbone_bit_identical_and_moves_theta():
    T, cfg, m, model = fednl_model()
    frozen = {n: p.detach().clone() for n, p in model.named_parameters() if n not in m.shapes}
    state = m.init_state(model)
    down = P.broadcast(m, state, 1)
    ctx = ClientContext(0, 1, 5, cfg, T.loss, {})
    P.client_round(m, model, down, subset(T.train, range(16)), ctx, cfg.max_message_bytes)
    assert all(torch.equal(p, frozen[n]) for n, p in model.named_parameters() if n in frozen)
    assert any(not torch.equal(p, state[n]) for n, p in m.trainable(model).items())


def test_no_message_carries_memory_state():
    """By construction the schemas list theta only; a client whose memory holds a long stream sends
    the same bytes as one whose memory is empty; the state is in no parameter, buffer or state_dict."""
    T, cfg, m, model = fednl_model()
    state = m.init_state(model)
    names = set(m.up_schema()) | set(m.down_schema())
    assert names == set(m.shapes) == set(state)
    down = P.broadcast(m, state, 1)
    data = subset(T.train, range(16))

    def upload():
        return P.client_round(m, model, down, data, ClientContext(0, 1, 9, cfg, T.loss, {}), cfg.max_message_bytes)[0]

    quiet = upload()
    with torch.no_grad():
        for n, p in m.trainable(model).items():
            if n.endswith("alpha"):
                p.fill_(1.0)
    _, nbytes = streaming.stream_nll(model, T.test["input_ids"][:1].repeat(1, 8), window=32)
    assert nbytes > 0
    st = D.Stream()
    with D.stream(model, st):
        model(input_ids=T.test["input_ids"][:1])
    assert st.S and all(t.abs().sum() > 0 for t in st.S.values())
    pointers = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    pointers |= {t.untyped_storage().data_ptr() for t in model.state_dict().values()}
    assert not any(s.untyped_storage().data_ptr() in pointers for s in st.S.values())
    assert not any(tuple(t.shape) == tuple(s.shape[1:]) for t in state.values() for s in st.S.values())
    assert all(b.stream is None for b in D.branches(model)), "the stream is released after use"
    assert upload() == quiet


def test_streaming_keeps_memory_flat_as_the_input_grows():
    """A tiny FedNL model streams 1x and 8x the input: the state held is the same exact bytes, and the
    measured peak RSS rise does not grow with length; the full-KV backbone's cache grows 8x."""
    import ctypes
    try:     # glibc raises its mmap threshold after large frees, then keeps freed tensors in the heap (RSS noise):
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 20)   # M_MMAP_THRESHOLD fixed at 1 MiB: large tensors come and go
    except (OSError, AttributeError):
        pass
    T, cfg, m, model = fednl_model()
    model.eval()
    base = T.test["input_ids"].reshape(1, -1)[:, :256]
    rises, held = [], []
    for reps in (1, 8):
        ids = base.repeat(1, reps)
        streaming.stream_nll(model, ids, 64)                                      # warm-up allocations
        tries = []
        for _ in range(3):     # RSS noise only adds (a freed block the heap kept, a page touched late): least of 3
            with PeakRSS() as mem:
                nll, nbytes = streaming.stream_nll(model, ids, 64)
            assert nll.shape == (ids.shape[1] - 1,) and torch.isfinite(nll).all()
            tries.append(mem.rise)
        rises.append(None if None in tries else min(tries))
        held.append(nbytes)
    assert held[0] == held[1] > 0
    if rises[0] is not None:
        chunk_logits = 64 * model.config.vocab_size * 4      # the allocator may keep one more chunk's logits: a constant
        full_logits = 8 * 256 * model.config.vocab_size * 4  # what a model that kept the whole stream's logits would add
        assert rises[1] <= 1.1 * rises[0] + 8 * 2**20 + chunk_logits < full_logits / 4, rises
    kv = [streaming.kv_nll(T.model, base.repeat(1, r), 64)[1] for r in (1, 8)]
    assert kv[1] == 8 * kv[0]


def test_chunked_stream_equals_one_forward_within_a_window():
    T, cfg, m, model = fednl_model()
    with torch.no_grad():
        for n, p in m.trainable(model).items():
            p.normal_(0, 0.1)
    ids = T.test["input_ids"][:1, :30]
    nll, _ = streaming.stream_nll(model, ids, window=64)
    ref = F.cross_entropy(model(input_ids=ids).logits[0, :-1], ids[0, 1:], reduction="none")
    assert torch.allclose(nll, ref, atol=1e-5)


def test_fednl_refuses_a_model_it_cannot_adapt():
    from lightfed.config import ConfigError
    T = tiny_task("sentiment")
    m = methods.build(tiny_config("sentiment", "fednl"))
    with pytest.raises(ConfigError, match="Llama-style causal LM"):
        m.prepare(copy.deepcopy(T.model))


def test_niah_task_trains_on_its_own_needles_and_scores_per_template_and_length(tmp_path):
    """The niah task end to end in the in-process engine: 7 clients, one template each (domain split);
    the result has the metric per template and per (template, length) cell; training needles are not
    evaluation needles."""
    from lightfed.engine import local
    T = tiny_task("niah")
    assert set(T.domains.tolist()) == set(T.test_domains.tolist()) and len(set(T.domains.tolist())) == 7
    cfg = tiny_config("niah", "fednl", tmp_path, clients=7, fraction=1.0, rounds=1, partition="domain", batch_size=2, local_steps=1)
    s = local.run(cfg, log=lambda *a: None)
    assert set(s["per_domain"]) == set(T.domains.tolist())
    assert all(set(c) == {"256", "384"} for c in s["cells"].values())
    assert abs(s["final"] - sum(sum(c.values()) for c in s["cells"].values()) / 14) < 1e-9
    assert "per_client" not in s and s["bytes"]["up_per_client_round"] > 0    # no client model differs from the global
    setup = json.loads((tmp_path / "setup.json").read_text())
    assert [len(c["examples"]) if isinstance(c["examples"], list) else c["examples"] for c in setup["clients"]] == [2] * 7


def test_the_memory_carries_context_across_chunks():
    """With a trained-looking theta, emptying the memory at every chunk changes the later chunks' NLL and
    not the first chunk's: the long context reaches later chunks only through S."""
    T, cfg, m, model = fednl_model()
    with torch.no_grad():
        for n, p in m.trainable(model).items():
            p.normal_(0, 0.2)
    ids = T.test["input_ids"].reshape(1, -1)[:, :96]
    carried, _ = streaming.stream_nll(model, ids, 32)
    reset, _ = streaming.stream_nll(model, ids, 32, carry=False)
    assert torch.equal(carried[:31], reset[:31]) and not torch.allclose(carried[31:], reset[31:])
    every1, _ = streaming.stream_nll(model, ids, 32, reset_every=1)
    every2, _ = streaming.stream_nll(model, ids, 32, reset_every=2)     # chunks 0-1 carried, chunk 2 starts empty
    assert torch.equal(every1, reset) and torch.equal(every2[:64], carried[:64]) and torch.equal(every2[64:], reset[64:])


def test_grouped_memory_equals_one_state_per_query_head_with_repeated_keys():
    """One memory per KV head read by its query heads = the repeated-KV form (3x less state and work on SmolLM2)."""
    q, k, v, beta, S0 = qkvb(H=2, dtype=torch.float64)
    q6 = torch.cat([q, q.flip(-1), q * 0.5], 1)                        # 6 query heads over 2 KV heads
    o, S = D.chunked(q6, k, v, beta, S0, chunk=16)
    rep = lambda x: x.repeat_interleave(3, 1)                           # noqa: E731
    o_rep, S_rep = D.recurrent(q6.view(2, 2, 3, *q6.shape[2:]).reshape(2, 6, *q6.shape[2:]), rep(k), rep(v), rep(beta), rep(S0))
    assert torch.allclose(o, o_rep, atol=1e-10) and torch.allclose(S, S_rep[:, ::3], atol=1e-10)
    o2, S2 = D.recurrent(q6, k, v, beta, S0)
    assert torch.allclose(o, o2, atol=1e-10) and torch.allclose(S, S2, atol=1e-10)


def _tiny_memory_lm(layers=5, mem=(2, 3), seed=0, dtype=torch.float64):
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, max_position_embeddings=64, tie_word_embeddings=True)
    m = LlamaForCausalLM(cfg).to(dtype)
    m.requires_grad_(False)
    for b in D.attach(m, list(mem), r=4, chunk=8, gate=0.3):
        b.to(dtype)
        torch.nn.init.normal_(b.q.B, std=0.1)
        torch.nn.init.normal_(b.v.B, std=0.1)
    return m


def test_the_fast_stream_caches_frozen_layers_and_stops_early_chunks_at_the_last_memory_layer():
    """Memory in layers 2-3 of 5: the frozen layers 0-1 come from the prefix cache, chunks that predict no target
    stop after layer 3; loss and gradients equal the plain per-chunk forward's (float64: exactly)."""
    m = _tiny_memory_lm()
    ids = torch.randint(0, 120, (3, 40), generator=torch.Generator().manual_seed(1))
    tm = torch.zeros(3, 40, dtype=torch.bool)
    tm[:, 33:] = True                                     # targets in the last chunk only (position 32 predicts 33)
    params = [p for p in m.parameters() if p.requires_grad]

    def plain():
        with D.stream(m, D.Stream(grad=True)):
            h = torch.cat([m.model(input_ids=ids[:, s:s + 8]).last_hidden_state for s in range(0, 40, 8)], 1)
        sel = tm[:, 1:]
        return F.cross_entropy(m.lm_head(h[:, :-1][sel]), ids[:, 1:][sel])

    ref = plain()
    g_ref = torch.autograd.grad(ref, params)
    calls = []
    hook = m.model.layers[4].register_forward_hook(lambda *a: calls.append(1))
    m.prefix_cache = streaming.PrefixCache()
    for _ in range(2):                                     # the second pass reads every chunk from the cache
        got = lm.target_nll(m, ids, tm, window=8)
        g = torch.autograd.grad(got, params)
        assert got.item() == ref.item() and all(torch.equal(a, b) for a, b in zip(g, g_ref))
    hook.remove()
    assert len(calls) == 2                                 # the top layer ran for the target chunk only, once a pass
    assert m.prefix_cache.misses == 15 and m.prefix_cache.hits == 15


def test_a_step_is_the_same_whatever_the_prefix_cache_held_before(one_thread):
    """float32, as runs train: a model whose cache already holds some of the batch's chunks (the in-process engine's
    long-lived model, after other clients) and a fresh one (a Flower actor's) give the same loss and gradients, bit for
    bit, and the same accounted activations (engines' client stats are compared exactly)."""
    from lightfed.optim.first_order import count_saved_activations
    ids = torch.randint(0, 120, (6, 40), generator=torch.Generator().manual_seed(2))
    tm = torch.zeros(6, 40, dtype=torch.bool)
    tm[:, 33:] = True
    out = []
    for warm in (False, True):
        m = _tiny_memory_lm(dtype=torch.float32)
        m.prefix_cache = streaming.PrefixCache()
        if warm:        # earlier traffic: two of the rows seen before, beside other chunks
            m.prefix_cache.get(m, torch.cat([ids[1:3, 8:16], ids[4:5, :8]]), 2)
            m.prefix_cache.get(m, torch.randint(0, 120, (5, 8), generator=torch.Generator().manual_seed(3)), 2)
        ptrs = {p.untyped_storage().data_ptr() for p in m.parameters()}
        loss, act = count_saved_activations(lambda: lm.target_nll(m, ids, tm, window=8), ptrs)
        params = [p for p in m.parameters() if p.requires_grad]
        out.append((loss, torch.autograd.grad(loss, params), act))
    (l0, g0, a0), (l1, g1, a1) = out
    assert l0.item() == l1.item() and all(torch.equal(a, b) for a, b in zip(g0, g1))
    assert a0 == a1 > 0


@pytest.mark.parametrize("forget", [0.0, 0.02])
def test_fednl_learns_cross_chunk_recall_that_the_reset_memory_cannot(one_thread, forget):
    """Learnability, in seconds: a tiny frozen causal LM with FedNL's memory branch; key-value pair tokens written
    in early chunks, the key asked in the last chunk, attention local to each 8-token chunk. Only the memory rules
    train (LoRA q/k/v, beta, gate; and the forgetting gate, which starts by keeping 0.98 a token). The carried memory
    answers; the same model with its memory emptied at every chunk is at chance (1/8)."""
    from transformers import LlamaConfig, LlamaForCausalLM
    NK, NV, C, NCH = 8, 8, 8, 4
    PAIR, Q, A = 2, 2 + NK * NV, 2 + NK * NV + NK
    torch.manual_seed(0)
    m = LlamaForCausalLM(LlamaConfig(vocab_size=A + NV, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                     tie_word_embeddings=True))
    m.requires_grad_(False)
    D.attach(m, [1], r=8, chunk=C, gate=0.1, forget=forget)

    def batch(n, g):
        ids = torch.ones(n, NCH * C, dtype=torch.long)                             # filler
        k, v = torch.randint(0, NK, (n,), generator=g), torch.randint(0, NV, (n,), generator=g)
        at = torch.randint(0, (NCH - 1) * C, (n,), generator=g)                    # anywhere but the last chunk
        ids[torch.arange(n), at] = PAIR + k * NV + v
        ids[:, -1] = Q + k
        return ids, v

    def accuracy(reset):
        ids, v = batch(256, torch.Generator().manual_seed(99))
        with torch.no_grad():
            h = streaming.hidden(m, ids, C, reset=reset)
        return (m.lm_head(h[:, -1])[:, A:].argmax(-1) == v).float().mean().item()

    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-2)
    g = torch.Generator().manual_seed(1)
    for _ in range(350):
        ids, v = batch(32, g)
        loss = F.cross_entropy(m.lm_head(streaming.hidden(m, ids, C)[:, -1])[:, A:], v)   # over the values
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert accuracy(reset=False) >= 0.95
    assert accuracy(reset=True) <= 0.3


def log_alphas(B=2, H=3, T=150, seed=5, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (-0.3 * torch.rand(B, H, T, generator=g, dtype=torch.float64)).to(dtype)


@pytest.mark.parametrize("chunk", [1, 7, 64, 200])
def test_the_forgetting_gate_chunked_equals_recurrent_across_chunks_and_from_a_state(chunk):
    q, k, v, beta, S0 = qkvb()
    g = log_alphas()
    o1, S1 = D.recurrent(q, k, v, beta, S0, g)
    o2, S2 = D.chunked(q, k, v, beta, S0, chunk, g)
    assert (o1 - o2).abs().max() < 1e-5 and (S1 - S2).abs().max() < 1e-5
    oa, Sa = D.chunked(q[:, :, :90], k[:, :, :90], v[:, :, :90], beta[:, :, :90], S0, chunk, g[:, :, :90])
    ob, Sb = D.chunked(q[:, :, 90:], k[:, :, 90:], v[:, :, 90:], beta[:, :, 90:], Sa, chunk, g[:, :, 90:])
    assert (torch.cat([oa, ob], 2) - o1).abs().max() < 1e-5 and (Sb - S1).abs().max() < 1e-5
    # a = 1 everywhere is the plain rule; and the gate does change the result
    o0, S0_ = D.chunked(q, k, v, beta, S0, chunk, torch.zeros_like(g))
    o3, _ = D.chunked(q, k, v, beta, S0, chunk)
    assert (o0 - o3).abs().max() < 1e-6 and (o3 - o2).abs().max() > 1e-2


def test_the_forgetting_gate_scales_an_old_write_by_the_product_of_its_alphas():
    """Write one value with step 1, then n tokens that write nothing (beta = 0): the read-back is prod(a) * value."""
    dk, dv, n = 8, 4, 20
    g0 = torch.Generator().manual_seed(2)
    key = F.normalize(torch.randn(1, 1, 1, dk, generator=g0, dtype=torch.float64), dim=-1)
    val = torch.randn(1, 1, 1, dv, generator=g0, dtype=torch.float64)
    k = torch.cat([key, F.normalize(torch.randn(1, 1, n, dk, generator=g0, dtype=torch.float64), dim=-1)], 2)
    v = torch.cat([val, torch.randn(1, 1, n, dv, generator=g0, dtype=torch.float64)], 2)
    beta = torch.cat([torch.ones(1, 1, 1), torch.zeros(1, 1, n)], 2).double()
    g = torch.log(torch.rand(1, 1, n + 1, generator=g0, dtype=torch.float64) * 0.1 + 0.9)
    for fn in (D.recurrent, lambda *a: D.chunked(*a[:5], 6, a[5])):
        _, S = fn(k, k, v, beta, None, g)
        kept = g[0, 0, 1:].sum().exp()                                   # the first write is not forgotten by its own a
        assert torch.allclose(S[0, 0].T @ key[0, 0, 0], kept * val[0, 0, 0], atol=1e-12)


def test_the_forgetting_gate_gradients_match_finite_differences():
    q, k, v, beta, S0 = qkvb(B=1, H=2, T=11, dk=4, dv=3, dtype=torch.float64)
    g = log_alphas(B=1, H=2, T=11, dtype=torch.float64)
    args = [t.requires_grad_() for t in (q, k, v, beta, S0, g)]
    assert torch.autograd.gradcheck(lambda *a: D.chunked(*a[:5], 4, a[5])[0], args, eps=1e-6, atol=1e-5)


def test_fednl_forget_option_adds_a_trained_gate_that_starts_at_its_rate_and_is_checked():
    from lightfed.config import ConfigError
    T, cfg, m, model = fednl_model(forget=1e-3)
    ids = T.train["input_ids"][:2]
    assert torch.equal(model(input_ids=ids).logits, T.model(input_ids=ids).logits)   # gate alpha 0: still the base
    names = [n for n in m.shapes if ".memory.forget." in n]
    assert names and all(model.get_parameter(n).requires_grad for n in names)
    b = D.branches(model)[0]
    _, _, _, _, g = b.qkv(torch.randn(1, 5, b.attn[0].q_proj.in_features))
    assert torch.allclose(g.exp(), torch.full_like(g, 1 - 1e-3), atol=1e-6)
    _, _, m0, _ = fednl_model()
    assert not any(".forget." in n for n in m0.shapes)                  # forget 0: the plain rule, nothing added
    with pytest.raises(ConfigError, match="forget"):
        methods.build(tiny_config("austen", "fednl", method_options={"forget": 1.0}))


def test_client_rounds_leave_nothing_alive_and_the_measured_step_has_the_plain_gradients():
    """The first batch of a client round is measured (FLOPs, saved activations); what it saved must go with the step.
    Saving the tensors themselves tied FedNL's memory graph into cycles: +39 live tensors per client round on this
    twin, ~1.8 GB per client round on SmolLM2-135M, until the run ran out of memory."""
    import gc
    from lightfed.engine import local
    from lightfed.optim.first_order import count_saved_activations
    cfg = tiny_config("passkey", "fednl", local_steps=1)
    S = local.build(cfg)
    state = S.method.init_state(S.model)
    data = subset(S.task.train, S.shards[0])

    def live():
        gc.collect()
        return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))
    counts = []
    for rnd in range(1, 5):
        down = P.broadcast(S.method, state, rnd, 0, cache={})
        P.client_round(S.method, S.model, down, data, ClientContext(0, rnd, rnd, cfg, S.task.loss, {}), cfg.max_message_bytes)
        counts.append(live())
    assert counts[1:] == counts[:-1], counts
    ps = [p for p in S.model.parameters() if p.requires_grad]
    b = data                                                    # the shard: one batch
    grads = []
    for measured in (True, False):
        for p in ps:
            p.grad = None
        loss = count_saved_activations(lambda: S.task.loss(S.model, b), set())[0] if measured else S.task.loss(S.model, b)
        loss.backward()
        grads.append([p.grad.clone() for p in ps])
    assert all(torch.equal(a, c) for a, c in zip(*grads))
