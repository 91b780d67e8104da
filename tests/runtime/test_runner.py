"""DrafterRunner with CPU tensors shaped like vLLM's, over the stand-in HIP library."""

from __future__ import annotations

import copy

import pytest
import torch

from mono_aot.runtime.runner import DrafterRunner, TPGroup
from mono_aot.spec import abi
from mono_aot.spec.errors import MonoUnsupported
from mono_aot.spec.layouts import resolve_layout
from tests.runtime.vllm_model import draft_model

LAY = resolve_layout("minimax-m3.1-dspark-tp4")


@pytest.fixture(scope="module")
def model():
    return draft_model(LAY)


@pytest.fixture(autouse=True)
def _tp(one_rank_group):
    global TP
    TP = TPGroup(4, 0, one_rank_group)


def _raises(model, match, tp=None):
    with pytest.raises(MonoUnsupported, match=match):
        DrafterRunner(model, LAY, tp=tp or TP)


def test_cu_count(hip_env, model, monkeypatch):
    monkeypatch.setenv("MONO_AOT_STANDIN_CUS", "228")
    _raises(model, "228 CUs: the kernels need all 304 CTAs co-resident")


def test_arch_not_targeted(hip_env, model, monkeypatch):
    monkeypatch.setenv("MONO_AOT_STANDIN_ARCH", "gfx90a:sramecc+:xnack-")
    _raises(model, "is gfx90a.*targets gfx942, gfx950")


def test_tp(hip_env, model):
    _raises(model, "TP 8: the kernels are built for TP 4", tp=TPGroup(8, 0, None))


def test_layer_count(hip_env, model):
    m = copy.copy(model)
    m.layers = model.layers[:4]
    _raises(m, "4 draft layers: the kernels run 5")


@pytest.mark.parametrize(
    "cache",
    [
        torch.zeros(4096, 64, dtype=torch.float16),
        torch.zeros(4096, 128, dtype=torch.bfloat16),
        torch.zeros(4096, 128, dtype=torch.bfloat16)[:, ::2],
    ],
    ids=["dtype", "shape", "strided"],
)
def test_rope_cache(hip_env, model, cache):
    m = copy.copy(model)
    m._rope_cos_sin_cache = cache
    _raises(m, "rope cache")


def test_a_backbone_before_weight_loading_is_refused_naming_the_rope_cache(hip_env, model):
    """vLLM sets the rope cache only after weight loading: the refusal names it."""
    m = copy.copy(model)
    del m._rope_cos_sin_cache
    _raises(m, "no _rope_cos_sin_cache")


def _with_cache(model, layer, kv):
    m = copy.copy(model)
    m.layers = list(model.layers)
    lyr = copy.copy(model.layers[layer])
    lyr.self_attn = copy.copy(lyr.self_attn)
    lyr.self_attn.attn = copy.copy(lyr.self_attn.attn)
    lyr.self_attn.attn.kv_cache = [kv]
    m.layers[layer] = lyr
    return m


@pytest.mark.parametrize(
    ("kv", "match"),
    [
        (torch.zeros(64, 1, 16, 256, dtype=torch.uint8), r"layer 3 \(64, 1, 16, 256\)"),
        (torch.zeros(0, 1, 128, 256, dtype=torch.uint8), r"layer 3 \(0, 1, 128, 256\)"),
        (torch.zeros(64, 1, 128, 256, dtype=torch.bfloat16), "layer 3 torch.bfloat16"),
        (torch.zeros(64, 1, 128, 512, dtype=torch.uint8)[..., ::2], "not contiguous"),
    ],
    ids=["block", "empty", "dtype", "strided"],
)
def test_kv_cache(hip_env, model, kv, match):
    _raises(_with_cache(model, 3, kv), match)


def test_weights_are_checked_by_attribute_path(hip_env, model):
    m = copy.copy(model)
    m.layers = list(model.layers)
    lyr = copy.copy(model.layers[1])
    lyr.mlp = copy.copy(lyr.mlp)
    lyr.mlp.down_proj = copy.copy(lyr.mlp.down_proj)
    lyr.mlp.down_proj.weight_scale = torch.ones(6144, dtype=torch.bfloat16)
    m.layers[1] = lyr
    _raises(m, "layer 1: mlp.down_proj.weight_scale is torch.bfloat16")
    lyr.mlp.down_proj = copy.copy(model.layers[1].mlp.down_proj)
    lyr.mlp.down_proj.weight = torch.zeros(6144, 3072, dtype=torch.float16)
    _raises(m, "layer 1: mlp.down_proj.weight is torch.float16")
    lyr.mlp = copy.copy(model.layers[1].mlp)
    lyr.input_layernorm = None
    _raises(m, "layer 1: the draft model has no input_layernorm.weight")


def test_a_null_pointer_table_slot_is_unsupported(hip_env, model):
    from mono_aot.runtime.runner import kv_cache_of, layer_weights

    r = DrafterRunner.__new__(DrafterRunner)
    r.layout = LAY
    r.layers = [layer_weights(x, LAY, f"layer {i}") for i, x in enumerate(model.layers)]
    r.caches = [kv_cache_of(x) for x in model.layers]
    tab = r._pointer_table()
    for i, (w, kv) in enumerate(zip(r.layers, r.caches, strict=True)):
        assert int(tab[i, abi.T_K_SCALE]) == w["k_scale"].data_ptr() != 0
        assert int(tab[i, abi.T_V_SCALE]) == w["v_scale"].data_ptr() != 0
        assert int(tab[i, abi.T_W_Q]) == model.layers[i].self_attn.q_norm.weight.data_ptr()
        assert int(tab[i, abi.T_CACHE]) == kv.data_ptr() and int(tab[i, abi.T_NBLK]) == 64
    r.layers[2]["v_scale"] = torch.empty(0, dtype=torch.float32)  # data_ptr() == 0
    with pytest.raises(MonoUnsupported, match=r"layer 2: pointer-table slot 5 \(v_scale\)"):
        r._pointer_table()


def _serve(rank, world, group, arg):
    """Build a runner on this rank and run a step of every request count it serves."""
    from mono_aot.runtime.runner import AttentionContext
    from mono_aot.spec.errors import BadInput

    lay = resolve_layout("minimax-m3.1-dspark-tp4")
    model = draft_model(lay)
    runner = DrafterRunner(model, lay, tp=TPGroup(world, rank, group))
    q = lay.serving.qpr
    steps = []
    for reqs in range(1, lay.serving.max_reqs + 1):
        n = reqs * q
        ctx = AttentionContext(
            block_table=torch.zeros(reqs, 8, dtype=torch.int32),
            seq_lens=torch.full((reqs,), 16, dtype=torch.int32),
            slots=None,
        )
        x = torch.zeros(n, lay.model.hidden, dtype=torch.bfloat16)
        runner.forward(torch.zeros(n, dtype=torch.int64), x, ctx)
        steps.append({"reqs": reqs, "x": x.data_ptr(), "chunks": runner.chunks(reqs)})
    guard = []
    for n in (q + 1, (lay.serving.max_reqs + 1) * q):
        try:
            runner.forward(
                torch.zeros(n, dtype=torch.int64),
                torch.zeros(n, lay.model.hidden, dtype=torch.bfloat16),
                AttentionContext(
                    torch.zeros(1, 8, dtype=torch.int32), torch.ones(1, dtype=torch.int32), None
                ),
            )
        except BadInput as e:
            guard.append(str(e))
    try:
        runner._launch("narrow", *[torch.zeros(1)] * 6, 3 * q, 0)
    except BadInput as e:
        guard.append(str(e))
    info = {
        "steps": steps,
        "guard": guard,
        "step": int(runner.step),
        "tab": runner.tab.tolist(),
        "pe": runner.pe,
        "stale": runner.stale(),
        "symbols": {v: f.entry.symbol for v, f in runner.launchers.items()},
    }
    model.layers[0].self_attn.attn.kv_cache = [torch.zeros(64, 1, 16, 256, dtype=torch.uint8)]
    info["stale_after_rebind"] = runner.stale()
    runner.close()
    return info


@pytest.mark.slow
def test_runner_chunks_steps_into_launches_on_4_ranks(stand_in_lib, artifacts, tmp_path):
    """1 to max_reqs (10) requests: each step is ceil(R / 8) launches, chunks of 3..8 requests
    take the wide kernel and 1..2 the narrow one, every launch's n, x, out, bt and positions
    advance by the chunk, and the 28 kernel arguments are those of the user's runner."""

    import struct

    from tests.runtime.conftest import Calls, stand_in_env

    logs = [tmp_path / f"calls-{r}.jsonl" for r in range(4)]
    envs = [
        stand_in_env(stand_in_lib, logs[r], MONO_AOT_PATH=str(artifacts), MONO_AOT_STRICT="1",
                     MONO_AOT_CACHE_DIR=str(tmp_path / "cache"))
        for r in range(4)
    ]  # fmt: skip
    from tests.runtime.ranks import run_ranks

    res = run_ranks(_serve, tmp_path, envs, timeout=600)
    assert all(ok for ok, _ in res), res
    names = [a.name for a in abi.kernel_args(4)]
    offsets = dict((n, (o, s)) for n, o, s in abi.kernarg_layout(4))
    q, hid, c = LAY.serving.qpr, LAY.model.hidden, LAY.serving.chunk_reqs
    for rank, (_, info) in enumerate(res):
        assert info["stale"] is False and info["stale_after_rebind"] is True
        assert info["step"] == LAY.serving.max_reqs == 10
        assert [s["reqs"] for s in info["steps"]] == list(range(1, 11))
        assert len(info["guard"]) == 3
        assert "8 tokens: a step carries whole requests of 7 tokens" in info["guard"][0]
        assert "77 tokens" in info["guard"][1] and "at most 10 requests" in info["guard"][1]
        assert "a narrow launch of 21 tokens: it takes a multiple of 7 up to 14" in info["guard"][2]
        launches = Calls(logs[rank]).of("hipModuleLaunchKernel")
        assert len(launches) == sum(-(-s["reqs"] // c) for s in info["steps"])
        it = iter(launches)
        for s in info["steps"]:
            r0 = 0
            for first, k, variant in s["chunks"]:
                assert first == r0 and variant == ("wide" if k >= 3 else "narrow")
                call = next(it)
                assert call["function"] == info["symbols"][variant]
                raw = bytes.fromhex(call["kernargs"])
                args = {
                    n: struct.unpack_from("<q" if offsets[n][1] == 8 else "<i", raw, offsets[n][0])[
                        0
                    ]
                    for n in names
                }
                assert args["n"] == k * q and args["rank"] == rank and args["bt_stride"] == 8
                assert args["x"] == s["x"] + r0 * q * hid * 2
                assert [args[f"pe{r}"] for r in range(4)] == info["pe"]
                assert args["peer_local"] == info["pe"][rank]
                r0 += k
            assert r0 == s["reqs"]
        assert [len(s["chunks"]) for s in info["steps"]] == [1] * 8 + [2, 2]
        for row in info["tab"]:
            assert all(row[slot] != 0 for slot in (0, 1, 2, 3, 4, 5, 6)) and row[7] == 64


def _build_only(rank, world, group, arg):
    from mono_aot.spec.errors import MonoUnsupported

    lay = resolve_layout("minimax-m3.1-dspark-tp4")
    try:
        DrafterRunner(draft_model(lay), lay, tp=TPGroup(world, rank, group)).close()
    except MonoUnsupported as e:
        return str(e)
    return "built"


@pytest.mark.slow
def test_a_rank_failing_its_own_checks_makes_every_rank_raise_the_same_error(
    stand_in_lib, artifacts, tmp_path
):
    """Rank 2 sees 228 CUs: it fails before the peer exchange, yet no rank waits for it there;
    all four raise one MonoUnsupported naming rank 2 and its reason, and nothing was mapped."""
    from tests.runtime.conftest import Calls, stand_in_env
    from tests.runtime.ranks import run_ranks

    logs = [tmp_path / f"calls-{r}.jsonl" for r in range(4)]
    envs = [
        stand_in_env(stand_in_lib, logs[r], MONO_AOT_PATH=str(artifacts), MONO_AOT_STRICT="1",
                     MONO_AOT_CACHE_DIR=str(tmp_path / "cache"),
                     **({"MONO_AOT_STANDIN_CUS": "228"} if r == 2 else {}))
        for r in range(4)
    ]  # fmt: skip
    res = run_ranks(_build_only, tmp_path, envs, timeout=300)
    assert all(ok for ok, _ in res), res
    said = {msg for _, msg in res}
    assert len(said) == 1, said
    [msg] = said
    assert msg.startswith("drafter runner failed on 1 rank(s): rank 2: 228 CUs"), msg
    for log in logs:
        assert Calls(log).of("hipExtMallocWithFlags") == []


def test_forward_writes_into_a_given_out_buffer_and_checks_it(model):
    """``forward(out=...)``: the launches write into the caller's buffer (a graph-captured or
    poisoned one), whose shape, dtype and layout are checked before any launch."""
    from types import SimpleNamespace as NS

    from mono_aot.runtime.runner import AttentionContext
    from mono_aot.spec.errors import BadInput

    calls = []
    r = DrafterRunner.__new__(DrafterRunner)
    r.layout = LAY
    r.launchers = {v: (lambda *a, stream=None: calls.append(a)) for v in LAY.variants()}
    r.packed = {f"{p}_{k}": torch.zeros(1) for p in ("qkv", "o", "gu", "d") for k in "ws"}
    r.tab = r.final_norm = r.cos_sin = torch.zeros(1)
    r.scratch = {v: torch.zeros(1) for v in LAY.variants()}
    r.peers, r.pe, r.rank = NS(local=1), [1, 2, 3, 4], 0
    r.step, r.health = torch.zeros(1, dtype=torch.int32), torch.zeros(4, dtype=torch.int32)
    r.no_slots = torch.full((LAY.serving.qpr * 16,), -1, dtype=torch.int64)
    q, hid = LAY.serving.qpr, LAY.model.hidden
    n = 10 * q  # wide 8 + narrow 2
    ctx = AttentionContext(
        torch.zeros(10, 4, dtype=torch.int32), torch.ones(10, dtype=torch.int32), None
    )
    x = torch.zeros(n, hid, dtype=torch.bfloat16)
    out = torch.full((n, hid), float("nan"), dtype=torch.bfloat16)
    got = r.forward(torch.zeros(n, dtype=torch.int64), x, ctx, out=out)
    assert got is out and len(calls) == 2
    assert [c[1] for c in calls] == [out.data_ptr(), out[8 * q :].data_ptr()]  # out of each launch
    for bad in (out[:-q], out.float(), torch.empty(hid, n, dtype=torch.bfloat16).t()):
        with pytest.raises(BadInput, match="out "):
            r.forward(torch.zeros(n, dtype=torch.int64), x, ctx, out=bad)
    assert len(calls) == 2 and int(r.step) == 1


def test_mxfp8_weights_are_bound_unchanged_and_what_the_kernels_misread_is_refused():
    from mono_aot.runtime.runner import MX_MAX_SCALE_BYTE, layer_weights

    tiny = resolve_layout("emulator-tiny-tp4")  # mxfp8, 32-input blocks
    layer = draft_model(tiny).layers[0]
    down = layer.mlp.down_proj
    got = layer_weights(layer, tiny, "layer 0")
    # vLLM's own storage, no copy: the kernels read e4m3fn codes and E8M0 bytes as they are
    assert got["d_w"].data_ptr() == down.weight.data_ptr()
    assert got["d_s"].data_ptr() == down.weight_scale.data_ptr()
    assert got["d_s"].dtype == torch.uint8 and tuple(got["d_s"].shape) == (2048, 32)

    def refused(match, **tensors):
        lyr = copy.copy(layer)
        lyr.mlp = copy.copy(layer.mlp)
        lyr.mlp.down_proj = type(down)(**{**vars(down), **tensors})
        with pytest.raises(MonoUnsupported, match=match):
            layer_weights(lyr, tiny, "layer 0")

    refused(
        r"layer 0: mlp\.down_proj\.weight_scale is torch\.float32 \(2048,\); the kernels read "
        r"one E8M0 byte per 32 inputs \(2048, 32\)",
        weight_scale=torch.ones(2048, dtype=torch.float32),
    )
    for nan in (0x7F, 0xFF):  # on gfx942 either would read as a finite e4m3fnuz value
        codes = torch.zeros(2048, 1024, dtype=torch.uint8)
        codes[5, 17] = nan
        refused(
            rf"layer 0: mlp\.down_proj\.weight has a NaN code \(0x{nan:02x}\) at \[5, 17\]",
            weight=codes.view(torch.float8_e4m3fn),
        )
    big = torch.full((2048, 32), 127, dtype=torch.uint8)
    big[3, 9] = MX_MAX_SCALE_BYTE + 1
    refused(r"weight_scale has byte 247 at \[3, 9\]; the kernels serve E8M0 bytes up to 246",
            weight_scale=big)  # fmt: skip
    big[3, 9] = MX_MAX_SCALE_BYTE  # the largest served
    lyr = copy.copy(layer)
    lyr.mlp = copy.copy(layer.mlp)
    lyr.mlp.down_proj = type(down)(weight=down.weight, weight_scale=big)
    assert layer_weights(lyr, tiny, "layer 0")["d_s"][3, 9] == MX_MAX_SCALE_BYTE
